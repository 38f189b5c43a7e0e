/* attention/decode_ref.c: being written (issue 3). */
typedef int mkv_placeholder_decode_ref_t;
