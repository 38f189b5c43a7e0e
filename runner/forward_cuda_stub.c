/*
 * forward_cuda_stub.c — runner/forward_cuda.h and runner/sampling_cuda.h in a build without
 * CUDA: every call that would need the GPU says so (UNSUPPORTED), so the commands refuse
 * --backend cuda cleanly.
 */
#include "runner/forward_cuda.h"

#include "runner/error.h"
#include "runner/sampling_cuda.h"

#include <stdio.h>
#include <string.h>

int mkv_cuda_forward_available(void) { return 0; }

void mkv_cuda_device_name(char *buf, int n) { snprintf(buf, (size_t)n, "none"); }

static mkv_status_t no_cuda(char *err)
{
    return runner_fail(err, MKV_STATUS_UNSUPPORTED, "this build has no CUDA (configured with MIXKV_CUDA=OFF)");
}

mkv_status_t mkv_cuda_forward_create(const mkv_model_t *m, int32_t max_tokens, mkv_dtype_t dtype,
                                     mkv_cuda_forward_t **out, char *err)
{
    (void)m, (void)max_tokens, (void)dtype;
    if (out) *out = NULL;
    return no_cuda(err);
}

mkv_status_t mkv_cuda_forward_create_dummy(const mkv_model_config_t *c, uint64_t seed, int32_t max_tokens,
                                           mkv_dtype_t dtype, mkv_cuda_forward_t **out, char *err)
{
    (void)c, (void)seed, (void)max_tokens, (void)dtype;
    if (out) *out = NULL;
    return no_cuda(err);
}

void mkv_cuda_forward_free(mkv_cuda_forward_t *f) { (void)f; }

mkv_forward_t mkv_cuda_forward(mkv_cuda_forward_t *f)
{
    (void)f;
    mkv_forward_t none;
    memset(&none, 0, sizeof none);
    return none;
}

int64_t mkv_cuda_forward_weight_bytes(const mkv_cuda_forward_t *f)
{
    (void)f;
    return 0;
}

mkv_status_t mkv_cuda_forward_set_timing(mkv_cuda_forward_t *f, int on)
{
    (void)f, (void)on;
    return mkv_report_error(MKV_STATUS_UNSUPPORTED, "this build has no CUDA");
}

void mkv_cuda_forward_phases(mkv_cuda_forward_t *f, double ms[MKV_CUDA_PHASES], int reset)
{
    (void)f, (void)reset;
    for (int i = 0; i < MKV_CUDA_PHASES; i++) ms[i] = 0.0;
}

mkv_status_t mkv_cuda_sample(float *logits, int32_t n, int32_t vocab, const mkv_sample_row_t *rows, int32_t *next,
                             void *stream, char *err)
{
    (void)logits, (void)n, (void)vocab, (void)rows, (void)next, (void)stream;
    return no_cuda(err);
}

mkv_status_t mkv_cuda_forward_create_ex(const mkv_model_t *m, const mkv_cuda_shard_t *shard, int32_t max_tokens,
                                        mkv_dtype_t dtype, mkv_cuda_forward_t **out, char *err)
{
    (void)shard;
    return mkv_cuda_forward_create(m, max_tokens, dtype, out, err);
}

mkv_status_t mkv_cuda_forward_create_dummy_ex(const mkv_model_config_t *c, uint64_t seed,
                                              const mkv_cuda_shard_t *shard, int32_t max_tokens,
                                              mkv_dtype_t dtype, mkv_cuda_forward_t **out, char *err)
{
    (void)shard;
    return mkv_cuda_forward_create_dummy(c, seed, max_tokens, dtype, out, err);
}

const mkv_model_config_t *mkv_cuda_forward_config(const mkv_cuda_forward_t *f)
{
    (void)f;
    return NULL;
}

mkv_status_t mkv_cuda_forward_set_graphs(mkv_cuda_forward_t *f, int on, int32_t horizon)
{
    (void)f, (void)on, (void)horizon;
    return mkv_report_error(MKV_STATUS_UNSUPPORTED, "this build has no CUDA");
}

void mkv_cuda_forward_graph_stats(const mkv_cuda_forward_t *f, int64_t *captures, int64_t *updates,
                                  int64_t *launches)
{
    (void)f;
    *captures = *updates = *launches = 0;
}
