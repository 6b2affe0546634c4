/*
 * codec.c -- what every codec shares (codec.h): names, the choice behind
 * "auto", chunk geometry, the staging's layout, the raw fallback, the
 * checks of a chunk table and the copies of stored chunks back to the
 * device.  The compressors themselves are in codec_zstd.c (zstd on byte
 * planes) and codec_nvcomp.c (nvCOMP); "raw" is the absence of one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_impl.h"

/* Most chunks of one job's batch: bounds the arrays whatever the staging. */
#define GP_CODEC_MAX_BATCH (1u << 20)
/* Alignment of the temp memory and of the device arrays in the staging. */
#define GP_CODEC_DEV_ALIGN 256u

static uint64_t gp_codec_round(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

/* ------------------------------------------------------------- the codec */

static int gp_backend_is(const gp_backend *be, const char *name)
{
    return be->name && strcmp(be->name, name) == 0;
}

/* What "auto" means on this backend for this element size. */
static gp_codec_id gp_codec_auto(gp_backend *be, const char *nvcomp_path)
{
    if (gp_backend_is(be, "host")) return gp_codec_zstd_available() ? GP_CODEC_ZSTD : GP_CODEC_RAW;
    if (gp_backend_is(be, "cuda") && gp_nvcomp_load(nvcomp_path) == GP_OK) return GP_CODEC_ANS;
    gp_error_clear(); /* no nvCOMP: raw is the answer, not an error */
    return GP_CODEC_RAW;
}

gp_status gp_codec_open(gp_backend *be, const gp_codec_params *params, gp_codec **out)
{
    if (!be || !params || !out) return gp_error_set(GP_ERR_INVALID, "gp_codec_open: NULL argument");
    *out = NULL;
    gp_codec_id id = GP_CODEC_AUTO;
    if (params->name && gp_codec_parse(params->name, &id) != GP_OK) return GP_ERR_INVALID;
    uint32_t chunk = params->chunk ? params->chunk : GP_CODEC_CHUNK_DEFAULT;
    if (chunk < GP_CODEC_CHUNK_MIN || chunk > GP_CODEC_CHUNK_MAX || (chunk & (chunk - 1)))
        return gp_error_set(GP_ERR_INVALID, "codec chunk of %u bytes: expected a power of two from %u to %u",
                            chunk, GP_CODEC_CHUNK_MIN, GP_CODEC_CHUNK_MAX);
    if (id == GP_CODEC_AUTO) id = gp_codec_auto(be, params->nvcomp);

    gp_codec *c = calloc(1, sizeof *c);
    if (!c) return gp_error_set(GP_ERR_NOMEM, "gp_codec_open: out of host memory");
    *c = (gp_codec){.be = be, .id = id, .chunk = chunk, .width = 1, .in_align = 1};
    gp_status st = GP_OK;
    switch (id) {
    case GP_CODEC_RAW:
        snprintf(c->desc, sizeof c->desc, "raw (%u KiB chunks)", chunk >> 10);
        break;
    case GP_CODEC_ZSTD:
        if (!gp_backend_is(be, "host"))
            st = gp_error_set(GP_ERR_INVALID, "codec zstd runs on the host backend only (this one is %s); "
                              "on a GPU use ans or bitcomp (nvCOMP), or auto", be->name);
        else
            st = gp_codec_zstd_init(c, params->elem_size);
        break;
    default: /* ANS, Bitcomp */
        if (!gp_backend_is(be, "cuda"))
            st = gp_error_set(GP_ERR_INVALID, "codec %s needs a CUDA device and nvCOMP (the backend is %s); "
                              "on the host backend use zstd or auto", gp_codec_id_name(id), be->name);
        else
            st = gp_codec_nvcomp_init(c, params->elem_size, params->nvcomp);
        break;
    }
    if (st != GP_OK) {
        free(c);
        return st;
    }
    *out = c;
    return GP_OK;
}

void gp_codec_close(gp_codec *c) { free(c); }

gp_codec_id gp_codec_kind(const gp_codec *c) { return c->id; }
const char *gp_codec_describe(const gp_codec *c) { return c->desc; }
uint32_t gp_codec_chunk_size(const gp_codec *c) { return c->chunk; }
uint64_t gp_codec_chunks(const gp_codec *c, uint64_t len) { return len / c->chunk + (len % c->chunk != 0); }

/* Length of chunk i of a slice of `len` bytes. */
static uint32_t gp_chunk_len(const gp_codec *c, uint64_t len, uint64_t i)
{
    uint64_t rest = len - i * c->chunk;
    return rest < c->chunk ? (uint32_t)rest : c->chunk;
}

/* Whether chunk i of the slice at `base` may be given to the compressor. */
static int gp_chunk_compressible(const gp_codec *c, uintptr_t base, uint64_t len, uint64_t i)
{
    return c->ops && (base + i * c->chunk) % c->in_align == 0 && gp_chunk_len(c, len, i) % c->width == 0;
}

/* --------------------------------------------------------------- the job */

/* Device staging: slots, as many bytes for the packed chunks, then temp
 * memory, then the arrays (for nvCOMP). */
static void gp_job_layout(const gp_codec *c, uint32_t m, uint64_t temp, uint64_t *temp_off,
                          uint64_t *arr_off, uint64_t *dev_bytes)
{
    *temp_off = gp_codec_round(gp_codec_round((uint64_t)m * c->slot, GP_CODEC_DEV_ALIGN) + (uint64_t)m * c->slot,
                               GP_CODEC_DEV_ALIGN);
    *arr_off = gp_codec_round(*temp_off + temp, GP_CODEC_DEV_ALIGN);
    *dev_bytes = *arr_off + (c->ops && c->ops->device_arrays ? GP_CODEC_ARRAY_BYTES(m) : 0);
}

gp_status gp_codec_job_need(const gp_codec *c, uint32_t max_chunks, uint64_t *dev_bytes, uint64_t *host_bytes)
{
    *dev_bytes = *host_bytes = 0;
    if (!c->ops) return GP_OK;
    if (max_chunks == 0 || max_chunks > GP_CODEC_MAX_BATCH)
        return gp_error_set(GP_ERR_INVALID, "codec %s: a job of %u chunks: expected 1 to %u", c->desc,
                            max_chunks, GP_CODEC_MAX_BATCH);
    uint64_t temp, temp_off, arr_off;
    gp_status st = c->ops->temp_bytes(c, max_chunks, &temp);
    if (st != GP_OK) return st;
    gp_job_layout(c, max_chunks, temp, &temp_off, &arr_off, dev_bytes);
    *host_bytes = GP_CODEC_ARRAY_BYTES(max_chunks);
    return GP_OK;
}

gp_status gp_codec_job_fit(const gp_codec *c, uint64_t dev_bytes, uint32_t *max_chunks)
{
    *max_chunks = 0;
    if (!c->ops) {
        *max_chunks = UINT32_MAX; /* raw needs no staging */
        return GP_OK;
    }
    uint64_t per = 2 * c->slot + (c->ops->device_arrays ? GP_CODEC_ARRAY_BYTES(1) : 0);
    uint64_t m = dev_bytes / per;
    if (m > GP_CODEC_MAX_BATCH) m = GP_CODEC_MAX_BATCH;
    /* Alignment and temp memory take a little more than m * per. */
    for (; m > 0; m = m * 15 / 16) {
        uint64_t need, host;
        gp_status st = gp_codec_job_need(c, (uint32_t)m, &need, &host);
        if (st != GP_OK) return st;
        if (need <= dev_bytes) {
            *max_chunks = (uint32_t)m;
            return GP_OK;
        }
    }
    uint64_t need1, host1;
    gp_status st = gp_codec_job_need(c, 1, &need1, &host1);
    if (st != GP_OK) return st;
    return gp_error_set(GP_ERR_INVALID, "codec %s: a staging of %llu bytes is too small: one chunk needs %llu "
                        "bytes of device memory (%llu for its compressed slot, the rest temp memory and arrays)",
                        c->desc, (unsigned long long)dev_bytes, (unsigned long long)need1,
                        (unsigned long long)c->slot);
}

static void gp_arrays_carve(gp_codec_arrays *a, char *b, uint32_t m)
{
    a->in = (const void **)(void *)b;
    a->out = (void **)(void *)(b + (uint64_t)m * sizeof(void *));
    a->in_len = (size_t *)(void *)(b + (uint64_t)m * 2 * sizeof(void *));
    a->out_cap = a->in_len + m;
    a->out_len = a->out_cap + m;
    a->status = (int32_t *)(void *)(a->out_len + m);
}

gp_status gp_codec_job_create(const gp_codec *c, uint32_t max_chunks, void *dev, uint64_t dev_bytes,
                              void *host, uint64_t host_bytes, gp_codec_job **out)
{
    *out = NULL;
    if (max_chunks == 0) return gp_error_set(GP_ERR_INVALID, "codec %s: a job of 0 chunks", c->desc);
    uint64_t need_dev = 0, need_host = 0, temp = 0, temp_off = 0, arr_off = 0;
    if (c->ops) {
        gp_status st = gp_codec_job_need(c, max_chunks, &need_dev, &need_host);
        if (st == GP_OK) st = c->ops->temp_bytes(c, max_chunks, &temp);
        if (st != GP_OK) return st;
        gp_job_layout(c, max_chunks, temp, &temp_off, &arr_off, &need_dev);
    }
    if (dev_bytes < need_dev || host_bytes < need_host || (need_dev && !dev) || (need_host && !host))
        return gp_error_set(GP_ERR_INVALID, "codec %s: a job of %u chunks needs %llu bytes of device staging and "
                            "%llu of host scratch; given %llu at %p and %llu at %p", c->desc, max_chunks,
                            (unsigned long long)need_dev, (unsigned long long)need_host,
                            (unsigned long long)dev_bytes, dev, (unsigned long long)host_bytes, host);
    if ((uintptr_t)dev % GP_CODEC_DEV_ALIGN || (uintptr_t)host % GP_CODEC_ALIGN)
        return gp_error_set(GP_ERR_INVALID, "codec %s: the device staging (%p) must be %u-byte aligned and the "
                            "host scratch (%p) %u-byte aligned", c->desc, dev, GP_CODEC_DEV_ALIGN, host,
                            GP_CODEC_ALIGN);
    gp_codec_job *j = calloc(1, sizeof *j);
    if (!j) return gp_error_set(GP_ERR_NOMEM, "codec %s: out of host memory for a job", c->desc);
    j->c = c;
    j->max_chunks = max_chunks;
    if (c->ops) {
        j->slots = dev;
        j->packed = (char *)dev + gp_codec_round((uint64_t)max_chunks * c->slot, GP_CODEC_DEV_ALIGN);
        j->temp = temp ? (char *)dev + temp_off : NULL;
        j->temp_bytes = temp;
        j->host_block = host;
        gp_arrays_carve(&j->host, host, max_chunks);
        if (c->ops->device_arrays) {
            j->dev_block = (char *)dev + arr_off;
            gp_arrays_carve(&j->dev, j->dev_block, max_chunks);
        }
        j->idx = malloc((size_t)max_chunks * sizeof *j->idx);
        gp_status st = j->idx ? GP_OK : gp_error_set(GP_ERR_NOMEM, "codec %s: out of host memory for a job", c->desc);
        if (st == GP_OK && c->ops->job_init) st = c->ops->job_init(j);
        if (st != GP_OK) {
            free(j->idx);
            free(j);
            return st;
        }
    }
    *out = j;
    return GP_OK;
}

void gp_codec_job_destroy(gp_codec_job *j)
{
    if (!j) return;
    if (j->c->ops && j->c->ops->job_fini) j->c->ops->job_fini(j);
    free(j->idx);
    free(j);
}

uint64_t gp_codec_job_max_slice(const gp_codec_job *j) { return (uint64_t)j->max_chunks * j->c->chunk; }

static char *gp_job_slot(const gp_codec_job *j, uint32_t b) { return j->slots + (uint64_t)b * j->c->slot; }

/* `limit`: the slice must fit in the job (a trial takes any). */
static gp_status gp_job_start(gp_codec_job *j, const void *at, uint64_t len, const char *what, int limit)
{
    if (j->state != GP_JOB_IDLE)
        return gp_error_set(GP_ERR_INVALID, "codec %s: %s while the job's %s is not finished", j->c->desc, what,
                            j->state == GP_JOB_COMPRESSING ? "compression" : "decompression");
    if (!at || len == 0 || (limit && len > gp_codec_job_max_slice(j)))
        return gp_error_set(GP_ERR_INVALID, "codec %s: %s of %llu bytes at %p: expected a slice of 1 to %llu bytes",
                            j->c->desc, what, (unsigned long long)len, at,
                            (unsigned long long)gp_codec_job_max_slice(j));
    j->base = (uintptr_t)at;
    j->len = len;
    j->k = 0;
    return GP_OK;
}

/* Entry b of the batch: chunk i, from `in` (n bytes) to `out` (cap bytes). */
static void gp_batch_set(gp_codec_job *j, uint32_t b, uint32_t i, const void *in, size_t n, void *out, size_t cap)
{
    j->idx[b] = i;
    j->host.in[b] = in;
    j->host.in_len[b] = n;
    j->host.out[b] = out;
    j->host.out_cap[b] = cap;
    j->host.out_len[b] = 0;
    j->host.status[b] = -1;
}

/* ------------------------------------------------------------- offload */

gp_status gp_codec_compress(gp_codec_job *j, gp_stream stream, const void *src, uint64_t len, int raw)
{
    gp_status st = gp_job_start(j, src, len, "compress", 1);
    if (st != GP_OK) return st;
    const gp_codec *c = j->c;
    j->raw_all = raw || !c->ops;
    if (!j->raw_all) {
        uint64_t n = gp_codec_chunks(c, len);
        for (uint64_t i = 0; i < n; i++) {
            if (!gp_chunk_compressible(c, j->base, len, i)) continue;
            uint32_t b = j->k++;
            gp_batch_set(j, b, (uint32_t)i, (const char *)src + i * c->chunk, gp_chunk_len(c, len, i),
                         gp_job_slot(j, b), c->slot);
        }
        if (j->k) st = c->ops->compress(j, stream, j->k);
        /* The compressed chunks back to back, where they are: one copy takes
         * them to the host (one per chunk cost a copy's fixed time each). */
        const gp_codec_arrays *a = c->ops->device_arrays ? &j->dev : &j->host;
        if (st == GP_OK && j->k)
            st = c->be->gather(c->be, j->packed, (const void *const *)a->out, a->out_len, j->k, GP_CODEC_ALIGN,
                               c->slot, stream);
        if (st != GP_OK) return st;
    }
    j->gathered = !j->raw_all && j->k;
    j->state = GP_JOB_COMPRESSING;
    return GP_OK;
}

/* Whether entry b of a finished compression batch came out whole. */
static int gp_batch_ok(const gp_codec_job *j, uint32_t b)
{
    size_t got = j->host.out_len[b];
    return j->host.status[b] == 0 && got > 0 && got <= j->host.out_cap[b];
}

/* Whether it is worth storing. */
static int gp_batch_pays(const gp_codec_job *j, uint32_t b)
{
    return gp_batch_ok(j, b) && (double)j->host.out_len[b] * GP_CODEC_MIN_RATIO <= (double)j->host.in_len[b];
}

gp_status gp_codec_compress_result(gp_codec_job *j, gp_codec_chunk *chunks, uint64_t n, uint64_t *stored)
{
    const gp_codec *c = j->c;
    if (j->state != GP_JOB_COMPRESSING)
        return gp_error_set(GP_ERR_INVALID, "codec %s: compress_result without a compression", c->desc);
    uint64_t want = gp_codec_chunks(c, j->len);
    if (n != want)
        return gp_error_set(GP_ERR_INVALID, "codec %s: compress_result for %llu chunks; the slice of %llu bytes "
                            "has %llu", c->desc, (unsigned long long)n, (unsigned long long)j->len,
                            (unsigned long long)want);
    for (uint64_t i = 0; i < n; i++) {
        uint32_t len = gp_chunk_len(c, j->len, i);
        chunks[i] = (gp_codec_chunk){.data = (const char *)j->base + i * c->chunk, .len = len, .stored = len, .raw = 1};
    }
    /* Gathered: the batch's chunks lie back to back in `packed`, each where
     * the gather put it, those that pay taken from there (one that does
     * not stays raw: the host never holds more than the raw bytes).  A
     * chunk the compressor failed on breaks the packing (the gather counted
     * what it left): then each chunk from its own slot. */
    int packed = j->gathered;
    for (uint32_t b = 0; b < j->k && packed; b++)
        packed = gp_batch_ok(j, b);
    uint64_t off = 0;
    for (uint32_t b = 0; b < j->k; b++) {
        uint64_t at = off;
        if (packed) off += gp_codec_pad(j->host.out_len[b]);
        if (!gp_batch_pays(j, b)) continue;
        chunks[j->idx[b]] = (gp_codec_chunk){.data = packed ? j->packed + at : j->host.out[b],
                                             .len = (uint32_t)j->host.in_len[b],
                                             .stored = (uint32_t)j->host.out_len[b]};
    }
    uint64_t total = 0;
    for (uint64_t i = 0; i < n; i++) total += gp_codec_pad(chunks[i].stored);
    *stored = total;
    j->state = GP_JOB_IDLE;
    return GP_OK;
}

gp_status gp_codec_trial(gp_codec_job *j, gp_stream stream, const void *src, uint64_t len, double *ratio,
                         int *worth)
{
    *ratio = 1.0;
    *worth = 0;
    gp_status st = gp_job_start(j, src, len, "trial", 0);
    const gp_codec *c = j->c;
    if (st != GP_OK || !gp_chunk_compressible(c, j->base, len, 0)) return st;
    gp_batch_set(j, 0, 0, src, gp_chunk_len(c, len, 0), gp_job_slot(j, 0), c->slot);
    st = c->ops->compress(j, stream, 1);
    uint64_t ev = 0;
    if (st == GP_OK) st = c->be->event_record(c->be, stream, &ev);
    if (st == GP_OK) {
        st = c->be->event_wait(c->be, ev);
        c->be->event_release(c->be, ev);
    }
    if (st != GP_OK) return st;
    if (gp_batch_ok(j, 0)) {
        *ratio = (double)j->host.in_len[0] / (double)j->host.out_len[0];
        *worth = *ratio >= GP_CODEC_MIN_RATIO;
    }
    return GP_OK;
}

/* ------------------------------------------------------------- restore */

/* Whether the table could have come from compressing a slice at dst. */
static gp_status gp_table_check(const gp_codec_job *j, uintptr_t dst, uint64_t len, const gp_codec_chunk *chunks,
                                uint64_t n)
{
    const gp_codec *c = j->c;
    uint64_t want = gp_codec_chunks(c, len), packed = 0;
    if (n != want)
        return gp_error_set(GP_ERR_INVALID, "codec %s: decompress of %llu bytes with %llu chunks: expected %llu",
                            c->desc, (unsigned long long)len, (unsigned long long)n, (unsigned long long)want);
    for (uint64_t i = 0; i < n; i++) {
        const gp_codec_chunk *k = &chunks[i];
        uint32_t clen = gp_chunk_len(c, len, i);
        const char *why = NULL;
        if (!k->data) why = "no data";
        else if (k->len != clen) why = "wrong length";
        else if (k->raw && k->stored != clen) why = "raw but stored size differs from length";
        else if (!k->raw && !gp_chunk_compressible(c, dst, len, i)) why = "compressed but this codec cannot have "
                                                                          "compressed it here";
        else if (!k->raw && (k->stored == 0 || k->stored > c->slot)) why = "compressed size out of range";
        else if (!k->raw && ++packed > j->max_chunks) why = "more compressed chunks than the job's staging holds";
        if (why)
            return gp_error_set(GP_ERR_INVALID, "codec %s: chunk %llu of %llu (len %u, stored %u, %s): %s; the "
                                "slice is %llu bytes at %p", c->desc, (unsigned long long)i, (unsigned long long)n,
                                k->len, k->stored, k->raw ? "raw" : "compressed", why, (unsigned long long)len,
                                (void *)dst);
    }
    return GP_OK;
}

gp_status gp_codec_decompress(gp_codec_job *j, gp_stream stream, void *dst, uint64_t len,
                              const gp_codec_chunk *chunks, uint64_t n)
{
    gp_status st = gp_job_start(j, dst, len, "decompress", 1);
    if (st == GP_OK) st = gp_table_check(j, (uintptr_t)dst, len, chunks, n);
    if (st != GP_OK) return st;
    const gp_codec *c = j->c;
    gp_backend *be = c->be;
    /* Compressed chunks stored back to back on the host (each padded to
     * GP_CODEC_ALIGN) go up in one copy, into `packed`; raw ones straight
     * to their place, a run of them in one copy too. */
    const char *run = NULL;     /* host start of the run of compressed chunks */
    uint64_t run_at = 0;        /* where it goes in `packed`                  */
    uint64_t run_len = 0;       /* its bytes so far                           */
    for (uint64_t i = 0; i < n && st == GP_OK;) {
        char *to = (char *)dst + i * c->chunk;
        const char *h = chunks[i].data;
        if (chunks[i].raw) {
            uint64_t bytes = chunks[i].len, e = i + 1;
            while (e < n && chunks[e].raw && (const char *)chunks[e].data == h + bytes) bytes += chunks[e++].len;
            st = be->copy(be, to, h, bytes, GP_COPY_H2D, stream);
            i = e;
            continue;
        }
        if (!run || h != run + gp_codec_pad(run_len)) {
            if (run) st = be->copy(be, j->packed + run_at, run, run_len, GP_COPY_H2D, stream);
            run_at += gp_codec_pad(run_len);
            run = h;
            run_len = 0;
        }
        uint32_t b = j->k++;
        gp_batch_set(j, b, (uint32_t)i, j->packed + run_at + (uint64_t)(h - run), chunks[i].stored, to,
                     chunks[i].len);
        run_len = (uint64_t)(h - run) + chunks[i].stored;
        i++;
    }
    if (st == GP_OK && run) st = be->copy(be, j->packed + run_at, run, run_len, GP_COPY_H2D, stream);
    if (st == GP_OK && j->k) st = c->ops->decompress(j, stream, j->k);
    if (st != GP_OK) return st;
    j->state = GP_JOB_DECOMPRESSING;
    return GP_OK;
}

void gp_codec_job_abandon(gp_codec_job *j) { j->state = GP_JOB_IDLE; }

gp_status gp_codec_decompress_check(gp_codec_job *j)
{
    const gp_codec *c = j->c;
    if (j->state != GP_JOB_DECOMPRESSING)
        return gp_error_set(GP_ERR_INVALID, "codec %s: decompress_check without a decompression", c->desc);
    j->state = GP_JOB_IDLE;
    for (uint32_t b = 0; b < j->k; b++) {
        int32_t s = j->host.status[b];
        if (s == 0 && j->host.out_len[b] == j->host.out_cap[b]) continue;
        char got[64] = "";
        if (s == 0) snprintf(got, sizeof got, "%zu bytes came out", j->host.out_len[b]);
        return gp_error_set(GP_ERR_BACKEND, "codec %s: chunk %u of the slice at %p (%zu bytes stored, %zu "
                            "expected back) did not decompress: %s", c->desc, j->idx[b], (void *)j->base,
                            j->host.in_len[b], j->host.out_cap[b], s ? c->ops->status_text(c, s) : got);
    }
    return GP_OK;
}
