/* attention/prefill_ref.c: being written (issue 3). */
typedef int mkv_placeholder_prefill_ref_t;
