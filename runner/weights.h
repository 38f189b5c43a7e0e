/*
 * weights.h — the model's projection weights prepared for the forward pass's matrix products
 * (docs/model.md, "Speed"): each [out][in] matrix repacked as [ceil(out/16)][in][16] panels,
 * sixteen outputs side by side, stored as bf16 when every element is exactly a bf16 value (a
 * bf16 checkpoint loaded into fp32: lossless, half the bytes a decode step streams) and fp32
 * otherwise; a GGUF matrix of type Q4_0, Q4_1 or Q8_0 keeps its quantized codes instead (the
 * quantized panels below: 16 to 28% of fp32's bytes). Created from an mkv_model_t by the
 * forward workspace; the model is not changed.
 *
 * One operation order for every path: each output y[t][o] is the sequential fp32 sum over
 * k = 0 .. in-1 of round(x[t][k] * w[o][k]) (a multiply, then an add; no fused multiply-add),
 * whatever the token count, the tiling, the thread split or the instruction set. So a prefill
 * and a decode of the same token give the same bits (the recompute of docs/model.md), and the
 * thread count never changes a result. A quantized panel rebuilds each w[o][k] as the GGUF
 * dequantizer does (runner/gguf_dequant.c: an fp32 multiply, then an add for Q4_1's min), so
 * its products are those of the fp32 panel of the dequantized matrix, bit for bit.
 */
#ifndef MKV_ENGINE_WEIGHTS_H
#define MKV_ENGINE_WEIGHTS_H

#include "runner/model.h"
#include "runner/parallel.h"

#include <stdint.h>

#define MKV_PANEL 16 /* outputs per panel */
#define MKV_QBLOCK 32 /* weights per quantized block (k), as ggml's Q4_0 / Q4_1 / Q8_0 */

/* Panel storage. The quantized formats hold, per panel, in / 32 groups (one ggml block of
 * each of the 16 rows), each group MKV_WFMT_GROUP_BYTES bytes, 64-byte multiples:
 *   float d[16];              the rows' scales (fp16 in the file, converted exactly)
 *   float m[16];              Q4_1 only: the rows' mins
 *   Q4_0, Q4_1: uint32 q[4][16]: bits 4n .. 4n+3 of word [s][j] = code of row j at
 *               k = 8s + n (k within the block); w = (code - 8) d (Q4_0), code d + m (Q4_1)
 *   Q8_0:       uint32 q[8][16]: byte n of word [s][j] = code (int8) of row j at k = 4s + n;
 *               w = code d
 * so one 64-byte load gives 16 rows at 8 (4) consecutive k through 32-bit lane shifts.
 * Missing rows of the last panel have d = m = 0 and code 0. */
typedef enum mkv_wfmt {
    MKV_WFMT_F32 = 0,  /* data: float [panels][in][16] */
    MKV_WFMT_BF16 = 1, /* data: uint16 [panels][in/2 rounded up][16][2] */
    MKV_WFMT_Q4_0 = 2, /* data: [panels][in/32] groups, as above */
    MKV_WFMT_Q4_1 = 3,
    MKV_WFMT_Q8_0 = 4,
} mkv_wfmt_t;

#define MKV_WFMT_GROUP_BYTES(fmt)                                                              \
    ((fmt) == MKV_WFMT_Q4_0 ? 64 + 256 : (fmt) == MKV_WFMT_Q4_1 ? 128 + 256                    \
                                       : (fmt) == MKV_WFMT_Q8_0 ? 64 + 512 : 0)

typedef struct mkv_wmat {
    int32_t out, in; /* the matrix is [out][in] */
    int32_t panels;  /* ceil(out / 16); the last panel's missing outputs are zero */
    int32_t fmt;     /* mkv_wfmt_t */
    void *data;      /* [panels] panels of panel_bytes each, in the format's layout */
    int64_t panel_bytes;
} mkv_wmat_t;

enum { MKV_W_Q, MKV_W_K, MKV_W_V, MKV_W_O, MKV_W_GATE, MKV_W_UP, MKV_W_DOWN, MKV_W_PER_LAYER };

typedef struct mkv_weights {
    int32_t n_layers;
    mkv_wmat_t *mats;   /* [n_layers][MKV_W_PER_LAYER] */
    mkv_wmat_t lm_head; /* [vocab][hidden] */
    int64_t bytes;      /* packed bytes, all matrices */
} mkv_weights_t;

/* Packs every projection and the lm_head (in parallel on pool, which may be NULL).
 * OUT_OF_MEMORY with a message in err. */
mkv_status_t mkv_weights_prepare(const mkv_model_t *m, mkv_pool_t *pool, mkv_weights_t **out,
                                 char *err);
void mkv_weights_free(mkv_weights_t *w);

/* Packs one [out][in] fp32 matrix; bf16 storage when lossless (or when allow_lossy). */
mkv_status_t mkv_wmat_pack(const float *w, int32_t out, int32_t in, int allow_lossy,
                           mkv_wmat_t *dst);
/* Whether ggml type `type` (runner/gguf.h) packs as quantized panels (Q4_0, Q4_1, Q8_0). */
int mkv_wmat_quant_supported(uint32_t type);
/* Packs one [out][in] matrix from its ggml blocks (rows of in / 32 blocks, any alignment):
 * UNSUPPORTED when the type does not pack quantized or `in` is not a multiple of 32. */
mkv_status_t mkv_wmat_pack_quant(uint32_t type, const void *blocks, int32_t out, int32_t in,
                                 mkv_wmat_t *dst);
void mkv_wmat_free(mkv_wmat_t *w);

/* y_i[t][o] = sum_k x[t][k] w_i[o][k], t < n, for up to 3 matrices sharing the input x
 * ([n][ldx]); y_i is [n][ldy_i]. The panels of all matrices are split across the pool. */
typedef struct mkv_matmul {
    int32_t count;              /* 1 to 3 */
    const mkv_wmat_t *w[3];
    float *y[3];
    int64_t ldy[3];
} mkv_matmul_t;
void mkv_matmul_run(mkv_pool_t *pool, const mkv_matmul_t *mm, const float *x, int64_t ldx,
                    int32_t n);

/* The kernels' instruction set: "avx512f" or "generic" (same results either way). */
const char *mkv_weights_isa(void);

#endif /* MKV_ENGINE_WEIGHTS_H */
