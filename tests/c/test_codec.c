/*
 * test_codec.c -- the codec layer of offload (codec.h) on the host backend:
 * every host codec round-trips incompressible data, zeros, bf16-like data,
 * odd sizes, one byte, exactly one chunk and many chunks, through slices of
 * a job whose staging comes from a pool, as offload.c will use it; raw is
 * chosen where compression does not pay; corrupted chunks and chunk tables
 * are caught without a crash; misuse gets errors; the checksum sees every
 * flipped bit; the nvCOMP loader says clearly when the library is absent.
 *
 * Built with and without GP_HAVE_ZSTD (tests/test_c.py).  With
 * GP_TEST_NVCOMP set to a libnvcomp.so.6 (tests/test_c.py sets it when the
 * nvidia-libnvcomp-cu13 wheel is installed), the loader is also checked on
 * the real library, and the nvCOMP codecs' sizes and a failing launch on a
 * stand-in CUDA backend (no GPU here).
 */
#include <dlfcn.h>
#include <string.h>

#include "checksum.h"
#include "codec.h"
#include "pool_check.h"
#include "testdata.h"

#define CHUNK (4 * KiB) /* small, so that many chunks are cheap */

static gp_codec *open_codec(gp_backend *be, const char *name, unsigned elem)
{
    gp_codec_params prm = {.name = name, .elem_size = elem, .chunk = CHUNK};
    gp_codec *c = NULL;
    gp_status st = gp_codec_open(be, &prm, &c);
    if (st != GP_OK) fprintf(stderr, "open %s: %s\n", name, gp_last_error());
    CHECK(st == GP_OK && c);
    return c;
}

/* What the offload side keeps of one slice. */
typedef struct stored_slice {
    uint64_t off, len, n;
    gp_codec_chunk *chunks;
    uint64_t *sums;
} stored_slice;

typedef struct roundtrip {
    gp_pool *p;
    gp_backend *be;
    gp_codec *c;
    gp_codec_job *j;
    void *stage, *scratch;
    uint64_t dev_bytes, host_bytes;
    const unsigned char *src;    /* the offloaded buffer (checksum seeds) */
    unsigned char *host;         /* pinned: where stored chunks live */
    uint64_t host_cap, host_used;
    stored_slice slices[64];
    int n_slices;
    uint64_t raw_chunks, chunks, stored;
} roundtrip;

static gp_backend *test_be; /* the backend of the pool under test */

static void rt_open(roundtrip *r, gp_pool *p, gp_codec *c, uint64_t staging, uint64_t host_cap)
{
    memset(r, 0, sizeof *r);
    r->p = p;
    r->be = test_be;
    r->c = c;
    uint32_t m = 0;
    CHECK(gp_codec_job_fit(c, staging, &m) == GP_OK && m > 0);
    if (gp_codec_kind(c) == GP_CODEC_RAW) m = 16; /* raw needs no staging: any slice size */
    CHECK(gp_codec_job_need(c, m, &r->dev_bytes, &r->host_bytes) == GP_OK);
    CHECK(r->dev_bytes <= staging);
    if (r->dev_bytes) r->stage = gp_alloc(p, r->dev_bytes, NULL, GP_TAG_UNTAGGED, GP_PRIO_NORMAL, NULL);
    if (r->host_bytes) CHECK(r->be->host_alloc(r->be, r->host_bytes, &r->scratch) == GP_OK);
    CHECK(gp_codec_job_create(c, m, r->stage, r->dev_bytes, r->scratch, r->host_bytes, &r->j) == GP_OK);
    r->host_cap = host_cap;
    CHECK(r->be->host_alloc(r->be, host_cap, (void **)&r->host) == GP_OK);
}

static void rt_close(roundtrip *r)
{
    for (int s = 0; s < r->n_slices; s++) free(r->slices[s].chunks), free(r->slices[s].sums);
    gp_codec_job_destroy(r->j);
    if (r->stage) gp_free(r->p, r->stage);
    if (r->scratch) r->be->host_free(r->be, r->scratch, r->host_bytes);
    r->be->host_free(r->be, r->host, r->host_cap);
}

/* Offload [src, src+len) slice by slice as offload.c will: trial, compress,
 * copy each stored chunk to the host at an aligned place, checksum it. */
static int rt_offload(roundtrip *r, const unsigned char *src, uint64_t len, int trial)
{
    r->src = src;
    uint64_t max = gp_codec_job_max_slice(r->j);
    for (uint64_t off = 0; off < len; off += max) {
        stored_slice *s = &r->slices[r->n_slices++];
        s->off = off;
        s->len = len - off < max ? len - off : max;
        s->n = gp_codec_chunks(r->c, s->len);
        s->chunks = calloc(s->n, sizeof *s->chunks);
        s->sums = calloc(s->n, sizeof *s->sums);
        double ratio = 0;
        int worth = 1;
        if (trial && gp_codec_trial(r->j, NULL, src + off, s->len, &ratio, &worth) != GP_OK) return -1;
        uint64_t need = 0;
        if (gp_codec_compress(r->j, NULL, src + off, s->len, !worth) != GP_OK) return -1;
        if (gp_codec_compress_result(r->j, s->chunks, s->n, &need) != GP_OK) return -1;
        if (r->host_used + need > r->host_cap) return -2;
        for (uint64_t i = 0; i < s->n; i++) {
            gp_codec_chunk *k = &s->chunks[i];
            unsigned char *at = r->host + r->host_used;
            CHECK((uintptr_t)at % GP_CODEC_ALIGN == 0);
            if (r->be->copy(r->be, at, k->data, k->stored, GP_COPY_D2H, NULL) != GP_OK) return -1;
            k->data = at;
            s->sums[i] = gp_checksum(at, k->stored, (uintptr_t)src + off + i * CHUNK);
            r->host_used += gp_codec_pad(k->stored);
            r->raw_chunks += k->raw;
            r->chunks++;
            r->stored += k->stored;
        }
    }
    return 0;
}

/* Bring every slice back into dst; -1 on the first error (checksums first). */
static int rt_restore(roundtrip *r, unsigned char *dst)
{
    for (int si = 0; si < r->n_slices; si++) {
        stored_slice *s = &r->slices[si];
        for (uint64_t i = 0; i < s->n; i++)
            if (gp_checksum(s->chunks[i].data, s->chunks[i].stored, (uintptr_t)r->src + s->off + i * CHUNK) != s->sums[i])
                return -2;
        if (gp_codec_decompress(r->j, NULL, dst + s->off, s->len, s->chunks, s->n) != GP_OK) return -1;
        if (gp_codec_decompress_check(r->j) != GP_OK) return -1;
    }
    return 0;
}

static void *A(gp_pool *p, uint64_t n) { return gp_alloc(p, n, NULL, GP_TAG_UNTAGGED, GP_PRIO_NORMAL, NULL); }

/* One round trip of `len` bytes of `kind` data; returns stored/len. */
static double roundtrip_case(gp_pool *p, const char *codec, unsigned elem, int kind, uint64_t len, uint64_t staging,
                             int trial, uint64_t *raw_chunks, uint64_t *chunks)
{
    gp_codec *c = open_codec(test_be, codec, elem);
    if (!c) return 0;
    unsigned char *src = A(p, len), *dst = A(p, len);
    CHECK(src && dst);
    data_fill(src, len, kind);
    memset(dst, 0xa5, len);
    roundtrip r;
    rt_open(&r, p, c, staging, 2 * len + 4096 * 64);
    int off = rt_offload(&r, src, len, trial);
    int back = off == 0 ? rt_restore(&r, dst) : -3;
    if (off || back || memcmp(src, dst, len) != 0)
        fprintf(stderr, "round trip failed: codec %s elem %u data %s len %llu: offload %d restore %d: %s\n",
                gp_codec_describe(c), elem, data_names[kind], (unsigned long long)len, off, back, gp_last_error());
    CHECK(off == 0 && back == 0 && memcmp(src, dst, len) == 0);
    CHECK(r.chunks == gp_codec_chunks(c, len));
    double ratio = (double)r.stored / (double)len;
    if (raw_chunks) *raw_chunks = r.raw_chunks;
    if (chunks) *chunks = r.chunks;
    rt_close(&r);
    gp_free(p, src);
    gp_free(p, dst);
    gp_codec_close(c);
    return ratio;
}

static const char *const host_codecs[] = {"raw",
#ifdef GP_HAVE_ZSTD
                                          "zstd",
#endif
                                          "auto", NULL};

static void test_names(void)
{
    gp_codec_id id;
    CHECK(gp_codec_parse("ANS", &id) == GP_OK && id == GP_CODEC_ANS);
    CHECK(gp_codec_parse("raw", &id) == GP_OK && id == GP_CODEC_RAW);
    for (int i = 0; i < GP_CODEC_COUNT; i++)
        CHECK(gp_codec_parse(gp_codec_id_name((gp_codec_id)i), &id) == GP_OK && id == (gp_codec_id)i);
    CHECK(gp_codec_parse("lz5", &id) == GP_ERR_INVALID);
    CHECK(strstr(gp_last_error(), "lz5") && strstr(gp_last_error(), "one of: raw auto zstd ans bitcomp"));
    CHECK(gp_codec_parse(NULL, &id) == GP_ERR_INVALID);
}

static void test_open(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 64 * KiB, GP_MODE_EXPANDABLE, &be);
    test_be = be;
    gp_codec *c = open_codec(be, NULL, 2);
#ifdef GP_HAVE_ZSTD
    CHECK(c && gp_codec_kind(c) == GP_CODEC_ZSTD && strstr(gp_codec_describe(c), "2 byte planes"));
#else
    CHECK(c && gp_codec_kind(c) == GP_CODEC_RAW);
    gp_codec *z = NULL;
    gp_codec_params zp = {.name = "zstd"};
    CHECK(gp_codec_open(be, &zp, &z) == GP_ERR_INVALID && !z && strstr(gp_last_error(), "without libzstd"));
#endif
    gp_codec_close(c);
    c = open_codec(be, "raw", 0);
    CHECK(c && gp_codec_chunk_size(c) == CHUNK && gp_codec_chunks(c, 0) == 0 && gp_codec_chunks(c, 1) == 1 &&
          gp_codec_chunks(c, CHUNK) == 1 && gp_codec_chunks(c, CHUNK + 1) == 2);
    gp_codec_close(c);

    const char *gpu_only[] = {"ans", "bitcomp"};
    for (int i = 0; i < 2; i++) {
        gp_codec_params prm = {.name = gpu_only[i]};
        gp_codec *g = (gp_codec *)1;
        CHECK(gp_codec_open(be, &prm, &g) == GP_ERR_INVALID && g == NULL);
        CHECK(strstr(gp_last_error(), "needs a CUDA device") && strstr(gp_last_error(), gpu_only[i]));
    }
    uint32_t bad_chunks[] = {1000, 2 * KiB, 32 * MiB, 3 * 64 * KiB};
    for (int i = 0; i < 4; i++) {
        gp_codec_params prm = {.name = "raw", .chunk = bad_chunks[i]};
        gp_codec *g = NULL;
        CHECK(gp_codec_open(be, &prm, &g) == GP_ERR_INVALID && !g && strstr(gp_last_error(), "power of two"));
    }
    gp_codec_params prm = {.name = "gzip"};
    CHECK(gp_codec_open(be, &prm, &c) == GP_ERR_INVALID && strstr(gp_last_error(), "gzip"));
    done(p);
}

static void test_roundtrips(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(256 * MiB, 64 * KiB, GP_MODE_EXPANDABLE, &be);
    test_be = be;
    const uint64_t lens[] = {1, 2, 3, 511, CHUNK - 1, CHUNK, CHUNK + 1, 7 * CHUNK + 3, 64 * CHUNK, 300 * CHUNK + 1};
    const unsigned elems[] = {0, 1, 2, 4, 8, 3};
    for (int ci = 0; host_codecs[ci]; ci++)
        for (size_t e = 0; e < sizeof elems / sizeof elems[0]; e++)
            for (int kind = DATA_RANDOM; kind <= DATA_BF16; kind++)
                for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
                    for (int trial = 0; trial < 2; trial++)
                        /* 40 chunks of staging: long inputs take several slices */
                        roundtrip_case(p, host_codecs[ci], elems[e], kind, lens[l], 40 * (CHUNK + 256), trial,
                                       NULL, NULL);
    done(p);
}

/* What each codec stores, by data. */
static void test_ratios(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(256 * MiB, 64 * KiB, GP_MODE_EXPANDABLE, &be);
    test_be = be;
    uint64_t len = 200 * CHUNK, raw = 0, n = 0;
    for (int ci = 0; host_codecs[ci]; ci++) {
        /* Random bytes never pay: every chunk raw, nothing added. */
        double r = roundtrip_case(p, host_codecs[ci], 2, DATA_RANDOM, len, 64 * CHUNK, 0, &raw, &n);
        CHECK(r == 1.0 && raw == n);
        r = roundtrip_case(p, host_codecs[ci], 2, DATA_RANDOM, len, 64 * CHUNK, 1, &raw, &n);
        CHECK(r == 1.0 && raw == n);
    }
    CHECK(roundtrip_case(p, "raw", 2, DATA_ZEROS, len, 0, 0, &raw, &n) == 1.0 && raw == n);
#ifdef GP_HAVE_ZSTD
    /* Zeros shrink to almost nothing; bf16 N(0, 0.02) on 2 byte planes by
     * about 1.4 (DESIGN.md: 1.46 with 512 KiB chunks; 4 KiB chunks pay
     * zstd's tables more often), which mixed bytes do not reach. */
    CHECK(roundtrip_case(p, "zstd", 2, DATA_ZEROS, len, 64 * CHUNK, 1, &raw, &n) < 0.01 && raw == 0);
    double planes = roundtrip_case(p, "zstd", 2, DATA_BF16, len, 64 * CHUNK, 1, &raw, &n);
    double bytes = roundtrip_case(p, "zstd", 1, DATA_BF16, len, 64 * CHUNK, 1, &raw, &n);
    printf("bf16 N(0, 0.02), 4 KiB chunks: zstd on planes stores %.3f (ratio %.2f), on bytes %.3f\n", planes,
           1 / planes, bytes);
    CHECK(1 / planes > 1.3 && planes < bytes);
    /* A slice whose trial says "not worth it" is stored raw whole. */
    gp_codec *c = open_codec(be, "zstd", 2);
    roundtrip rt;
    rt_open(&rt, p, c, 64 * CHUNK, 4 * len);
    unsigned char *src = A(p, len);
    data_fill(src, len, DATA_RANDOM);
    data_fill(src + CHUNK, len - CHUNK, DATA_ZEROS); /* only the first chunk is random */
    double ratio = 0;
    int worth = 1;
    CHECK(gp_codec_trial(rt.j, NULL, src, len, &ratio, &worth) == GP_OK && ratio < 1.01 && !worth);
    CHECK(gp_codec_trial(rt.j, NULL, src + CHUNK, CHUNK, &ratio, &worth) == GP_OK && ratio > 50 && worth);
    uint64_t one = gp_codec_job_max_slice(rt.j); /* one slice, all of it raw */
    CHECK(rt_offload(&rt, src, one, 1) == 0 && rt.n_slices == 1 && rt.raw_chunks == one / CHUNK);
    gp_free(p, src);
    rt_close(&rt);
    gp_codec_close(c);
#endif
    done(p);
}

#ifdef GP_HAVE_ZSTD
/* Flipped bytes in stored chunks: the checksum always sees them, and the
 * decompressor, given them anyway, fails or returns other bytes; never a
 * crash or a write outside the slice (ASan watches). */
static void test_corruption(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 64 * KiB, GP_MODE_EXPANDABLE, &be);
    test_be = be;
    gp_codec *c = open_codec(be, "zstd", 2);
    uint64_t len = 16 * CHUNK;
    unsigned char *src = A(p, len), *dst = A(p, len);
    data_fill(src, len, DATA_BF16);
    roundtrip r;
    rt_open(&r, p, c, 64 * CHUNK, 4 * len);
    CHECK(rt_offload(&r, src, len, 0) == 0 && r.n_slices == 1 && r.raw_chunks == 0);
    stored_slice *s = &r.slices[0];
    int errors = 0, wrong = 0, same = 0;
    for (int t = 0; t < 2000; t++) {
        uint64_t i = data_rnd() % s->n;
        unsigned char *b = (unsigned char *)s->chunks[i].data;
        uint32_t at = (uint32_t)(data_rnd() % s->chunks[i].stored);
        unsigned char flip = (unsigned char)(1u << (data_rnd() % 8)) | (unsigned char)(data_rnd() & 0xfe);
        b[at] ^= flip;
        CHECK(gp_checksum(b, s->chunks[i].stored, (uintptr_t)src + i * CHUNK) != s->sums[i]);
        CHECK(rt_restore(&r, dst) == -2); /* the data path stops here */
        /* Past the checksum: the decompressor on its own. */
        gp_status st = gp_codec_decompress(r.j, NULL, dst, len, s->chunks, s->n);
        CHECK(st == GP_OK);
        st = gp_codec_decompress_check(r.j);
        if (st != GP_OK) {
            errors++;
            CHECK(strstr(gp_last_error(), "did not decompress") != NULL);
        } else if (memcmp(src, dst, len) != 0) {
            wrong++;
        } else {
            same++; /* a bit zstd never reads (e.g. an unused header bit) */
        }
        b[at] ^= flip;
    }
    printf("2000 corrupted chunks: the checksum caught all; zstd alone: %d errors, %d unchanged\n", errors, same);
    /* zstd's own checksum of the content: wrong bytes never pass. */
    CHECK(wrong == 0 && errors > 1900);
    CHECK(rt_restore(&r, dst) == 0 && memcmp(src, dst, len) == 0); /* all flips undone */

    /* Truncated, over-long and garbage chunks. */
    gp_codec_chunk bad[16];
    memcpy(bad, s->chunks, sizeof bad);
    bad[3].stored -= 1;
    CHECK(gp_codec_decompress(r.j, NULL, dst, len, bad, 16) == GP_OK);
    CHECK(gp_codec_decompress_check(r.j) == GP_ERR_BACKEND && strstr(gp_last_error(), "chunk 3 "));
    unsigned char *garbage = malloc(CHUNK);
    data_fill(garbage, CHUNK, DATA_RANDOM);
    memcpy(bad, s->chunks, sizeof bad);
    bad[5].data = garbage;
    CHECK(gp_codec_decompress(r.j, NULL, dst, len, bad, 16) == GP_OK);
    CHECK(gp_codec_decompress_check(r.j) == GP_ERR_BACKEND && strstr(gp_last_error(), "chunk 5 "));
    free(garbage);

    /* Tables that do not fit: refused before anything is copied. */
    memcpy(bad, s->chunks, sizeof bad);
    bad[2].stored = 1u << 30;
    CHECK(gp_codec_decompress(r.j, NULL, dst, len, bad, 16) == GP_ERR_INVALID &&
          strstr(gp_last_error(), "chunk 2 of 16") && strstr(gp_last_error(), "out of range"));
    memcpy(bad, s->chunks, sizeof bad);
    bad[1].len = CHUNK - 2;
    CHECK(gp_codec_decompress(r.j, NULL, dst, len, bad, 16) == GP_ERR_INVALID && strstr(gp_last_error(), "wrong length"));
    memcpy(bad, s->chunks, sizeof bad);
    bad[4].raw = 1;
    CHECK(gp_codec_decompress(r.j, NULL, dst, len, bad, 16) == GP_ERR_INVALID && strstr(gp_last_error(), "raw but"));
    memcpy(bad, s->chunks, sizeof bad);
    bad[0].data = NULL;
    CHECK(gp_codec_decompress(r.j, NULL, dst, len, bad, 16) == GP_ERR_INVALID && strstr(gp_last_error(), "no data"));
    CHECK(gp_codec_decompress(r.j, NULL, dst, len, s->chunks, 15) == GP_ERR_INVALID);
    CHECK(gp_codec_decompress(r.j, NULL, dst, len - 1, s->chunks, 16) == GP_ERR_INVALID &&
          strstr(gp_last_error(), "chunk 15 of 16") && strstr(gp_last_error(), "wrong length"));
    memcpy(bad, s->chunks, sizeof bad);
    bad[15].len = 3; /* not whole elements: it would have been stored raw */
    CHECK(gp_codec_decompress(r.j, NULL, dst, len - CHUNK + 3, bad, 16) == GP_ERR_INVALID &&
          strstr(gp_last_error(), "cannot have compressed it here"));
    CHECK(rt_restore(&r, dst) == 0 && memcmp(src, dst, len) == 0); /* the job is still usable */

    gp_free(p, src);
    gp_free(p, dst);
    rt_close(&r);
    gp_codec_close(c);
    done(p);
}
#endif

static void test_job_misuse(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 64 * KiB, GP_MODE_EXPANDABLE, &be);
    test_be = be;
    gp_codec *c = open_codec(be, host_codecs[1] ? host_codecs[1] : "raw", 2);
    unsigned char *src = A(p, 64 * CHUNK);
    data_fill(src, 64 * CHUNK, DATA_BF16);
    roundtrip r;
    rt_open(&r, p, c, 8 * (CHUNK + 512), 64 * CHUNK);
    uint64_t max = gp_codec_job_max_slice(r.j), stored;
    gp_codec_chunk chunks[64];
    CHECK(gp_codec_compress_result(r.j, chunks, 1, &stored) == GP_ERR_INVALID);
    CHECK(gp_codec_decompress_check(r.j) == GP_ERR_INVALID);
    CHECK(gp_codec_compress(r.j, NULL, src, max + 1, 0) == GP_ERR_INVALID && strstr(gp_last_error(), "slice"));
    CHECK(gp_codec_compress(r.j, NULL, src, 0, 0) == GP_ERR_INVALID);
    CHECK(gp_codec_compress(r.j, NULL, NULL, 10, 0) == GP_ERR_INVALID);
    CHECK(gp_codec_compress(r.j, NULL, src, max, 0) == GP_OK);
    CHECK(gp_codec_compress(r.j, NULL, src, max, 0) == GP_ERR_INVALID && strstr(gp_last_error(), "not finished"));
    CHECK(gp_codec_decompress(r.j, NULL, src, max, chunks, 1) == GP_ERR_INVALID);
    double ratio;
    int worth;
    CHECK(gp_codec_trial(r.j, NULL, src, max, &ratio, &worth) == GP_ERR_INVALID);
    char has[32];
    snprintf(has, sizeof has, "has %llu", (unsigned long long)gp_codec_chunks(c, max));
    CHECK(gp_codec_compress_result(r.j, chunks, 3, &stored) == GP_ERR_INVALID && strstr(gp_last_error(), has));
    CHECK(gp_codec_compress_result(r.j, chunks, gp_codec_chunks(c, max), &stored) == GP_OK);
    CHECK(gp_codec_compress_result(r.j, chunks, gp_codec_chunks(c, max), &stored) == GP_ERR_INVALID);
    rt_close(&r);

    if (gp_codec_kind(c) != GP_CODEC_RAW) {
        uint32_t m = 7;
        CHECK(gp_codec_job_fit(c, 100, &m) == GP_ERR_INVALID && m == 0 && strstr(gp_last_error(), "too small"));
        uint64_t dev, host;
        CHECK(gp_codec_job_need(c, 4, &dev, &host) == GP_OK && dev >= 4 * CHUNK && host > 0);
        uint64_t dev0, host0;
        CHECK(gp_codec_job_need(c, 0, &dev0, &host0) == GP_ERR_INVALID);
        void *stage = A(p, dev), *scratch = malloc(host);
        gp_codec_job *j = (gp_codec_job *)1;
        CHECK(gp_codec_job_create(c, 4, stage, dev - 1, scratch, host, &j) == GP_ERR_INVALID && j == NULL &&
              strstr(gp_last_error(), "needs"));
        CHECK(gp_codec_job_create(c, 4, stage, dev, scratch, host - 1, &j) == GP_ERR_INVALID);
        CHECK(gp_codec_job_create(c, 4, (char *)stage + 16, dev, scratch, host, &j) == GP_ERR_INVALID &&
              strstr(gp_last_error(), "aligned"));
        CHECK(gp_codec_job_create(c, 4, stage, dev, scratch, host, &j) == GP_OK && j);
        gp_codec_job_destroy(j);
        gp_free(p, stage);
        free(scratch);
    }
    gp_free(p, src);
    gp_codec_close(c);
    done(p);
}

static void test_checksum(void)
{
    unsigned char buf[300], copy[300];
    data_fill(buf, sizeof buf, DATA_RANDOM);
    memcpy(copy, buf, sizeof buf);
    uint64_t h = gp_checksum(buf, sizeof buf, 0);
    CHECK(h == gp_checksum(copy, sizeof copy, 0));
    int missed = 0;
    for (size_t bit = 0; bit < 8 * sizeof buf; bit++) {
        buf[bit / 8] ^= (unsigned char)(1u << bit % 8);
        missed += gp_checksum(buf, sizeof buf, 0) == h;
        buf[bit / 8] ^= (unsigned char)(1u << bit % 8);
    }
    CHECK(missed == 0);
    /* Several changes at once: flips of the top bit of two words, and of
     * every word (a sum of each word times an odd weight missed every even
     * number of those, a sign flip of two bf16 or fp32 values among them). */
    uint64_t words[64];
    data_fill((unsigned char *)words, sizeof words, DATA_RANDOM);
    uint64_t wh = gp_checksum(words, sizeof words, 3);
    words[5] ^= 1ull << 63;
    words[40] ^= 1ull << 63;
    CHECK(gp_checksum(words, sizeof words, 3) != wh);
    for (size_t i = 0; i < 64; i++) words[i] ^= 1ull << 63;
    CHECK(gp_checksum(words, sizeof words, 3) != wh);
    /* Order matters. */
    unsigned char swapped[256];
    data_fill(swapped, sizeof swapped, DATA_RANDOM);
    uint64_t before = gp_checksum(swapped, sizeof swapped, 0);
    unsigned char tmp[64];
    memcpy(tmp, swapped, 64);
    memcpy(swapped, swapped + 64, 64);
    memcpy(swapped + 64, tmp, 64);
    CHECK(gp_checksum(swapped, sizeof swapped, 0) != before);
    /* Unaligned starts hash the same bytes the same. */
    unsigned char *big = malloc(5000);
    data_fill(big, 5000, DATA_RANDOM);
    memcpy(big + 1, big + 2003, 1500);
    CHECK(gp_checksum(big + 1, 1500, 7) == gp_checksum(big + 2003, 1500, 7));
    /* The seed (a chunk's address) matters: the right bytes in the wrong place differ. */
    CHECK(gp_checksum(big + 1, 1500, 7) != gp_checksum(big + 1, 1500, 8));
    free(big);
}

/* ------------------------------------------------------------- nvCOMP */

static void test_nvcomp_absent(void)
{
    CHECK(gp_nvcomp_load("/nonexistent/libnvcomp.so.6") == GP_ERR_BACKEND);
    const char *e = gp_last_error();
    CHECK(strstr(e, "/nonexistent/libnvcomp.so.6") && strstr(e, "pip install nvidia-libnvcomp-cu13") &&
          strstr(e, "GPUPOOL_NVCOMP set"));
    /* Remembered: the same answer at once. */
    CHECK(gp_nvcomp_load("/nonexistent/libnvcomp.so.6") == GP_ERR_BACKEND && strstr(gp_last_error(), "/nonexistent"));
    /* A folder without it. */
    CHECK(gp_nvcomp_load("/") == GP_ERR_BACKEND && strstr(gp_last_error(), "/: no libnvcomp.so.6"));
    /* Something that is not nvCOMP. */
    CHECK(gp_nvcomp_load("libc.so.6") == GP_ERR_BACKEND && strstr(gp_last_error(), "no symbol nvcompGetProperties"));
    CHECK(gp_nvcomp_loaded(NULL) == NULL);
    CHECK(gp_nvcomp_search_dir("") == GP_ERR_INVALID);
}

/* A stand-in for the CUDA backend: nvCOMP's host-side calls work without a
 * GPU, and its launches fail, which is what is checked here. */
static gp_status fake_copy(gp_backend *be, void *dst, const void *src, uint64_t n, int dir, gp_stream s)
{
    (void)be, (void)dir, (void)s;
    memmove(dst, src, n);
    return GP_OK;
}
static gp_status fake_in_context(gp_backend *be, gp_status (*fn)(void *), void *arg)
{
    (void)be;
    return fn(arg);
}

static void test_nvcomp_loaded(const char *lib)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", lib);
    char *slash = strrchr(dir, '/');
    CHECK(slash != NULL);
    if (!slash) return;
    *slash = '\0';
    /* Found in a search folder (what the Python package registers). */
    CHECK(gp_nvcomp_search_dir(dir) == GP_OK);
    gp_status st = gp_nvcomp_load(NULL);
    if (st != GP_OK) fprintf(stderr, "nvcomp: %s\n", gp_last_error());
    unsigned version = 0;
    const char *from = gp_nvcomp_loaded(&version);
    CHECK(st == GP_OK && from && strstr(from, dir) == from && version / 1000 == 6);
    CHECK(gp_nvcomp_load("/elsewhere") == GP_OK); /* once per process */

    gp_backend fake = {.name = "cuda", .copy = fake_copy, .in_context = fake_in_context};
    struct {
        const char *name;
        unsigned elem;
        const char *desc;
    } cases[] = {{"auto", 2, "ans (float16"}, {"ans", 4, "ans (float32"}, {"ans", 8, "ans (bytes"},
                 {"bitcomp", 4, "bitcomp (float32"}, {"bitcomp", 2, "bitcomp (float16"}, {"auto", 1, "ans (bytes"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gp_codec_params prm = {.name = cases[i].name, .elem_size = cases[i].elem};
        gp_codec *c = NULL;
        st = gp_codec_open(&fake, &prm, &c);
        if (st != GP_OK) fprintf(stderr, "open %s: %s\n", cases[i].name, gp_last_error());
        CHECK(st == GP_OK && c && strstr(gp_codec_describe(c), cases[i].desc) == gp_codec_describe(c));
        if (!c) continue;
        /* The staging budget: 160 MiB holds over a hundred 512 KiB chunks,
         * each taking two slots of its compressed bound (the slot it is
         * compressed into and its place in the packed run the gather makes)
         * besides its arrays. */
        uint32_t m = 0;
        uint64_t dev = 0, host = 0;
        CHECK(gp_codec_job_fit(c, 160 * MiB, &m) == GP_OK && m > 100 && m <= 160);
        CHECK(gp_codec_job_need(c, m, &dev, &host) == GP_OK && dev <= 160 * MiB && dev > (uint64_t)m * 512 * KiB);
        CHECK(host == gp_codec_pad((uint64_t)m * 44));
        gp_codec_close(c);
    }
    gp_codec_params zp = {.name = "zstd"};
    gp_codec *z = NULL;
    CHECK(gp_codec_open(&fake, &zp, &z) == GP_ERR_INVALID && strstr(gp_last_error(), "host backend only"));

    /* Without a GPU the launch fails: an error that names it, no crash. */
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (cuda) {
        dlclose(cuda); /* a real driver: launching on host memory would fault */
        return;
    }
    gp_codec_params prm = {.name = "ans", .elem_size = 2, .chunk = 64 * KiB};
    gp_codec *c = NULL;
    CHECK(gp_codec_open(&fake, &prm, &c) == GP_OK);
    if (!c) return;
    uint64_t dev = 0, host = 0;
    CHECK(gp_codec_job_need(c, 4, &dev, &host) == GP_OK);
    void *stage = aligned_alloc(256, (dev + 255) / 256 * 256), *scratch = aligned_alloc(256, (host + 255) / 256 * 256);
    unsigned char *src = aligned_alloc(256, 128 * KiB), *from_host = aligned_alloc(256, 64 * KiB);
    data_fill(src, 128 * KiB, DATA_BF16);
    gp_codec_job *j = NULL;
    CHECK(gp_codec_job_create(c, 4, stage, dev, scratch, host, &j) == GP_OK);
    if (j) {
        CHECK(gp_codec_compress(j, NULL, src, 128 * KiB, 0) == GP_ERR_BACKEND &&
              strstr(gp_last_error(), "nvcompBatchedANSCompressAsync of 2 chunks failed"));
        double ratio = 0;
        int worth = 1;
        CHECK(gp_codec_trial(j, NULL, src, 128 * KiB, &ratio, &worth) == GP_ERR_BACKEND && ratio == 1.0 && !worth);
        gp_codec_chunk table[2] = {{.data = from_host, .len = 64 * KiB, .stored = 1000},
                                   {.data = src, .len = 64 * KiB, .stored = 64 * KiB, .raw = 1}};
        CHECK(gp_codec_decompress(j, NULL, src, 128 * KiB, table, 2) == GP_ERR_BACKEND &&
              strstr(gp_last_error(), "nvcompBatchedANSDecompressAsync of 1 chunks failed"));
        gp_codec_job_destroy(j);
    }
    free(stage);
    free(scratch);
    free(src);
    free(from_host);
    gp_codec_close(c);
}

int main(void)
{
    test_names();
    test_checksum();
    test_open();
    test_roundtrips();
    test_ratios();
#ifdef GP_HAVE_ZSTD
    test_corruption();
#endif
    test_job_misuse();
    test_nvcomp_absent();
    const char *lib = getenv("GP_TEST_NVCOMP");
    if (lib && *lib) test_nvcomp_loaded(lib);
    else printf("GP_TEST_NVCOMP unset: nvCOMP checked as absent only\n");
    return check_done();
}
