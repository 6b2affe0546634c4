/*
 * bench_frag.c -- what lifetime-aware placement does to peak reserved
 * memory, on the host backend (no GPU): an allocation trace modelled on
 * benchmarks/frag.py's model -- a stack of pre-norm attention + MLP blocks,
 * bf16, forward and backward on shapes whose token count rises and falls
 * (batch x seq, seq drawn from the same lengths) -- with an AdamW optimizer,
 * whose state appears after the first backward, and gradients made during
 * backward and dropped by zero_grad(set_to_none=True).
 *
 * Tags: weights and optimizer state are long-lived; activations and
 * backward temporaries short-lived; gradients short (as under PyTorch, where
 * the backward's kernels make them as temporaries) or long (if the caller
 * could say so at allocation time): both are reported.  Each configuration
 * is run with GPUPOOL_CACHE_SLACK at its default (5%: cached chunks beyond
 * it are given back before growing) and at none (every cached chunk kept,
 * which shows the fragmentation itself).  Printed per run: peak reserved,
 * peak allocated, their ratio, and the backend calls (maps, unmaps, device
 * syncs) that keeping reserved low cost.  The device is 80 GiB, as an H100.
 *
 * Build and run (from the repository root):
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Icsrc -Icsrc/backend -Icsrc/backend/cuda -Icsrc/offload -Icsrc/offload/codec -Icsrc/pool -Icsrc/python -Icsrc/tenant \
 *      benchmarks/bench_frag.c \
 *      csrc/pool/pool.c csrc/pool/pool_offload.c csrc/pool/stream.c csrc/pool/stats.c csrc/pool/check.c csrc/pool/tag.c \
 *      csrc/error.c csrc/config.c csrc/backend/backend_host.c csrc/backend/host_pages.c csrc/backend/host_queue.c csrc/pool/trace.c csrc/pool/transit.c csrc/offload/checksum.c \
 *      -lpthread -o /tmp/bench_frag && /tmp/bench_frag
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_host.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)

enum { HIDDEN = 1024, HEAD_DIM = 64, LAYERS = 4, ITERS = 240, HOLD = 3, MIN_TOK = 1024, MAX_TOK = 32768 };
enum { BF16 = 2, FP32 = 4 };
static const int seq_lens[] = {128, 192, 256, 384, 512, 768, 1024, 1536, 2048};

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}

typedef struct run {
    gp_pool *p;
    gp_tag weights, optimizer, grads, acts;
} run;

static void *get(run *r, uint64_t bytes, gp_tag tag)
{
    void *x = gp_alloc(r->p, bytes, NULL, tag, GP_PRIO_NORMAL, NULL);
    if (!x) {
        fprintf(stderr, "bench_frag: %s\n", gp_last_error());
        exit(1);
    }
    return x;
}

/* The parameters of one block: qkv, out, mlp up, mlp down (weight, bias),
 * two layer norms (weight, bias). */
enum { NPARAM = 12 };
static uint64_t param_bytes(int i)
{
    static const uint64_t h = HIDDEN;
    const uint64_t n[NPARAM] = {3 * h * h, 3 * h, h * h, h, 4 * h * h, 4 * h, 4 * h * h, h, h, h, h, h};
    return n[i] * BF16;
}

/* One forward + backward + optimizer step on batch b of length s. */
static void step(run *r, void **opt_state, int first, int b, int s)
{
    const uint64_t t = (uint64_t)b * s, h = HIDDEN, heads = HIDDEN / HEAD_DIM;
    /* What each block saves for backward, in the order forward makes it. */
    const uint64_t saved[] = {t * h * BF16, t * 3 * h * BF16, b * heads * s * s * BF16, t * h * BF16,
                              t * h * BF16, t * h * BF16, t * 4 * h * BF16, t * 4 * h * BF16, t * h * BF16};
    enum { NS = sizeof saved / sizeof saved[0] };
    void *act[LAYERS][NS];
    void *x = get(r, t * h * BF16, r->acts); /* the input */
    for (int l = 0; l < LAYERS; l++) {
        for (int i = 0; i < NS; i++) {
            if (i == 2) { /* the scores: made, soft-maxed (saved), dropped */
                void *scores = get(r, saved[i] * 2, r->acts); /* in fp32 */
                act[l][i] = get(r, saved[i], r->acts);
                gp_free(r->p, scores);
            } else {
                act[l][i] = get(r, saved[i], r->acts);
            }
        }
    }
    void *loss = get(r, t * h * FP32, r->acts); /* .float().square() */
    void *grad = get(r, t * h * BF16, r->acts);
    gp_free(r->p, loss);
    void *grads[LAYERS][NPARAM];
    for (int l = LAYERS - 1; l >= 0; l--) {
        for (int i = NS - 1; i >= 0; i--) {
            void *g = get(r, saved[i], r->acts); /* the gradient flowing back */
            gp_free(r->p, act[l][i]);
            gp_free(r->p, grad);
            grad = g;
            /* A linear's weight and bias gradients as its input's comes out. */
            int p = i == 8 ? 6 : i == 6 ? 4 : i == 4 ? 2 : i == 1 ? 0 : -1;
            if (p >= 0) {
                grads[l][p] = get(r, param_bytes(p), r->grads);
                grads[l][p + 1] = get(r, param_bytes(p + 1), r->grads);
            }
        }
        for (int p = 8; p < NPARAM; p++) grads[l][p] = get(r, param_bytes(p), r->grads);
    }
    gp_free(r->p, grad);
    gp_free(r->p, x);
    /* AdamW: its state (two fp32 moments per parameter) on the first step. */
    if (first)
        for (int l = 0; l < LAYERS; l++)
            for (int p = 0; p < NPARAM; p++)
                for (int k = 0; k < 2; k++)
                    opt_state[(l * NPARAM + p) * 2 + k] = get(r, param_bytes(p) * 2, r->optimizer);
    /* zero_grad(set_to_none=True) */
    for (int l = 0; l < LAYERS; l++)
        for (int p = 0; p < NPARAM; p++) gp_free(r->p, grads[l][p]);
}

static gp_stats run_trace(int placement, int grads_long, double slack)
{
    gp_config cfg;
    gp_config_default(&cfg);
    cfg.placement = placement;
    cfg.cache_slack = slack;
    gp_backend *be;
    run r;
    if (gp_backend_host_create(80 * GiB, &be) != GP_OK || gp_pool_create(be, &cfg, &r.p) != GP_OK) {
        fprintf(stderr, "bench_frag: %s\n", gp_last_error());
        exit(1);
    }
    gp_tag_intern("weights", &r.weights);
    gp_tag_intern("optimizer", &r.optimizer);
    gp_tag_intern("activations", &r.acts);
    gp_tag_intern("grads", &r.grads);
    gp_tag_set_lifetime(r.grads, grads_long ? GP_LIFE_LONG : GP_LIFE_SHORT);
    void *opt[LAYERS * NPARAM * 2];
    for (int l = 0; l < LAYERS; l++) /* the weights, live to the end (freed by destroy) */
        for (int p = 0; p < NPARAM; p++) get(&r, param_bytes(p), r.weights);
    /* The schedule of frag.py: tokens on a triangle wave, twice; a new
     * shape every HOLD iterations, its length drawn at random. */
    rng = 0x9E3779B97F4A7C15ull;
    int n = (ITERS + HOLD - 1) / HOLD;
    for (int k = 0, it = 0; k < n; k++) {
        double phase = 2.0 * k / (n - 1 > 1 ? n - 1 : 1);
        phase -= (int)phase;
        double wave = 1.0 - (2 * phase - 1 < 0 ? 1 - 2 * phase : 2 * phase - 1);
        int tokens = (int)(MIN_TOK + (MAX_TOK - MIN_TOK) * wave + 0.5);
        int fit = 0;
        while (fit < 9 && seq_lens[fit] <= tokens) fit++;
        int s = seq_lens[rnd() % (uint64_t)fit], b = tokens / s > 0 ? tokens / s : 1;
        for (int j = 0; j < HOLD && it < ITERS; j++, it++) step(&r, opt, it == 0, b, s);
    }
    gp_stats st;
    gp_pool_stats(r.p, &st, 0);
    gp_pool_destroy(r.p); /* releases the weights and optimizer state too */
    return st;
}

int main(void)
{
    printf("fragmentation trace on the host backend (80 GiB device): %d layers, hidden %d, %d iterations, "
           "tokens %d..%d, AdamW\n", LAYERS, HIDDEN, ITERS, MIN_TOK, MAX_TOK);
    printf("%-10s %-22s %14s %14s %9s %7s %7s %6s\n", "slack", "placement", "peak reserved",
           "peak allocated", "ratio", "maps", "unmaps", "syncs");
    const struct { int placement, grads_long; const char *name; } cases[] = {
        {GP_PLACE_NONE, 0, "none"},
        {GP_PLACE_LIFETIME, 0, "lifetime (grads short)"},
        {GP_PLACE_LIFETIME, 1, "lifetime (grads long)"},
    };
    const double slacks[] = {0.05, -1};
    for (int i = 0; i < 2; i++) {
        for (int c = 0; c < 3; c++) {
            gp_stats s = run_trace(cases[c].placement, cases[c].grads_long, slacks[i]);
            printf("%-10s %-22s %10.3f GiB %10.3f GiB %9.3f %7llu %7llu %6llu\n", i ? "none" : "5%",
                   cases[c].name, (double)s.reserved_peak / GiB, (double)s.allocated_peak / GiB,
                   (double)s.reserved_peak / (double)s.allocated_peak, (unsigned long long)s.n_map,
                   (unsigned long long)s.n_unmap, (unsigned long long)s.n_sync);
        }
    }
    return 0;
}
