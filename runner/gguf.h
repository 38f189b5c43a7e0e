/*
 * gguf.h — a reader of GGUF files (llama.cpp's model format, versions 2 and 3) over a read-only
 * mmap, and the dequantization of its tensor types to fp32 (docs/model.md).
 *
 * The file is untrusted: every count, length, offset, type id and shape is checked before use,
 * so a truncated or hostile file is refused with a message naming the field or the tensor
 * (PARSE_ERROR; UNSUPPORTED for a valid file this reader cannot serve: version 1, a big-endian
 * file, a nested array, a tensor type without a dequantizer is *not* refused here, only by the
 * users that need its data). Once mkv_gguf_open succeeds, every pointer and size the accessors
 * return is within the mapping, and the mapping lives until mkv_gguf_close.
 *
 * Layout (little-endian): "GGUF", u32 version, u64 n_tensors, u64 n_kv; n_kv key/value pairs
 * (string key, u32 type, value); n_tensors tensor infos (string name, u32 n_dims, u64 ne[n_dims]
 * with ne0 the fastest-varying dimension, u32 ggml type, u64 offset); padding up to
 * general.alignment (default 32); the data section, where each tensor lies at its offset.
 * A string is a u64 length and that many bytes (no terminator); an array is a u32 element type,
 * a u64 count and the elements.
 */
#ifndef MKV_ENGINE_GGUF_H
#define MKV_ENGINE_GGUF_H

#include "mixkv.h"

#include <stdint.h>

/* Metadata value types, as the file numbers them. */
typedef enum mkv_gguf_type {
    MKV_GGUF_U8 = 0,
    MKV_GGUF_I8 = 1,
    MKV_GGUF_U16 = 2,
    MKV_GGUF_I16 = 3,
    MKV_GGUF_U32 = 4,
    MKV_GGUF_I32 = 5,
    MKV_GGUF_F32 = 6,
    MKV_GGUF_BOOL = 7,
    MKV_GGUF_STRING = 8,
    MKV_GGUF_ARRAY = 9,
    MKV_GGUF_U64 = 10,
    MKV_GGUF_I64 = 11,
    MKV_GGUF_F64 = 12,
    MKV_GGUF_TYPE_COUNT
} mkv_gguf_type_t;

/* ggml tensor types that mixkv knows by name (the file may use others: see mkv_ggml_*). */
typedef enum mkv_ggml_type {
    MKV_GGML_F32 = 0,
    MKV_GGML_F16 = 1,
    MKV_GGML_Q4_0 = 2,
    MKV_GGML_Q4_1 = 3,
    MKV_GGML_Q8_0 = 8,
    MKV_GGML_Q4_K = 12,
    MKV_GGML_Q6_K = 14,
    MKV_GGML_BF16 = 30,
} mkv_ggml_type_t;

#define MKV_GGUF_MAX_DIMS 4
#define MKV_GGUF_MAX_NAME 64        /* tensor names, as ggml's GGML_MAX_NAME */
#define MKV_GGUF_DEFAULT_ALIGNMENT 32

/* A string inside the mapping: ptr[len], not NUL-terminated, may contain any byte. */
typedef struct mkv_gguf_str {
    const char *ptr;
    uint64_t len;
} mkv_gguf_str_t;

/* One metadata pair. Scalars are widened into `num` (integers into u64 / i64 by their
 * signedness, BOOL into u64 as 0 or 1, floats into f64). */
typedef struct mkv_gguf_kv {
    const char *key;          /* NUL-terminated copy (keys with a NUL byte are refused) */
    mkv_gguf_type_t type;
    union {
        uint64_t u64;         /* U8, U16, U32, U64, BOOL */
        int64_t i64;          /* I8, I16, I32, I64 */
        double f64;           /* F32, F64 */
    } num;
    mkv_gguf_str_t str;       /* STRING */
    mkv_gguf_type_t arr_type; /* ARRAY: element type (never ARRAY) */
    uint64_t arr_count;       /* ARRAY: elements */
    const uint8_t *arr_data;  /* ARRAY of a fixed-size type: [arr_count] packed elements */
    uint64_t *arr_str_off;    /* ARRAY of STRING: [arr_count] offset of each string's length
                                 field from the start of the mapping (owned) */
} mkv_gguf_kv_t;

/* One tensor info, checked: ne0 * ... fits int64, ne0 is a whole number of blocks, the data
 * lies within the file at an aligned offset and overlaps no other tensor. */
typedef struct mkv_gguf_tensor {
    char name[MKV_GGUF_MAX_NAME + 1];
    uint32_t type;            /* ggml type id (known size: see mkv_ggml_block) */
    int32_t n_dims;           /* 1..4 */
    int64_t ne[MKV_GGUF_MAX_DIMS]; /* ne[0] fastest; unused dimensions are 1 */
    int64_t n_elements;
    uint64_t offset;          /* from the start of the data section */
    uint64_t nbytes;
    const void *data;         /* into the mapping */
} mkv_gguf_tensor_t;

typedef struct mkv_gguf mkv_gguf_t;

/* Opens and checks a GGUF file. path must be a regular file (a FIFO, a device or a folder is
 * refused with IO_ERROR, without blocking). err: MKV_ERR_LEN bytes or NULL. */
mkv_status_t mkv_gguf_open(const char *path, mkv_gguf_t **out, char *err);
void mkv_gguf_close(mkv_gguf_t *g);

uint32_t mkv_gguf_version(const mkv_gguf_t *g);
uint64_t mkv_gguf_alignment(const mkv_gguf_t *g);
int64_t mkv_gguf_n_kv(const mkv_gguf_t *g);
int64_t mkv_gguf_n_tensors(const mkv_gguf_t *g);
const mkv_gguf_kv_t *mkv_gguf_kv_at(const mkv_gguf_t *g, int64_t i);       /* in file order */
const mkv_gguf_tensor_t *mkv_gguf_tensor_at(const mkv_gguf_t *g, int64_t i); /* in file order */

/* Lookups by exact name; NULL when absent. */
const mkv_gguf_kv_t *mkv_gguf_find(const mkv_gguf_t *g, const char *key);
const mkv_gguf_tensor_t *mkv_gguf_find_tensor(const mkv_gguf_t *g, const char *name);

/* Typed getters. PARSE_ERROR naming the key when it is absent or of a type that does not
 * convert: integers of any width and signedness convert when the value fits (u32, i32);
 * f32 takes F32 or F64; bool takes BOOL only; string takes STRING only (pointer + length into
 * the mapping). */
mkv_status_t mkv_gguf_get_u32(const mkv_gguf_t *g, const char *key, uint32_t *out, char *err);
mkv_status_t mkv_gguf_get_i32(const mkv_gguf_t *g, const char *key, int32_t *out, char *err);
mkv_status_t mkv_gguf_get_f32(const mkv_gguf_t *g, const char *key, float *out, char *err);
mkv_status_t mkv_gguf_get_bool(const mkv_gguf_t *g, const char *key, int *out, char *err);
mkv_status_t mkv_gguf_get_str(const mkv_gguf_t *g, const char *key, mkv_gguf_str_t *out,
                              char *err);
/* An ARRAY: its element type and count (PARSE_ERROR when absent or not an array). */
mkv_status_t mkv_gguf_get_arr(const mkv_gguf_t *g, const char *key, mkv_gguf_type_t *elem,
                              uint64_t *count, char *err);

/* Elements of an ARRAY kv (i < kv->arr_count, the caller's precondition, checked: an index
 * out of range or an element of the wrong type returns 0 / an empty string). */
mkv_gguf_str_t mkv_gguf_arr_str(const mkv_gguf_t *g, const mkv_gguf_kv_t *kv, uint64_t i);
/* Integer and BOOL elements as int64 (a U64 above INT64_MAX saturates); 1 on success. */
int mkv_gguf_arr_int(const mkv_gguf_kv_t *kv, uint64_t i, int64_t *out);
/* F32 and F64 elements as double; 1 on success. */
int mkv_gguf_arr_float(const mkv_gguf_kv_t *kv, uint64_t i, double *out);

/* ggml type table: the block of `type` holds *block_elems weights in *block_bytes bytes;
 * returns 0 for a type id unknown to this reader. */
int mkv_ggml_block(uint32_t type, int64_t *block_elems, int64_t *block_bytes);
const char *mkv_ggml_type_name(uint32_t type); /* "Q4_K", ...; "?" when unknown */
/* Whether mkv_ggml_dequantize handles the type. */
int mkv_ggml_can_dequantize(uint32_t type);

/* Dequantizers, one per type: n weights (a multiple of the type's block size) from `src`
 * (n / block_elems blocks, any alignment) into dst[n]. */
void mkv_dequant_f32(const void *src, float *dst, int64_t n);
void mkv_dequant_f16(const void *src, float *dst, int64_t n);
void mkv_dequant_bf16(const void *src, float *dst, int64_t n);
void mkv_dequant_q8_0(const void *src, float *dst, int64_t n);
void mkv_dequant_q4_0(const void *src, float *dst, int64_t n);
void mkv_dequant_q4_1(const void *src, float *dst, int64_t n);
void mkv_dequant_q4_k(const void *src, float *dst, int64_t n);
void mkv_dequant_q6_k(const void *src, float *dst, int64_t n);

/* Dispatches on type; UNSUPPORTED (message naming the type) when there is no dequantizer or
 * n is not a whole number of blocks. */
mkv_status_t mkv_ggml_dequantize(uint32_t type, const void *src, float *dst, int64_t n,
                                 char *err);

#endif /* MKV_ENGINE_GGUF_H */
