/*
 * codec.h -- compression of offloaded memory, behind one interface, for
 * offload.c only.
 *
 * Offload moves a slice of device memory to pinned host memory in chunks
 * (GP_CODEC_CHUNK_DEFAULT, 512 KiB), each compressed on its own on the
 * device, and brings it back.  Two implementations sit behind this header:
 * nvCOMP on a CUDA device (codec_nvcomp.c: ANS, Bitcomp; the library is
 * loaded with dlopen) and libzstd on byte planes on the host backend
 * (codec_zstd.c), so that the whole offload path runs in CI.  "raw" stores
 * every chunk as it is.
 *
 * The flow of one slice, for a job (below) used by one stream at a time:
 *
 *   offload   gp_codec_trial        (optional) compress the first chunk
 *                                    now; tells whether compressing pays
 *             gp_codec_compress     queue the compression of every chunk
 *                                    into the job's device staging
 *             ... the caller waits until the stream has run it (an event)
 *             gp_codec_compress_result
 *                                    per chunk: where its stored bytes are
 *                                    on the device and how many; the caller
 *                                    copies them to host memory, each at a
 *                                    GP_CODEC_ALIGN-aligned place, and keeps
 *                                    the gp_codec_chunk table
 *   restore   gp_codec_decompress   from that table (data = the host
 *                                    copies): queue the copies to the device
 *                                    and the decompression into `dst`
 *             ... the caller waits until the stream has run it
 *             gp_codec_decompress_check
 *                                    whether every chunk came back whole
 *
 * On the host backend the work runs at once, inside the calls (as the host
 * backend's copies do).  A chunk is stored raw when compressing it does not
 * shrink it to 1/GP_CODEC_MIN_RATIO, when its length is not a multiple of
 * the codec's element width, or when its address is not aligned as the
 * compressor needs: raw chunks are copied straight from and to the slice,
 * never through the staging.  The codecs reject malformed input with an
 * error, but a corrupted compressed chunk can still decompress to wrong
 * bytes: offload.c checksums the uncompressed bytes on the device before
 * compression and after decompression (checksum.h).
 *
 * Errors: every call returns a gp_status and leaves a message naming the
 * codec, the chunk and the sizes involved (error.h); nothing aborts.
 */
#ifndef GP_CODEC_H
#define GP_CODEC_H

#include <strings.h>

#include "backend.h"

typedef struct gp_codec gp_codec;
typedef struct gp_codec_job gp_codec_job;

/* The codecs, one list: id, name. */
#define GP_CODECS(X)                                                                     \
    X(GP_CODEC_RAW, "raw")         /* no compression (0: what zeroed options mean)    */ \
    X(GP_CODEC_AUTO, "auto")       /* by backend and element size, see gp_codec_open */ \
    X(GP_CODEC_ZSTD, "zstd")       /* host backend: byte planes + zstd level 1       */ \
    X(GP_CODEC_ANS, "ans")         /* CUDA + nvCOMP: rANS with a data type            */ \
    X(GP_CODEC_BITCOMP, "bitcomp") /* CUDA + nvCOMP: Bitcomp, lossless               */

#define GP_CODEC_ID(id, name) id,
typedef enum gp_codec_id { GP_CODECS(GP_CODEC_ID) GP_CODEC_COUNT } gp_codec_id;
#undef GP_CODEC_ID

/* "one of: raw auto zstd ans bitcomp", from the list, for messages and
 * option tables. */
#define GP_CODEC_NAME_ITEM(id, name) " " name
#define GP_CODEC_NAMES_TEXT ("one of:" GP_CODECS(GP_CODEC_NAME_ITEM))

/* Here, not in codec.c, so that config.c needs nothing of the codecs. */
#define GP_CODEC_NAME(id, name) name,
static const char *const gp_codec_names[GP_CODEC_COUNT] = {GP_CODECS(GP_CODEC_NAME)};
#undef GP_CODEC_NAME

static inline const char *gp_codec_id_name(gp_codec_id id)
{
    return (unsigned)id < GP_CODEC_COUNT ? gp_codec_names[id] : "?";
}

/* The id of a codec name (case-insensitive); GP_ERR_INVALID with a message
 * listing the names otherwise. */
static inline gp_status gp_codec_parse(const char *name, gp_codec_id *out)
{
    for (int i = 0; name && i < GP_CODEC_COUNT; i++)
        if (strcasecmp(name, gp_codec_names[i]) == 0) {
            *out = (gp_codec_id)i;
            return GP_OK;
        }
    return gp_error_set(GP_ERR_INVALID, "codec \"%s\" is not known: expected %s", name ? name : "(null)",
                        GP_CODEC_NAMES_TEXT);
}

#define GP_CODEC_CHUNK_DEFAULT (512u * 1024u)
#define GP_CODEC_CHUNK_MIN (4u * 1024u)
#define GP_CODEC_CHUNK_MAX (16u * 1024u * 1024u) /* nvCOMP's ANS and Bitcomp limit */
/* Where each stored chunk must start in host memory and in the staging:
 * nvCOMP's ANS faults on compressed input that is not 16-byte aligned. */
#define GP_CODEC_ALIGN 16u
/* A chunk (and a trial) that compresses to more than 1/1.07 of its size is
 * stored raw: the saved copy time would not pay for the codec's. */
#define GP_CODEC_MIN_RATIO 1.07

static inline uint64_t gp_codec_pad(uint64_t n) { return (n + GP_CODEC_ALIGN - 1) & ~(uint64_t)(GP_CODEC_ALIGN - 1); }

/* What gp_codec_open needs. */
typedef struct gp_codec_params {
    const char *name;     /* a GP_CODECS name; NULL means "auto"              */
    unsigned elem_size;   /* bytes per element of the data (the dtype hint:
                             2 for bf16/fp16, 4 for fp32); 0 if unknown       */
    uint32_t chunk;       /* 0 for GP_CODEC_CHUNK_DEFAULT; else a power of two
                             in [GP_CODEC_CHUNK_MIN, GP_CODEC_CHUNK_MAX]      */
    const char *nvcomp;   /* GPUPOOL_NVCOMP: where to load nvCOMP from first;
                             NULL or "" to search (gp_nvcomp_load)            */
} gp_codec_params;

/* A codec for one backend, one element size and one chunk size: immutable,
 * usable by several jobs and threads at once; it must outlive its jobs and
 * every table of chunks it made (restore uses the same codec).
 *
 * "auto" is zstd on the host backend (raw when built without libzstd);
 * on a CUDA device with nvCOMP: ANS with the FLOAT16 data type for 2-byte
 * elements, FLOAT32 for 4-byte ones, bytes (CHAR) otherwise; on a CUDA
 * device without nvCOMP: raw.  A codec named explicitly that cannot run
 * here (zstd on a GPU, ans without nvCOMP or on the host backend) is an
 * error that says why. */
gp_status gp_codec_open(gp_backend *be, const gp_codec_params *params, gp_codec **out);
void gp_codec_close(gp_codec *c);

gp_codec_id gp_codec_kind(const gp_codec *c);
/* What it does, e.g. "ans (float16, 512 KiB chunks)", "raw". */
const char *gp_codec_describe(const gp_codec *c);
uint32_t gp_codec_chunk_size(const gp_codec *c);
/* Chunks in a slice of `len` bytes: ceil(len / chunk). */
uint64_t gp_codec_chunks(const gp_codec *c, uint64_t len);

/* One chunk of a slice: chunk i covers bytes [i*chunk, min(len, (i+1)*chunk)). */
typedef struct gp_codec_chunk {
    const void *data;  /* compress_result: where the stored bytes are on the
                          device (a staging slot, or the slice itself for a
                          raw chunk), valid until the job's next use;
                          decompress: where the caller keeps them on the host */
    uint32_t len;      /* uncompressed bytes                                 */
    uint32_t stored;   /* bytes stored: the compressed size, or len when raw */
    uint32_t raw;      /* 1 when stored as is                                */
    uint32_t reserved; /* 0                                                   */
} gp_codec_chunk;

/* A job: the working state of one slice at a time, for one stream at a time.
 * Its memory is the caller's (offload.c takes the staging from the pool, so
 * that the device budget stays in one place):
 *   device staging  the compressed chunks, and for nvCOMP the device arrays
 *                   of pointers and sizes of the batch (and temp memory,
 *                   none for ANS and Bitcomp);
 *   host scratch    pinned (gp_backend.host_alloc) when the backend is a
 *                   GPU: the arrays' host side, copied in one piece each way.
 * gp_codec_job_fit gives the most chunks a staging of a given size takes,
 * gp_codec_job_need the exact sizes for that many (both 0 for raw).
 * A codec whose temp memory would not fit in the staging is refused here,
 * with a message giving both sizes. */
gp_status gp_codec_job_fit(const gp_codec *c, uint64_t dev_bytes, uint32_t *max_chunks);
gp_status gp_codec_job_need(const gp_codec *c, uint32_t max_chunks, uint64_t *dev_bytes, uint64_t *host_bytes);
gp_status gp_codec_job_create(const gp_codec *c, uint32_t max_chunks, void *dev, uint64_t dev_bytes,
                              void *host, uint64_t host_bytes, gp_codec_job **out);
/* The caller must have waited for the job's last queued work. */
void gp_codec_job_destroy(gp_codec_job *j);
/* The largest slice the job takes: max_chunks * chunk. */
uint64_t gp_codec_job_max_slice(const gp_codec_job *j);

/* Compress the first chunk of [src, src+len) and wait for it (a host wait on
 * `stream`); *ratio = its length / its compressed size (1.0 for raw, for a
 * chunk that cannot be compressed, or if compressing fails: then storing
 * raw is the answer), *worth = ratio >= GP_CODEC_MIN_RATIO.  The job must
 * be idle and stays so. */
gp_status gp_codec_trial(gp_codec_job *j, gp_stream stream, const void *src, uint64_t len,
                         double *ratio, int *worth);

/* Queue the compression of [src, src+len) (len <= gp_codec_job_max_slice)
 * on `stream`; `raw` = 1 stores every chunk raw (what a trial that says
 * not worth it should lead to).  The source must stay mapped and unchanged
 * until the caller has copied every chunk out. */
gp_status gp_codec_compress(gp_codec_job *j, gp_stream stream, const void *src, uint64_t len, int raw);
/* After the stream has run the compression: fill chunks[0..n) (n =
 * gp_codec_chunks(len)), and *stored = the host bytes they need, each
 * chunk padded to GP_CODEC_ALIGN.  The job is then idle; the staging slots
 * that chunks[].data point at stay valid until its next use. */
gp_status gp_codec_compress_result(gp_codec_job *j, gp_codec_chunk *chunks, uint64_t n, uint64_t *stored);

/* Drop what the job was doing (a compression whose result is not wanted:
 * an offload that failed half way); the caller has waited for its stream.
 * The job is then idle. */
void gp_codec_job_abandon(gp_codec_job *j);

/* Queue on `stream` the copies of the stored chunks (chunks[].data: host
 * memory, pinned on a GPU, GP_CODEC_ALIGN-aligned) to the device and the
 * decompression into [dst, dst+len), whose chunks must be laid out as the
 * table says (the table is checked first: lengths, stored sizes within the
 * staging's slots, raw chunks stored whole; a table that does not fit is
 * GP_ERR_INVALID before anything is queued).  The host memory must stay
 * until the stream has run it. */
gp_status gp_codec_decompress(gp_codec_job *j, gp_stream stream, void *dst, uint64_t len,
                              const gp_codec_chunk *chunks, uint64_t n);
/* After the stream has run the decompression: GP_OK when every chunk
 * decompressed to exactly its length; otherwise GP_ERR_BACKEND (as for a
 * checksum mismatch: the stored data is bad) naming the first bad chunk and
 * what the decompressor said; GP_ERR_INVALID without a decompression under
 * way.  The job is then idle. */
gp_status gp_codec_decompress_check(gp_codec_job *j);

/* nvCOMP (codec_nvcomp.c), loaded once per process with dlopen, from the
 * first of: `path` (GPUPOOL_NVCOMP: the library or the folder holding it;
 * when set, nothing else is tried), the folders given to
 * gp_nvcomp_search_dir (the Python package gives the installed
 * nvidia-libnvcomp-cu13 wheel's lib64), then the system's libnvcomp.so.6.
 * Its major version must be 6.  A failure leaves a message that names
 * every place tried and how to install it; it is remembered, so later
 * calls with the same path fail at once. */
gp_status gp_nvcomp_load(const char *path);
/* Add a folder to search for libnvcomp.so.6 (copied; at most 8). */
gp_status gp_nvcomp_search_dir(const char *dir);
/* The file nvCOMP was loaded from and its version (e.g. 6000), or NULL. */
const char *gp_nvcomp_loaded(unsigned *version);

#endif /* GP_CODEC_H */
