/*
 * codec_zstd.c -- the codec of the host backend (codec.h): libzstd, level 1,
 * on byte planes, so that the whole offload path, staging, slices,
 * checksums and failures included, runs without a GPU.
 *
 * Byte planes: a chunk of elements `width` bytes wide is rearranged so that
 * byte b of every element comes together (plane b), then compressed as one
 * zstd frame.  For bf16 the high bytes (sign and 7 bits of exponent) are
 * nearly constant and compress well, the low bytes (mantissa) hardly; mixed,
 * they compress worse than either (1.46 measured for bf16 N(0, 0.02) on
 * planes).  Built without zstd support (GP_HAVE_ZSTD unset), the host offers
 * raw only.
 *
 * libzstd is not linked: it is loaded with dlopen ("libzstd.so.1") the
 * first time the codec is asked for, through the few functions of its
 * stable API declared below, so that the extension needs nothing outside
 * the manylinux policy and builds without zstd's headers.  Without the
 * library (or with one older than 1.4.0, where these became stable) the
 * host offers raw only, and asking for zstd says why.
 *
 * The host backend's device memory is host memory, so this runs on the CPU
 * inside the calls (in_context), after the work queued before it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_impl.h"

#ifndef GP_HAVE_ZSTD

int gp_codec_zstd_available(void) { return 0; }

gp_status gp_codec_zstd_init(gp_codec *c, unsigned elem_size)
{
    (void)c, (void)elem_size;
    return gp_error_set(GP_ERR_INVALID, "codec zstd: gpupool was built without libzstd support (GP_BUILD_NO_ZSTD=1); "
                        "rebuild without that setting, or use raw or auto");
}

#else

#include <dlfcn.h>
#include <pthread.h>

/* zstd.h and zstd_errors.h, the part used here (stable since 1.4.0). */
typedef struct ZSTD_CCtx_s ZSTD_CCtx;
typedef struct ZSTD_DCtx_s ZSTD_DCtx;
typedef struct { const void *src; size_t size; size_t pos; } ZSTD_inBuffer;
typedef struct { void *dst; size_t size; size_t pos; } ZSTD_outBuffer;
typedef enum { ZSTD_c_compressionLevel = 100, ZSTD_c_checksumFlag = 201 } ZSTD_cParameter;
typedef enum { ZSTD_reset_session_only = 1 } ZSTD_ResetDirective;
typedef enum { ZSTD_e_continue = 0, ZSTD_e_flush = 1, ZSTD_e_end = 2 } ZSTD_EndDirective;
typedef enum { ZSTD_error_dstSize_tooSmall = 70 } ZSTD_ErrorCode;
#define GP_ZSTD_MIN_VERSION 10400 /* 1.4.0 */

#define GP_ZSTD_FUNCS(X)                                                                         \
    X(unsigned, ZSTD_versionNumber, (void))                                                     \
    X(ZSTD_CCtx *, ZSTD_createCCtx, (void))                                                     \
    X(ZSTD_DCtx *, ZSTD_createDCtx, (void))                                                     \
    X(size_t, ZSTD_freeCCtx, (ZSTD_CCtx *))                                                     \
    X(size_t, ZSTD_freeDCtx, (ZSTD_DCtx *))                                                     \
    X(unsigned, ZSTD_isError, (size_t))                                                         \
    X(ZSTD_ErrorCode, ZSTD_getErrorCode, (size_t))                                              \
    X(const char *, ZSTD_getErrorString, (ZSTD_ErrorCode))                                      \
    X(size_t, ZSTD_compressBound, (size_t))                                                     \
    X(size_t, ZSTD_CCtx_setParameter, (ZSTD_CCtx *, ZSTD_cParameter, int))                      \
    X(size_t, ZSTD_CCtx_reset, (ZSTD_CCtx *, ZSTD_ResetDirective))                              \
    X(size_t, ZSTD_CCtx_setPledgedSrcSize, (ZSTD_CCtx *, unsigned long long))                   \
    X(size_t, ZSTD_compressStream2, (ZSTD_CCtx *, ZSTD_outBuffer *, ZSTD_inBuffer *, ZSTD_EndDirective)) \
    X(size_t, ZSTD_decompressDCtx, (ZSTD_DCtx *, void *, size_t, const void *, size_t))

#define GP_ZSTD_FIELD(ret, name, args) ret(*name) args;
static struct {
    GP_ZSTD_FUNCS(GP_ZSTD_FIELD)
} gz;
#undef GP_ZSTD_FIELD

static pthread_once_t gp_zstd_once = PTHREAD_ONCE_INIT;
static int gp_zstd_ok;
static char gp_zstd_why[256];

static void gp_zstd_load(void)
{
    void *h = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(gp_zstd_why, sizeof gp_zstd_why, "%s", e ? e : "libzstd.so.1 not found");
        return;
    }
#define GP_ZSTD_SYM(ret, name, args)                                                              \
    if (!(*(void **)&gz.name = dlsym(h, #name))) {                                                \
        snprintf(gp_zstd_why, sizeof gp_zstd_why, "libzstd.so.1 has no %s (older than 1.4.0?)", #name); \
        return;                                                                                   \
    }
    GP_ZSTD_FUNCS(GP_ZSTD_SYM)
#undef GP_ZSTD_SYM
    unsigned v = gz.ZSTD_versionNumber();
    if (v < GP_ZSTD_MIN_VERSION) {
        snprintf(gp_zstd_why, sizeof gp_zstd_why, "libzstd.so.1 is version %u.%u.%u, older than 1.4.0", v / 10000,
                 v / 100 % 100, v % 100);
        return;
    }
    gp_zstd_ok = 1; /* the handle stays open for the life of the process */
}

int gp_codec_zstd_available(void)
{
    pthread_once(&gp_zstd_once, gp_zstd_load);
    return gp_zstd_ok;
}

#define ZSTD_createCCtx gz.ZSTD_createCCtx
#define ZSTD_createDCtx gz.ZSTD_createDCtx
#define ZSTD_freeCCtx gz.ZSTD_freeCCtx
#define ZSTD_freeDCtx gz.ZSTD_freeDCtx
#define ZSTD_isError gz.ZSTD_isError
#define ZSTD_getErrorCode gz.ZSTD_getErrorCode
#define ZSTD_getErrorString gz.ZSTD_getErrorString
#define ZSTD_compressBound gz.ZSTD_compressBound
#define ZSTD_CCtx_setParameter gz.ZSTD_CCtx_setParameter
#define ZSTD_CCtx_reset gz.ZSTD_CCtx_reset
#define ZSTD_CCtx_setPledgedSrcSize gz.ZSTD_CCtx_setPledgedSrcSize
#define ZSTD_compressStream2 gz.ZSTD_compressStream2
#define ZSTD_decompressDCtx gz.ZSTD_decompressDCtx

#define GP_ZSTD_LEVEL 1

typedef struct gp_host_job {
    ZSTD_CCtx *cctx;
    ZSTD_DCtx *dctx;
    unsigned char *planes; /* one chunk, rearranged */
} gp_host_job;

/* Byte b of element e goes to planes[b * n_elems + e]. */
static void gp_planes_split(unsigned char *planes, const unsigned char *src, size_t len, unsigned width)
{
    size_t n = len / width;
    if (width == 2) {
        for (size_t e = 0; e < n; e++) planes[e] = src[2 * e], planes[n + e] = src[2 * e + 1];
        return;
    }
    for (size_t e = 0; e < n; e++)
        for (unsigned b = 0; b < width; b++) planes[b * n + e] = src[e * width + b];
}

static void gp_planes_join(unsigned char *dst, const unsigned char *planes, size_t len, unsigned width)
{
    size_t n = len / width;
    if (width == 2) {
        for (size_t e = 0; e < n; e++) dst[2 * e] = planes[e], dst[2 * e + 1] = planes[n + e];
        return;
    }
    for (size_t e = 0; e < n; e++)
        for (unsigned b = 0; b < width; b++) dst[e * width + b] = planes[b * n + e];
}

static gp_status gp_host_temp(const gp_codec *c, uint32_t max_chunks, uint64_t *temp)
{
    (void)c, (void)max_chunks;
    *temp = 0;
    return GP_OK;
}

static void gp_host_job_fini(gp_codec_job *j)
{
    gp_host_job *h = j->impl;
    if (!h) return;
    ZSTD_freeCCtx(h->cctx);
    ZSTD_freeDCtx(h->dctx);
    free(h->planes);
    free(h);
    j->impl = NULL;
}

static gp_status gp_host_job_init(gp_codec_job *j)
{
    gp_host_job *h = calloc(1, sizeof *h);
    j->impl = h;
    if (h) {
        h->cctx = ZSTD_createCCtx();
        h->dctx = ZSTD_createDCtx();
        h->planes = malloc(j->c->chunk);
    }
    if (h && h->cctx && h->dctx && h->planes &&
        !ZSTD_isError(ZSTD_CCtx_setParameter(h->cctx, ZSTD_c_compressionLevel, GP_ZSTD_LEVEL)) &&
        !ZSTD_isError(ZSTD_CCtx_setParameter(h->cctx, ZSTD_c_checksumFlag, 1)))
        return GP_OK;
    gp_host_job_fini(j);
    return gp_error_set(GP_ERR_NOMEM, "codec %s: out of host memory for zstd's contexts", j->c->desc);
}

/* A zstd error as a batch status: its code, which is never 0. */
static int32_t gp_zstd_status(size_t r) { return (int32_t)ZSTD_getErrorCode(r); }

/* One frame for the chunk, a block boundary after each plane (a flush), so
 * that each plane gets entropy tables of its own whatever the chunk size;
 * with zstd's checksum of the content, so that a corrupted frame never
 * decompresses to wrong bytes unnoticed.  Returns a batch status. */
static int32_t gp_zstd_planes(ZSTD_CCtx *cctx, void *out, size_t cap, const unsigned char *planes, size_t len,
                              unsigned width, size_t *out_len)
{
    size_t r = ZSTD_CCtx_reset(cctx, ZSTD_reset_session_only);
    if (!ZSTD_isError(r)) r = ZSTD_CCtx_setPledgedSrcSize(cctx, len);
    ZSTD_outBuffer ob = {out, cap, 0};
    size_t plane = len / width;
    for (unsigned b = 0; b < width && !ZSTD_isError(r); b++) {
        ZSTD_inBuffer ib = {planes + b * plane, plane, 0};
        /* With room for the bound, one call takes a plane and returns 0. */
        r = ZSTD_compressStream2(cctx, &ob, &ib, b + 1 == width ? ZSTD_e_end : ZSTD_e_flush);
        if (!ZSTD_isError(r) && (r != 0 || ib.pos != ib.size)) return ZSTD_error_dstSize_tooSmall;
    }
    if (ZSTD_isError(r)) return gp_zstd_status(r);
    *out_len = ob.pos;
    return 0;
}

static void gp_host_pack(gp_host_job *h, const gp_codec_arrays *a, uint32_t b, unsigned width)
{
    const unsigned char *planes = a->in[b];
    if (width > 1) {
        gp_planes_split(h->planes, a->in[b], a->in_len[b], width);
        planes = h->planes;
    }
    a->out_len[b] = 0;
    a->status[b] = gp_zstd_planes(h->cctx, a->out[b], a->out_cap[b], planes, a->in_len[b], width, &a->out_len[b]);
}

static void gp_host_unpack(gp_host_job *h, const gp_codec_arrays *a, uint32_t b, unsigned width)
{
    /* Planes are joined only when the frame gave exactly a chunk back. */
    void *to = width > 1 ? h->planes : a->out[b];
    size_t r = ZSTD_decompressDCtx(h->dctx, to, a->out_cap[b], a->in[b], a->in_len[b]);
    a->status[b] = ZSTD_isError(r) ? gp_zstd_status(r) : 0;
    a->out_len[b] = ZSTD_isError(r) ? 0 : r;
    if (width > 1 && r == a->out_cap[b]) gp_planes_join(a->out[b], h->planes, r, width);
}

typedef struct gp_host_batch {
    gp_codec_job *j;
    uint32_t k;
    int decompress;
} gp_host_batch;

static gp_status gp_host_batch_run(void *arg)
{
    const gp_host_batch *a = arg;
    gp_codec_job *j = a->j;
    for (uint32_t b = 0; b < a->k; b++)
        (a->decompress ? gp_host_unpack : gp_host_pack)(j->impl, &j->host, b, j->c->width);
    return GP_OK;
}

/* The batch, now: the host is the device.  Through in_context, as device
 * work after what is queued (the host backend's deferred streams run it
 * first: the staging a copy up fills, or a copy out has yet to read). */
static gp_status gp_host_run(gp_codec_job *j, uint32_t k, int decompress)
{
    gp_host_batch a = {j, k, decompress};
    return j->c->be->in_context(j->c->be, gp_host_batch_run, &a);
}

static gp_status gp_host_compress(gp_codec_job *j, gp_stream stream, uint32_t k)
{
    (void)stream;
    return gp_host_run(j, k, 0);
}

static gp_status gp_host_decompress(gp_codec_job *j, gp_stream stream, uint32_t k)
{
    (void)stream;
    return gp_host_run(j, k, 1);
}

static const char *gp_host_status_text(const gp_codec *c, int32_t status)
{
    (void)c;
    return ZSTD_getErrorString((ZSTD_ErrorCode)status);
}

static const gp_codec_ops gp_host_ops = {
    .temp_bytes = gp_host_temp,
    .job_init = gp_host_job_init,
    .job_fini = gp_host_job_fini,
    .compress = gp_host_compress,
    .decompress = gp_host_decompress,
    .status_text = gp_host_status_text,
};

gp_status gp_codec_zstd_init(gp_codec *c, unsigned elem_size)
{
    if (!gp_codec_zstd_available())
        return gp_error_set(GP_ERR_INVALID, "codec zstd: libzstd could not be loaded (%s); install it (Debian and "
                            "Ubuntu: libzstd1, Fedora: libzstd), or use raw or auto", gp_zstd_why);
    /* Planes for the element sizes of tensors; anything else is bytes. */
    c->width = elem_size == 2 || elem_size == 4 || elem_size == 8 ? elem_size : 1;
    c->in_align = 1;
    /* The bound, plus a block header per flush and the checksum. */
    c->slot = gp_codec_pad(ZSTD_compressBound(c->chunk) + 8 * 3 + 4);
    c->ops = &gp_host_ops;
    snprintf(c->desc, sizeof c->desc, "zstd (level %d, %u byte plane%s, %u KiB chunks)", GP_ZSTD_LEVEL, c->width,
             c->width > 1 ? "s" : "", c->chunk >> 10);
    return GP_OK;
}

#endif /* GP_HAVE_ZSTD */
