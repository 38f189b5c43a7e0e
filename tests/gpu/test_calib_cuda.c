/*
 * test_calib_cuda.c — calibration on the CUDA runner (calib/calib.h, opts.backend): the same
 * points measured on the same windows through the CPU pass and through the CUDA pass in f32
 * give the same figures within the two passes' rounding (the FP16 reference's perplexity
 * within 0.5%, each point's perplexity change, memory ratio and greedy agreement within a
 * few tenths of a point). The windows are seeded random tokens: the GPU machine has the model
 * but not the data, and what is compared is the runner, not the text.
 */
#include "gpu_util.h"

#include "calib/calib.h"
#include "runner/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifndef MIXKV_SHARED_DIR
#define MIXKV_SHARED_DIR "../shared"
#endif

enum { WINDOW = 255, WINDOWS = 6, POINTS = 3 };

static void measure(const mkv_model_t *m, const mkv_ppl_doc_t *doc, mkv_backend_t backend,
                    mkv_calib_point_t *pts, mkv_calib_quality_t *ref)
{
    mkv_calib_opts_t o = MKV_CALIB_OPTS_INIT;
    o.window = WINDOW;
    o.prompt_len = 64;
    o.calib_windows = 4;
    o.valid_windows = 2;
    o.workers = 1;
    o.backend = backend;
    o.dtype = MKV_DTYPE_F32;
    const float alpha_h[POINTS] = {0.0f, 4.0f, 6.0f}, alpha_l[POINTS] = {0.0f, 0.0f, 2.0f};
    for (int i = 0; i < POINTS; i++) {
        memset(&pts[i], 0, sizeof pts[i]);
        mkv_policy_default(&pts[i].policy);
        pts[i].policy.alpha_h = alpha_h[i];
        pts[i].policy.alpha_l = alpha_l[i];
    }
    mkv_calib_t *c = NULL;
    cr_assert_eq(mkv_calib_create(m, doc, 1, &o, &c), MKV_STATUS_OK, "%s", mkv_last_error());
    int stopped = 0;
    cr_assert_eq(mkv_calib_measure(c, pts, POINTS, &stopped), MKV_STATUS_OK, "%s", mkv_last_error());
    cr_assert_eq(stopped, 0);
    mkv_calib_reference(c, ref);
    mkv_calib_free(c);
}

Test(calib_cuda, cuda_runner_matches_the_cpu)
{
    GPU_REQUIRE();
    mkv_model_t *m = test_load_tinystories(MIXKV_SHARED_DIR);
    const int64_t n = (int64_t)WINDOWS * WINDOW;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    uint64_t rng = 20261126;
    for (int64_t i = 0; i < n; i++) ids[i] = test_rand_range(&rng, 3, m->cfg.vocab - 1);
    const mkv_ppl_doc_t doc = {ids, n};
    mkv_calib_point_t cpu[POINTS], gpu[POINTS];
    mkv_calib_quality_t rc, rg;
    measure(m, &doc, MKV_BACKEND_CPU, cpu, &rc);
    measure(m, &doc, MKV_BACKEND_CUDA, gpu, &rg);
    cr_log_info("calib_cuda: FP16 perplexity %.4f (CPU) %.4f (CUDA)", rc.ppl, rg.ppl);
    cr_assert_lt(fabs(rg.ppl / rc.ppl - 1.0), 0.005, "FP16 perplexity %.4f on the CPU, %.4f on CUDA", rc.ppl,
                 rg.ppl);
    for (int i = 0; i < POINTS; i++) {
        const mkv_calib_quality_t *a = &cpu[i].q, *b = &gpu[i].q;
        cr_assert(cpu[i].done && gpu[i].done);
        cr_log_info("calib_cuda: point %d: memory %.4f / %.4f, perplexity %+.3f%% / %+.3f%%, agreement %.2f%% / "
                    "%.2f%% (CPU / CUDA)", i, a->memory_ratio, b->memory_ratio, 100 * a->ppl_increase,
                    100 * b->ppl_increase, 100 * a->agreement, 100 * b->agreement);
        cr_assert_lt(fabs(a->memory_ratio - b->memory_ratio), 0.01, "point %d: memory ratio", i);
        cr_assert_lt(fabs(a->ppl_increase - b->ppl_increase), 0.003, "point %d: perplexity change", i);
        cr_assert_lt(fabs(a->agreement - b->agreement), 0.02, "point %d: greedy agreement", i);
        cr_assert_eq(a->predictions, b->predictions);
    }
    free(ids);
    mkv_model_free(m);
}
