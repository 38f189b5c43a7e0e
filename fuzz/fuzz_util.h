/*
 * fuzz_util.h — what the libFuzzer targets under fuzz/ share (docs/fuzzing.md): one private
 * temp folder per process (mkdtemp once, removed at exit) whose files each input rewrites, and
 * the tiny model whose config.json and model.safetensors are the fixed halves of the
 * safetensors and config targets.
 *
 * The loaders under test read folders, so a target writes the input bytes as one file of the
 * folder and the fixed counterparts beside it, then calls the loader on the folder.
 */
#ifndef MKV_FUZZ_UTIL_H
#define MKV_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* The process's temp folder ("/tmp/mkv_fuzz_XXXXXX"); created on the first call. */
const char *fuzz_dir(void);

/* dir/name into out (aborts when it does not fit: a harness bug). */
void fuzz_path(char *out, size_t len, const char *name);

/* Writes data[n] to dir/name, replacing it; returns the path (static storage, valid until the
 * next call). Aborts on an I/O error: the harness must never report a disk problem as a bug. */
const char *fuzz_write(const char *name, const void *data, size_t n);

/* 1 when MKV_FUZZ_VERBOSE is set: targets then print each input's status and message, which
 * helps when reproducing one input by hand. */
int fuzz_verbose(void);

/* One structure-aware mutation of the JSON document in[0..n) (libFuzzer's byte mutations
 * rarely keep JSON parseable): a number set to a boundary value or nudged by one, an array
 * element duplicated or removed, or a string replaced by one of strings[n_strings]. Returns
 * the new text (malloc'ed, NUL-terminated), or NULL when in is not JSON. */
char *fuzz_mutate_json(const char *in, size_t n, unsigned int seed, const char *const *strings,
                       int n_strings);

/* The tiny model: 1 layer, hidden 8, 2 query heads over 1 KV head (head_dim 4), intermediate
 * 8, vocab 16, untied, with F32, F16 and BF16 tensors (fuzz/make_seeds.py writes the same
 * model into the seed corpora; keep the two in step). */
extern const char fuzz_tiny_config[];

/* The tiny model's model.safetensors, malloc'ed (*out, *len); built once per call. */
void fuzz_tiny_safetensors(uint8_t **out, size_t *len);

#endif /* MKV_FUZZ_UTIL_H */
