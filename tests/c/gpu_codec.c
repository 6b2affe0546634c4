/*
 * gpu_codec.c -- the codec layer on a real GPU, as offload.c will drive it:
 * a pool on the CUDA backend gives a buffer of N MiB and a staging of at
 * most 160 MiB; the data (bf16 N(0, 0.02), random bytes, or fp32 squares
 * like AdamW's exp_avg_sq) goes out slice by slice (trial, compress, copy
 * each chunk to pinned host memory, checksum) and comes back into a second
 * buffer (checksums, copies up, decompress), which must equal the input.
 * Prints the ratio and the rates: compression alone (launch to host wait),
 * offload (compression + copies down) and restore (copies up +
 * decompression), against the raw pinned copies of the same run.  One
 * stream, no overlap between slices: what the codec costs, not what a
 * pipelined offload reaches.  First the backend's gather on its own, with
 * lengths around the kernel's 16-byte steps and unaligned sources.
 *
 *   usage: gpu_codec CODEC ELEM_SIZE DATA MIB [NVCOMP]
 *          DATA: bf16 | fp32sq | random | zeros; NVCOMP: libnvcomp.so.6 or its folder
 * Built and run by tests/test_offload_codec_gpu.py.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "checksum.h"
#include "codec.h"
#include "testdata.h"

#define MiB (1024ull * 1024ull)
#define STAGING (160 * MiB)
#define REPS 3

static gp_backend *be;
static gp_stream stream;

static void must(gp_status st, const char *what)
{
    if (st == GP_OK) return;
    fprintf(stderr, "%s: %s (%s)\n", what, gp_last_error(), gp_status_str(st));
    exit(2);
}

static void wait_stream(void)
{
    uint64_t ev;
    must(be->event_record(be, stream, &ev), "event_record");
    must(be->event_wait(be, ev), "event_wait");
    be->event_release(be, ev);
}

/* The gather kernel against what backend.h promises. */
static void gather_check(gp_pool *pool)
{
    static const size_t lens[] = {1, 5, 7, 8, 15, 16, 17, 0, 33, 1000, 200000, 65539, 3};
    enum { N = sizeof lens / sizeof lens[0], SRC = 1 << 20, ALIGN = 64, MAX = 100000 };
    unsigned char *src = gp_alloc(pool, SRC, stream, GP_TAG_UNTAGGED, GP_PRIO_NORMAL, NULL);
    unsigned char *dst = gp_alloc(pool, SRC, stream, GP_TAG_UNTAGGED, GP_PRIO_NORMAL, NULL);
    void *arr = gp_alloc(pool, N * 16, stream, GP_TAG_UNTAGGED, GP_PRIO_NORMAL, NULL);
    unsigned char *h, *got;
    if (!src || !dst || !arr) must(GP_ERR_OOM, "gather buffers");
    must(be->host_alloc(be, 3 * (uint64_t)SRC, (void **)&h), "gather host");
    got = h + SRC;
    uint64_t *harr = (uint64_t *)(h + 2 * SRC);
    for (size_t i = 0; i < SRC; i++) h[i] = (unsigned char)(i * 131 + (i >> 9));
    memset(got, 0xa5, SRC);
    uint64_t at = 0;
    for (int b = 0; b < N; b++) {
        harr[b] = (uintptr_t)src + (uint64_t)b * 4099 + 3; /* odd offsets: unaligned sources */
        harr[N + b] = lens[b];
    }
    must(be->copy(be, src, h, SRC, GP_COPY_H2D, stream), "gather src");
    must(be->copy(be, dst, got, SRC, GP_COPY_H2D, stream), "gather dst");
    must(be->copy(be, arr, harr, N * 16, GP_COPY_H2D, stream), "gather arrays");
    must(be->gather(be, dst, (const void *const *)arr, (const size_t *)((uint64_t *)arr + N), N, ALIGN, MAX,
                    stream), "gather");
    must(be->copy(be, got, dst, SRC, GP_COPY_D2H, stream), "gather back");
    wait_stream();
    int ok = 1;
    for (int b = 0; b < N; b++) {
        if (lens[b] > MAX) continue; /* skipped, and takes no room */
        ok &= memcmp(got + at, h + (uint64_t)b * 4099 + 3, lens[b]) == 0;
        at += (lens[b] + ALIGN - 1) / ALIGN * ALIGN;
    }
    CHECK(ok);
    printf("gather %s: %d ranges, %llu bytes\n", ok ? "ok" : "WRONG", N, (unsigned long long)at);
    be->host_free(be, h, 3 * (uint64_t)SRC);
    gp_free(pool, src);
    gp_free(pool, dst);
    gp_free(pool, arr);
}

typedef struct slice_rec {
    uint64_t off, len, n;
    gp_codec_chunk *chunks;
    uint64_t *sums;
} slice_rec;

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: %s CODEC ELEM_SIZE DATA MIB [NVCOMP]\n", argv[0]);
        return 2;
    }
    const char *codec_name = argv[1], *kind = argv[3];
    int kind_id = data_kind(kind);
    if (kind_id < 0) {
        fprintf(stderr, "data %s: expected random, zeros, bf16 or fp32sq\n", kind);
        return 2;
    }
    unsigned elem = (unsigned)atoi(argv[2]);
    uint64_t len = (uint64_t)atoll(argv[4]) * MiB;
    const char *nvcomp = argc > 5 ? argv[5] : NULL;

    must(gp_backend_cuda_create(0, &be), "cuda backend");
    gp_config cfg;
    gp_config_default(&cfg);
    gp_pool *pool;
    must(gp_pool_create(be, &cfg, &pool), "pool");
    must(be->stream_create(be, &stream), "stream");
    gather_check(pool);

    gp_codec_params prm = {.name = codec_name, .elem_size = elem, .nvcomp = nvcomp};
    gp_codec *c;
    must(gp_codec_open(be, &prm, &c), "codec");
    unsigned ver = 0;
    const char *from = gp_nvcomp_loaded(&ver);
    printf("codec %s; nvCOMP %s (%u)\n", gp_codec_describe(c), from ? from : "not loaded", ver);

    unsigned char *src = gp_alloc(pool, len, stream, GP_TAG_UNTAGGED, GP_PRIO_NORMAL, NULL);
    unsigned char *dst = gp_alloc(pool, len, stream, GP_TAG_UNTAGGED, GP_PRIO_NORMAL, NULL);
    if (!src || !dst) must(GP_ERR_OOM, "device buffers");
    unsigned char *data, *back, *store;
    uint64_t store_cap = len + len / 8 + 64 * MiB;
    must(be->host_alloc(be, len, (void **)&data), "pinned data");
    must(be->host_alloc(be, len, (void **)&back), "pinned readback");
    must(be->host_alloc(be, store_cap, (void **)&store), "pinned store");
    data_fill(data, len, kind_id);
    memset(back, 0xa5, len);
    must(be->copy(be, src, data, len, GP_COPY_H2D, stream), "upload");
    must(be->copy(be, dst, back, len, GP_COPY_H2D, stream), "clear dst");
    wait_stream();

    /* Raw pinned copies, the yardstick. */
    double t = data_now();
    must(be->copy(be, store, src, len, GP_COPY_D2H, stream), "raw d2h");
    wait_stream();
    double raw_d2h = (double)len / (data_now() - t) / 1e9;
    t = data_now();
    must(be->copy(be, dst, store, len, GP_COPY_H2D, stream), "raw h2d");
    wait_stream();
    double raw_h2d = (double)len / (data_now() - t) / 1e9;

    uint32_t m;
    uint64_t dev_b, host_b;
    void *scratch = NULL;
    must(gp_codec_job_fit(c, STAGING, &m), "job fit");
    if (gp_codec_kind(c) == GP_CODEC_RAW) m = (uint32_t)(STAGING / gp_codec_chunk_size(c));
    must(gp_codec_job_need(c, m, &dev_b, &host_b), "job need");
    void *stage = dev_b ? gp_alloc(pool, dev_b, stream, GP_TAG_UNTAGGED, GP_PRIO_NORMAL, NULL) : NULL;
    if (dev_b && !stage) must(GP_ERR_OOM, "staging");
    if (host_b) must(be->host_alloc(be, host_b, &scratch), "scratch");
    gp_codec_job *j;
    must(gp_codec_job_create(c, m, stage, dev_b, scratch, host_b, &j), "job");
    uint64_t max = gp_codec_job_max_slice(j), n_slices = (len + max - 1) / max, cs = gp_codec_chunk_size(c);
    printf("staging %.1f MiB for %u chunks (slices of %.1f MiB), host scratch %llu B\n", (double)dev_b / MiB, m,
           (double)max / MiB, (unsigned long long)host_b);
    CHECK(dev_b <= STAGING);

    slice_rec *sl = calloc(n_slices, sizeof *sl);
    double best_comp = 1e9, best_off = 1e9, best_res = 1e9, trial_ratio = 0;
    uint64_t stored = 0, raw_chunks = 0, chunks = 0;
    for (int rep = 0; rep <= REPS; rep++) { /* rep 0 warms up */
        double comp = 0, t_off = data_now();
        uint64_t used = 0;
        stored = raw_chunks = chunks = 0;
        for (uint64_t s = 0; s < n_slices; s++) {
            slice_rec *r = &sl[s];
            r->off = s * max;
            r->len = len - r->off < max ? len - r->off : max;
            r->n = gp_codec_chunks(c, r->len);
            if (!r->chunks) r->chunks = calloc(r->n, sizeof *r->chunks), r->sums = calloc(r->n, 8);
            int worth;
            must(gp_codec_trial(j, stream, src + r->off, r->len, &trial_ratio, &worth), "trial");
            double t0 = data_now();
            uint64_t need;
            must(gp_codec_compress(j, stream, src + r->off, r->len, !worth), "compress");
            wait_stream();
            comp += data_now() - t0;
            must(gp_codec_compress_result(j, r->chunks, r->n, &need), "compress_result");
            if (used + need > store_cap) must(GP_ERR_NOMEM, "store too small");
            for (uint64_t i = 0; i < r->n; i++) {
                gp_codec_chunk *k = &r->chunks[i];
                must(be->copy(be, store + used, k->data, k->stored, GP_COPY_D2H, stream), "d2h chunk");
                k->data = store + used;
                used += gp_codec_pad(k->stored);
                stored += k->stored;
                raw_chunks += k->raw;
                chunks++;
            }
            wait_stream();
            for (uint64_t i = 0; i < r->n; i++)
                r->sums[i] = gp_checksum(r->chunks[i].data, r->chunks[i].stored, (uintptr_t)src + r->off + i * cs);
        }
        double off = data_now() - t_off;
        must(be->copy(be, dst, back, len, GP_COPY_H2D, stream), "clear dst"); /* back is 0xa5 */
        wait_stream();
        double t_res = data_now();
        for (uint64_t s = 0; s < n_slices; s++) {
            slice_rec *r = &sl[s];
            for (uint64_t i = 0; i < r->n; i++)
                CHECK(gp_checksum(r->chunks[i].data, r->chunks[i].stored, (uintptr_t)src + r->off + i * cs) ==
                      r->sums[i]);
            must(gp_codec_decompress(j, stream, dst + r->off, r->len, r->chunks, r->n), "decompress");
            wait_stream();
            must(gp_codec_decompress_check(j), "decompress_check");
        }
        double res = data_now() - t_res;
        if (rep) {
            best_comp = comp < best_comp ? comp : best_comp;
            best_off = off < best_off ? off : best_off;
            best_res = res < best_res ? res : best_res;
        }
    }
    unsigned char *check = malloc(len);
    must(be->copy(be, check, dst, len, GP_COPY_D2H, stream), "readback");
    wait_stream();
    int same = memcmp(check, data, len) == 0;
    CHECK(same);
    double gb = (double)len / 1e9;
    printf("RESULT codec=%s data=%s bytes=%llu ratio=%.3f host_fraction=%.3f raw_chunks=%llu/%llu trial=%.3f "
           "compress_GBps=%.1f offload_GBps=%.1f restore_GBps=%.1f raw_d2h_GBps=%.1f raw_h2d_GBps=%.1f "
           "identical=%d\n",
           gp_codec_id_name(gp_codec_kind(c)), kind, (unsigned long long)len, (double)len / (double)stored,
           (double)stored / (double)len, (unsigned long long)raw_chunks, (unsigned long long)chunks, trial_ratio,
           gb / best_comp, gb / best_off, gb / best_res, raw_d2h, raw_h2d, same);

    /* A corrupted compressed chunk: the checksum sees it; nvCOMP, given it
     * anyway, must not crash (it may or may not notice). */
    for (uint64_t i = 0; i < sl[0].n; i++) {
        gp_codec_chunk *k = &sl[0].chunks[i];
        if (k->raw) continue;
        unsigned char *b = (unsigned char *)k->data;
        b[k->stored / 2] ^= 0x5a;
        CHECK(gp_checksum(b, k->stored, (uintptr_t)src + i * cs) != sl[0].sums[i]);
        must(gp_codec_decompress(j, stream, dst, sl[0].len, sl[0].chunks, sl[0].n), "decompress corrupted");
        wait_stream();
        gp_status st = gp_codec_decompress_check(j);
        printf("corrupted chunk %llu: decompress_check %s%s%s\n", (unsigned long long)i, gp_status_str(st),
               st ? ": " : "", st ? gp_last_error() : "");
        b[k->stored / 2] ^= 0x5a;
        break;
    }

    free(check);
    for (uint64_t s = 0; s < n_slices; s++) free(sl[s].chunks), free(sl[s].sums);
    free(sl);
    gp_codec_job_destroy(j);
    gp_codec_close(c);
    if (scratch) be->host_free(be, scratch, host_b);
    be->host_free(be, data, len);
    be->host_free(be, back, len);
    be->host_free(be, store, store_cap);
    be->stream_destroy(be, stream);
    gp_pool_destroy(pool);
    return check_done();
}
