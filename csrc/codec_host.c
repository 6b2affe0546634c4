/*
 * codec_host.c -- the codec of the host backend (codec.h): libzstd, level 1,
 * on byte planes, so that the whole offload path, staging, slices,
 * checksums and failures included, runs without a GPU.
 *
 * Byte planes: a chunk of elements `width` bytes wide is rearranged so that
 * byte b of every element comes together (plane b), then compressed as one
 * zstd frame.  For bf16 the high bytes (sign and 7 bits of exponent) are
 * nearly constant and compress well, the low bytes (mantissa) hardly; mixed,
 * they compress worse than either (DESIGN.md measured 1.46 for bf16 N(0,
 * 0.02) on planes).  Built without libzstd (GP_HAVE_ZSTD unset), the host
 * offers raw only.
 *
 * The host backend's device memory is host memory, so this runs on the CPU
 * inside the calls, ignoring streams (its copies run at once too).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_impl.h"

#ifndef GP_HAVE_ZSTD

int gp_codec_host_available(void) { return 0; }

gp_status gp_codec_host_init(gp_codec *c, unsigned elem_size)
{
    (void)c, (void)elem_size;
    return gp_error_set(GP_ERR_INVALID, "codec zstd: gpupool was built without libzstd (install libzstd-dev, "
                        "or zstd's headers, and rebuild); use raw or auto");
}

#else

#include <zstd.h>
#include <zstd_errors.h>

#define GP_ZSTD_LEVEL 1

int gp_codec_host_available(void) { return 1; }

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

/* The batch, now: the host is the device. */
static gp_status gp_host_run(gp_codec_job *j, uint32_t k, int decompress)
{
    for (uint32_t b = 0; b < k; b++) (decompress ? gp_host_unpack : gp_host_pack)(j->impl, &j->host, b, j->c->width);
    return GP_OK;
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

gp_status gp_codec_host_init(gp_codec *c, unsigned elem_size)
{
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
