/*
 * bench_codec.c -- the host codec (zstd level 1 on byte planes, codec_zstd.c)
 * and the chunk checksum (checksum.c) on one CPU thread, through the codec
 * interface as offload uses it on the host backend: 256 MiB of bf16
 * N(0, 0.02) in 512 KiB chunks, compressed into a 160 MiB staging slice by
 * slice and decompressed back (the stored chunks stay in the staging, so
 * only the codec is timed); then the checksum over the 256 MiB.  Prints the
 * ratio and GB/s of each (of uncompressed bytes), the best of REPS runs,
 * for planes and, for comparison, plain bytes.
 *
 * Build and run (from the repository root):
 *   cc -O2 -std=c11 -D_GNU_SOURCE -DGP_HAVE_ZSTD -Icsrc -Icsrc/backend -Icsrc/backend/cuda -Icsrc/offload -Icsrc/offload/codec -Icsrc/pool -Icsrc/python -Icsrc/tenant -Itests/c \
 *      benchmarks/bench_codec.c \
 *      csrc/offload/codec/codec.c csrc/offload/codec/codec_zstd.c csrc/offload/codec/codec_nvcomp.c csrc/offload/checksum.c csrc/error.c \
 *      csrc/backend/backend_host.c csrc/backend/host_pages.c csrc/backend/host_queue.c -lzstd -lpthread -ldl -o /tmp/bench_codec && /tmp/bench_codec
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec.h"
#include "testdata.h"

#define MiB (1024ull * 1024ull)
#define LEN (256 * MiB)
#define STAGING (160 * MiB)
#define REPS 3

static void must(gp_status st, const char *what)
{
    if (st == GP_OK) return;
    fprintf(stderr, "%s: %s\n", what, gp_last_error());
    exit(1);
}

static void bench(gp_backend *be, unsigned char *src, unsigned char *dst, void *stage, unsigned elem)
{
    gp_codec_params prm = {.name = "zstd", .elem_size = elem};
    gp_codec *c;
    must(gp_codec_open(be, &prm, &c), "codec");
    uint32_t m;
    uint64_t dev_b, host_b;
    must(gp_codec_job_fit(c, STAGING, &m), "fit");
    must(gp_codec_job_need(c, m, &dev_b, &host_b), "need");
    void *scratch = aligned_alloc(64, (host_b + 63) / 64 * 64);
    gp_codec_job *j;
    must(gp_codec_job_create(c, m, stage, dev_b, scratch, host_b, &j), "job");
    uint64_t max = gp_codec_job_max_slice(j), n = gp_codec_chunks(c, max);
    gp_codec_chunk *chunks = calloc(n, sizeof *chunks);
    double best_c = 1e9, best_d = 1e9;
    uint64_t stored = 0;
    for (int rep = 0; rep < REPS; rep++) {
        double tc = 0, td = 0;
        stored = 0;
        for (uint64_t off = 0; off < LEN; off += max) {
            uint64_t len = LEN - off < max ? LEN - off : max, k = gp_codec_chunks(c, len), bytes;
            double t = data_now();
            must(gp_codec_compress(j, NULL, src + off, len, 0), "compress");
            must(gp_codec_compress_result(j, chunks, k, &bytes), "result");
            tc += data_now() - t;
            for (uint64_t i = 0; i < k; i++) stored += chunks[i].stored;
            /* Decompress from where the chunks are (the staging): the codec alone. */
            t = data_now();
            must(gp_codec_decompress(j, NULL, dst + off, len, chunks, k), "decompress");
            must(gp_codec_decompress_check(j), "check");
            td += data_now() - t;
        }
        best_c = tc < best_c ? tc : best_c;
        best_d = td < best_d ? td : best_d;
    }
    if (memcmp(src, dst, LEN) != 0) must(GP_ERR_INVALID, "round trip changed the bytes");
    printf("%-44s ratio %.3f  compress %.2f GB/s  decompress %.2f GB/s (one thread)\n", gp_codec_describe(c),
           (double)LEN / (double)stored, LEN / best_c / 1e9, LEN / best_d / 1e9);
    free(chunks);
    gp_codec_job_destroy(j);
    free(scratch);
    gp_codec_close(c);
}

int main(void)
{
    gp_backend *be;
    must(gp_backend_host_create(2 * LEN + STAGING, &be), "host backend");
    uintptr_t base;
    uint64_t handle;
    uint64_t size = 2 * LEN + STAGING;
    must(be->reserve(be, size, be->granularity, &base), "reserve");
    must(be->map(be, base, size, &handle), "map");
    unsigned char *src = (unsigned char *)base, *dst = src + LEN, *stage = dst + LEN;
    data_fill(src, LEN, DATA_BF16);
    printf("256 MiB of bf16 N(0, 0.02), 512 KiB chunks, 160 MiB staging\n");
    bench(be, src, dst, stage, 2);
    bench(be, src, dst, stage, 1);
    double best = 1e9;
    uint64_t h = 0;
    for (int rep = 0; rep < REPS; rep++) {
        double t = data_now();
        h ^= gp_checksum(src, LEN, (uint64_t)rep);
        t = data_now() - t;
        best = t < best ? t : best;
    }
    printf("gp_checksum over 256 MiB: %.2f GB/s (one thread; %016llx)\n", LEN / best / 1e9, (unsigned long long)h);
    be->unmap(be, base, size, handle);
    be->unreserve(be, base, size);
    be->destroy(be);
    return 0;
}
