/* engine/kv_backend.c: being written (issue 3). */
typedef int mkv_placeholder_kv_backend_t;
