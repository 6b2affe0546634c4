/*
 * codec_impl.h -- what codec.c shares with the implementations of a codec
 * (codec_zstd.c, codec_nvcomp.c): the codec and job structs, and the batch
 * every implementation works on.
 *
 * codec.c does everything that does not depend on the compressor: chunk
 * geometry, which chunks may be compressed, the staging's layout, the raw
 * fallback, the checks of a chunk table, and the copies of stored chunks
 * to the device on restore.  An implementation compresses or decompresses
 * one batch: entries [0, k) of the job's arrays, which name a source, its
 * length, a destination and its capacity, and receive a length and a
 * status.  The arrays are laid out as nvCOMP's batched API takes them, in
 * one block whose first part the caller fills (copied to the device in one
 * piece) and whose last part the compressor writes (copied back in one).
 */
#ifndef GP_CODEC_IMPL_H
#define GP_CODEC_IMPL_H

#include "codec.h"

/* Array block of m entries: in[m], out[m] (pointers), in_len[m],
 * out_cap[m] (sizes) -- the upload part -- then out_len[m] (sizes),
 * status[m] (int32) -- the download part. */
typedef struct gp_codec_arrays {
    const void **in;
    void **out;
    size_t *in_len, *out_cap, *out_len;
    int32_t *status;
} gp_codec_arrays;

#define GP_CODEC_UPLOAD_BYTES(m) ((uint64_t)(m) * (2 * sizeof(void *) + 2 * sizeof(size_t)))
#define GP_CODEC_DOWNLOAD_BYTES(m) ((uint64_t)(m) * (sizeof(size_t) + sizeof(int32_t)))
#define GP_CODEC_ARRAY_BYTES(m) gp_codec_pad(GP_CODEC_UPLOAD_BYTES(m) + GP_CODEC_DOWNLOAD_BYTES(m))

typedef struct gp_codec_ops {
    /* Bytes of device temp memory a batch of up to max_chunks needs. */
    gp_status (*temp_bytes)(const gp_codec *c, uint32_t max_chunks, uint64_t *temp);
    /* Per-job state of the implementation (may be NULL: none). */
    gp_status (*job_init)(gp_codec_job *j);
    void (*job_fini)(gp_codec_job *j);
    /* Queue (or run, on the host) the batch [0, k) of the job's arrays. */
    gp_status (*compress)(gp_codec_job *j, gp_stream stream, uint32_t k);
    gp_status (*decompress)(gp_codec_job *j, gp_stream stream, uint32_t k);
    /* Words for a non-zero status of the batch. */
    const char *(*status_text)(const gp_codec *c, int32_t status);
    /* The arrays live on the device too (nvCOMP); else only on the host. */
    int device_arrays;
} gp_codec_ops;

struct gp_codec {
    gp_backend *be;
    gp_codec_id id;          /* never AUTO: what "auto" resolved to      */
    const gp_codec_ops *ops; /* NULL for raw                             */
    uint32_t chunk;          /* bytes per chunk                          */
    uint32_t width;          /* bytes per element the compressor takes:
                                a compressed chunk's length is a multiple */
    uint32_t in_align;       /* alignment of a compressed chunk's source
                                (and destination, on restore)             */
    uint64_t slot;           /* staging bytes per compressed chunk:
                                its largest compressed size, padded        */
    char desc[96];           /* gp_codec_describe                        */
};

enum { GP_JOB_IDLE = 0, GP_JOB_COMPRESSING, GP_JOB_DECOMPRESSING };

struct gp_codec_job {
    const gp_codec *c;
    uint32_t max_chunks;
    char *slots;              /* device staging: max_chunks * slot bytes */
    char *packed;             /* as many: the stored chunks back to back
                                 (compress: gathered from the slots;
                                 decompress: copied up in runs)          */
    int gathered;             /* compress: the batch went to `packed`   */
    void *temp;               /* device temp memory (NULL if none)      */
    uint64_t temp_bytes;
    gp_codec_arrays host;     /* in the host scratch                    */
    gp_codec_arrays dev;      /* in the device staging (device_arrays)  */
    void *host_block, *dev_block;
    uint32_t *idx;            /* batch entry -> chunk index             */
    int state;
    int raw_all;              /* compress: every chunk raw              */
    uintptr_t base;           /* the slice being worked on              */
    uint64_t len;
    uint32_t k;               /* entries in the batch                   */
    void *impl;               /* the implementation's per-job state     */
};

/* Implementations: fill c's fields (desc, width, in_align, slot, ops) for
 * the codec `c->id`, with `elem_size` the caller's hint. */
gp_status gp_codec_zstd_init(gp_codec *c, unsigned elem_size);
gp_status gp_codec_nvcomp_init(gp_codec *c, unsigned elem_size, const char *nvcomp_path);
/* Whether the build has the host codec (libzstd). */
int gp_codec_zstd_available(void);

#endif /* GP_CODEC_IMPL_H */
