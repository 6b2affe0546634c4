/*
 * codec_nvcomp.c -- the codecs of a CUDA device (codec.h): NVIDIA's nvCOMP 6,
 * batched low-level API, ANS and Bitcomp (lossless), loaded with dlopen.
 *
 * nvCOMP is optional (`pip install nvidia-libnvcomp-cu13`, the nvcomp extra, brings the
 * nvidia-libnvcomp-cu13 wheel): nothing links against it, and its license
 * does not let us copy its headers, so the few types and functions used
 * are declared below, from the documentation in those headers (nvCOMP 6.0:
 * nvcomp/shared_types.h, nvcomp/ans.h, nvcomp/bitcomp.h, nvcomp.h).  The
 * option structs are passed by value and have 64 bytes each, reserved
 * bytes zeroed; tests/test_codec.py checks these declarations against the
 * headers where the wheel is installed.  nvCOMP carries its own CUDA
 * runtime; its cudaStream_t is the driver's CUstream (gp_stream here), and
 * it works on the calling thread's current context, hence
 * gp_backend.in_context around every call that launches work.
 *
 * ANS and Bitcomp need no temp memory (nvCOMP 6.0 answers 0); it is asked
 * for anyway and placed in the job's staging.  nvCOMP's zstd and deflate
 * need about 1 GiB of temp per 256 MiB and are not offered.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codec_impl.h"

/* ------------------------------------------------ nvCOMP 6, as declared */

typedef int gp_nv_status; /* nvcompStatus_t; 0 is nvcompSuccess */

/* nvcompType_t values */
enum { GP_NV_CHAR = 0, GP_NV_UCHAR = 1, GP_NV_FLOAT16 = 10, GP_NV_FLOAT32 = 11, GP_NV_FLOAT64 = 12 };

typedef struct gp_nv_properties { /* nvcompProperties_t */
    uint32_t version;             /* major * 1000 + minor * 100 + patch */
    uint32_t cudart_version;
} gp_nv_properties;

typedef struct gp_nv_alignments { /* nvcompAlignmentRequirements_t */
    size_t input, output, temp;
} gp_nv_alignments;

typedef struct gp_nv_ans_copts { /* nvcompBatchedANSCompressOpts_t */
    int type;                    /* nvcompANSType_t: 0 is rANS */
    int data_type;
    uint8_t max_sub_chunk_count, states_per_lane, histogram_reduction_log2;
    char reserved[53];
} gp_nv_ans_copts;

typedef struct gp_nv_ans_dopts { /* nvcompBatchedANSDecompressOpts_t */
    int backend;                 /* nvcompDecompressBackend_t: 0 is default */
    int data_type;
    uint8_t max_sub_chunk_count, states_per_lane, skip_validate;
    char reserved[53];
} gp_nv_ans_dopts;

typedef struct gp_nv_bitcomp_copts { /* nvcompBatchedBitcompCompressOpts_t */
    int algorithm;                   /* 0: default */
    int data_type;
    double delta;                    /* lossy only */
    int mode;                        /* bitcompMode_t: 0 is lossless */
    char reserved[44];
} gp_nv_bitcomp_copts;

typedef struct gp_nv_bitcomp_dopts { /* nvcompBatchedBitcompDecompressOpts_t */
    int backend;
    char reserved[60];
} gp_nv_bitcomp_dopts;

_Static_assert(sizeof(gp_nv_ans_copts) == 64 && sizeof(gp_nv_ans_dopts) == 64 &&
                   sizeof(gp_nv_bitcomp_copts) == 64 && sizeof(gp_nv_bitcomp_dopts) == 64,
               "nvCOMP 6's option structs are 64 bytes");

/* The functions of one algorithm (a = our name, A = nvCOMP's), all of the
 * same shapes: nvcompBatched<A>CompressGetRequiredAlignments, ... */
#define GP_NV_ALGOS(X) X(ans, ANS) X(bitcomp, Bitcomp)

#define GP_NV_API(a, A)                                                                                   \
    typedef struct gp_nv_##a##_api {                                                                    \
        gp_nv_status (*c_align)(gp_nv_##a##_copts, gp_nv_alignments *);                                 \
        gp_nv_status (*d_align)(gp_nv_##a##_dopts, gp_nv_alignments *);                                 \
        gp_nv_status (*c_temp)(size_t n, size_t max_chunk, gp_nv_##a##_copts, size_t *temp,             \
                               size_t max_total, void *stream);                                         \
        gp_nv_status (*d_temp)(size_t n, size_t max_chunk, gp_nv_##a##_dopts, size_t *temp,             \
                               size_t max_total, void *stream);                                         \
        gp_nv_status (*c_max)(size_t max_chunk, gp_nv_##a##_copts, size_t *max_out);                    \
        gp_nv_status (*compress)(const void *const *in, const size_t *in_len, size_t max_chunk,         \
                                 size_t n, void *temp, size_t temp_bytes, void *const *out,             \
                                 size_t *out_len, gp_nv_##a##_copts, gp_nv_status *status,              \
                                 void *stream);                                                         \
        gp_nv_status (*decompress)(const void *const *in, const size_t *in_len, const size_t *out_cap,  \
                                   size_t *out_len, size_t n, void *temp, size_t temp_bytes,            \
                                   void *const *out, gp_nv_##a##_dopts, gp_nv_status *status,           \
                                   void *stream);                                                       \
    } gp_nv_##a##_api;
GP_NV_ALGOS(GP_NV_API)
#undef GP_NV_API

#define GP_NV_SYMBOLS(a, A)                                                                               \
    {offsetof(gp_nv_lib, a.c_align), "nvcompBatched" #A "CompressGetRequiredAlignments"},               \
    {offsetof(gp_nv_lib, a.d_align), "nvcompBatched" #A "DecompressGetRequiredAlignments"},         \
    {offsetof(gp_nv_lib, a.c_temp), "nvcompBatched" #A "CompressGetTempSize"},                      \
    {offsetof(gp_nv_lib, a.d_temp), "nvcompBatched" #A "DecompressGetTempSize"},                    \
    {offsetof(gp_nv_lib, a.c_max), "nvcompBatched" #A "CompressGetMaxOutputChunkSize"},             \
    {offsetof(gp_nv_lib, a.compress), "nvcompBatched" #A "CompressAsync"},                          \
    {offsetof(gp_nv_lib, a.decompress), "nvcompBatched" #A "DecompressAsync"},

#define GP_NV_MEMBER(a, A) gp_nv_##a##_api a;
typedef struct gp_nv_lib {
    gp_nv_status (*get_properties)(gp_nv_properties *);
    const char *(*status_string)(gp_nv_status);
    GP_NV_ALGOS(GP_NV_MEMBER)
} gp_nv_lib;
#undef GP_NV_MEMBER

static const struct {
    size_t off;
    const char *name;
} gp_nv_symbols[] = {
    {offsetof(gp_nv_lib, get_properties), "nvcompGetProperties"},
    {offsetof(gp_nv_lib, status_string), "nvcompGetStatusString"},
    GP_NV_ALGOS(GP_NV_SYMBOLS)
};
#undef GP_NV_SYMBOLS

/* ------------------------------------------------------------ the loader */

#define GP_NV_SONAME "libnvcomp.so.6"
#define GP_NV_MAJOR 6
#define GP_NV_MAX_DIRS 8
#define GP_NV_NOTES 1536 /* what the search found, inside the message */

static struct {
    pthread_mutex_t lock;
    void *handle;
    gp_nv_lib api;
    unsigned version;
    char *path;                    /* where it was loaded from             */
    char *failed_for;              /* the path argument of a failed search */
    char why[2048];                /* and what it found                    */
    char *dirs[GP_NV_MAX_DIRS];
    int n_dirs;
} gp_nv = {.lock = PTHREAD_MUTEX_INITIALIZER};

gp_status gp_nvcomp_search_dir(const char *dir)
{
    if (!dir || !*dir) return gp_error_set(GP_ERR_INVALID, "gp_nvcomp_search_dir: empty folder");
    gp_status st = GP_OK;
    pthread_mutex_lock(&gp_nv.lock);
    int known = 0;
    for (int i = 0; i < gp_nv.n_dirs; i++) known |= strcmp(gp_nv.dirs[i], dir) == 0;
    if (!known) {
        char *copy = gp_nv.n_dirs < GP_NV_MAX_DIRS ? strdup(dir) : NULL;
        if (copy) {
            gp_nv.dirs[gp_nv.n_dirs++] = copy;
            /* A new place to look: a failed search may now succeed. */
            free(gp_nv.failed_for);
            gp_nv.failed_for = NULL;
        } else {
            st = gp_error_set(GP_ERR_INVALID, "gp_nvcomp_search_dir(%s): %s", dir,
                              gp_nv.n_dirs < GP_NV_MAX_DIRS ? "out of host memory" : "too many folders (8)");
        }
    }
    pthread_mutex_unlock(&gp_nv.lock);
    return st;
}

static void gp_nv_note(char *why, const char *fmt, const char *a, const char *b)
{
    size_t used = strlen(why);
    if (used + 1 < GP_NV_NOTES) snprintf(why + used, GP_NV_NOTES - used, fmt, a, b);
}

/* Open `file` and check it: 0 and gp_nv filled, or -1 with a note in why. */
static int gp_nv_open(const char *file, char *why)
{
    void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        gp_nv_note(why, "; %s: %s", file, e ? e : "dlopen failed");
        return -1;
    }
    gp_nv_lib api;
    for (size_t i = 0; i < sizeof gp_nv_symbols / sizeof gp_nv_symbols[0]; i++) {
        void *p = dlsym(h, gp_nv_symbols[i].name);
        if (!p) {
            gp_nv_note(why, "; %s: no symbol %s (not nvCOMP 6?)", file, gp_nv_symbols[i].name);
            dlclose(h);
            return -1;
        }
        memcpy((char *)&api + gp_nv_symbols[i].off, &p, sizeof p);
    }
    gp_nv_properties props = {0};
    if (api.get_properties(&props) != 0 || props.version / 1000 != GP_NV_MAJOR) {
        char v[48];
        snprintf(v, sizeof v, "%u.%u.%u", props.version / 1000, props.version % 1000 / 100, props.version % 100);
        gp_nv_note(why, "; %s: nvCOMP %s, gpupool needs 6.x", file, v);
        dlclose(h);
        return -1;
    }
    gp_nv.path = strdup(file);
    if (!gp_nv.path) {
        gp_nv_note(why, "; %s: %s", file, "out of host memory");
        dlclose(h);
        return -1;
    }
    gp_nv.handle = h;
    gp_nv.api = api;
    gp_nv.version = props.version;
    return 0;
}

static int gp_is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* `dir`/libnvcomp.so.6 if that exists, or a note; 0 when loaded. */
static int gp_nv_open_in(const char *dir, char *why)
{
    char file[4096];
    struct stat sb;
    if (snprintf(file, sizeof file, "%s/%s", dir, GP_NV_SONAME) >= (int)sizeof file) {
        gp_nv_note(why, "; %s: %s", dir, "path too long");
        return -1;
    }
    if (stat(file, &sb) != 0) {
        gp_nv_note(why, "; %s: no %s", dir, GP_NV_SONAME);
        return -1;
    }
    return gp_nv_open(file, why);
}

gp_status gp_nvcomp_load(const char *path)
{
    const char *key = path ? path : "";
    gp_status st = GP_OK;
    pthread_mutex_lock(&gp_nv.lock);
    if (gp_nv.handle) goto out;
    if (gp_nv.failed_for && strcmp(gp_nv.failed_for, key) == 0) {
        st = gp_error_set(GP_ERR_BACKEND, "%s", gp_nv.why);
        goto out;
    }
    char why[GP_NV_NOTES] = "";
    int ok;
    if (*key) {
        /* Named by the user: that one or nothing. */
        ok = (gp_is_dir(key) ? gp_nv_open_in(key, why) : gp_nv_open(key, why)) == 0;
    } else {
        ok = 0;
        for (int i = 0; i < gp_nv.n_dirs && !ok; i++) ok = gp_nv_open_in(gp_nv.dirs[i], why) == 0;
        if (!ok) ok = gp_nv_open(GP_NV_SONAME, why) == 0;
    }
    if (!ok) {
        snprintf(gp_nv.why, sizeof gp_nv.why,
                 "nvCOMP 6 could not be loaded (GPUPOOL_NVCOMP %s)%s. Install it with pip install "
                 "nvidia-libnvcomp-cu13 (what gpupool's nvcomp extra installs) or set GPUPOOL_NVCOMP to the "
                 "path of libnvcomp.so.6", *key ? "set" : "unset", why);
        free(gp_nv.failed_for);
        gp_nv.failed_for = strdup(key);
        st = gp_error_set(GP_ERR_BACKEND, "%s", gp_nv.why);
    }
out:
    pthread_mutex_unlock(&gp_nv.lock);
    return st;
}

const char *gp_nvcomp_loaded(unsigned *version)
{
    pthread_mutex_lock(&gp_nv.lock);
    const char *p = gp_nv.path;
    if (version) *version = gp_nv.version;
    pthread_mutex_unlock(&gp_nv.lock);
    return p;
}

/* ------------------------------------------------------------ the codecs */

/* The data type each algorithm is told, by element size. */
static int gp_nv_type(gp_codec_id id, unsigned elem_size)
{
    switch (elem_size) {
    case 2: return GP_NV_FLOAT16; /* fp16 and bf16 alike ("all half-precision formats") */
    case 4: return GP_NV_FLOAT32;
    case 8: return id == GP_CODEC_BITCOMP ? GP_NV_FLOAT64 : GP_NV_CHAR;
    default: return id == GP_CODEC_BITCOMP ? GP_NV_UCHAR : GP_NV_CHAR;
    }
}

static unsigned gp_nv_type_width(int type) { return type == GP_NV_FLOAT16 ? 2 : type == GP_NV_FLOAT32 ? 4 : type == GP_NV_FLOAT64 ? 8 : 1; }

static const char *gp_nv_type_name(int type)
{
    switch (type) {
    case GP_NV_FLOAT16: return "float16";
    case GP_NV_FLOAT32: return "float32";
    case GP_NV_FLOAT64: return "float64";
    default: return "bytes";
    }
}

/* The data type in force is kept as the element width (gp_codec.width),
 * from which gp_nv_type gives it back. */
static gp_nv_ans_copts gp_nv_ans_c(const gp_codec *c) { return (gp_nv_ans_copts){.data_type = gp_nv_type(c->id, c->width)}; }
static gp_nv_ans_dopts gp_nv_ans_d(const gp_codec *c) { return (gp_nv_ans_dopts){.data_type = gp_nv_type(c->id, c->width)}; }
static gp_nv_bitcomp_copts gp_nv_bitcomp_c(const gp_codec *c)
{
    return (gp_nv_bitcomp_copts){.data_type = gp_nv_type(c->id, c->width)};
}
static gp_nv_bitcomp_dopts gp_nv_bitcomp_d(const gp_codec *c) { (void)c; return (gp_nv_bitcomp_dopts){0}; }

/* The same five steps for each algorithm, with its own option types. */
typedef struct gp_nv_algo {
    const char *name; /* nvCOMP's */
    gp_nv_status (*align)(const gp_codec *c, gp_nv_alignments *comp, gp_nv_alignments *decomp);
    gp_nv_status (*max_out)(const gp_codec *c, size_t *max);
    gp_nv_status (*temp)(const gp_codec *c, size_t m, size_t *ctemp, size_t *dtemp);
    gp_nv_status (*compress)(const gp_codec_job *j, size_t k, void *stream);
    gp_nv_status (*decompress)(const gp_codec_job *j, size_t k, void *stream);
} gp_nv_algo;

#define GP_NV_ALGO(a, A)                                                                                   \
    static gp_nv_status gp_nv_##a##_align(const gp_codec *c, gp_nv_alignments *comp, gp_nv_alignments *decomp) \
    {                                                                                                      \
        gp_nv_status s = gp_nv.api.a.c_align(gp_nv_##a##_c(c), comp);                                      \
        return s ? s : gp_nv.api.a.d_align(gp_nv_##a##_d(c), decomp);                                      \
    }                                                                                                      \
    static gp_nv_status gp_nv_##a##_max_out(const gp_codec *c, size_t *max)                                \
    {                                                                                                      \
        return gp_nv.api.a.c_max(c->chunk, gp_nv_##a##_c(c), max);                                         \
    }                                                                                                      \
    static gp_nv_status gp_nv_##a##_temp(const gp_codec *c, size_t m, size_t *ctemp, size_t *dtemp)        \
    {                                                                                                      \
        gp_nv_status s = gp_nv.api.a.c_temp(m, c->chunk, gp_nv_##a##_c(c), ctemp, m * c->chunk, NULL);     \
        return s ? s : gp_nv.api.a.d_temp(m, c->chunk, gp_nv_##a##_d(c), dtemp, m * c->chunk, NULL);       \
    }                                                                                                      \
    static gp_nv_status gp_nv_##a##_compress(const gp_codec_job *j, size_t k, void *stream)                \
    {                                                                                                      \
        const gp_codec_arrays *d = &j->dev;                                                                \
        return gp_nv.api.a.compress(d->in, d->in_len, j->c->chunk, k, j->temp, j->temp_bytes, d->out,      \
                                    d->out_len, gp_nv_##a##_c(j->c), d->status, stream);                   \
    }                                                                                                      \
    static gp_nv_status gp_nv_##a##_decompress(const gp_codec_job *j, size_t k, void *stream)              \
    {                                                                                                      \
        const gp_codec_arrays *d = &j->dev;                                                                \
        return gp_nv.api.a.decompress(d->in, d->in_len, d->out_cap, d->out_len, k, j->temp, j->temp_bytes, \
                                      d->out, gp_nv_##a##_d(j->c), d->status, stream);                     \
    }                                                                                                      \
    static const gp_nv_algo gp_nv_##a = {#A, gp_nv_##a##_align, gp_nv_##a##_max_out, gp_nv_##a##_temp,    \
                                         gp_nv_##a##_compress, gp_nv_##a##_decompress};
GP_NV_ALGOS(GP_NV_ALGO)
#undef GP_NV_ALGO

static const gp_nv_algo *gp_nv_algo_of(const gp_codec *c) { return c->id == GP_CODEC_BITCOMP ? &gp_nv_bitcomp : &gp_nv_ans; }

static const char *gp_nv_text(gp_nv_status s)
{
    const char *t = gp_nv.api.status_string ? gp_nv.api.status_string(s) : NULL;
    return t ? t : "unknown nvCOMP status";
}

static gp_status gp_nv_fail(const gp_codec *c, const char *what, gp_nv_status s)
{
    return gp_error_set(GP_ERR_BACKEND, "codec %s: nvcompBatched%s%s failed: %s (nvCOMP status %d)", c->desc,
                        gp_nv_algo_of(c)->name, what, gp_nv_text(s), s);
}

static gp_status gp_nv_temp_bytes(const gp_codec *c, uint32_t max_chunks, uint64_t *temp)
{
    size_t ct = 0, dt = 0;
    gp_nv_status s = gp_nv_algo_of(c)->temp(c, max_chunks, &ct, &dt);
    if (s) return gp_nv_fail(c, "(De)CompressGetTempSize", s);
    *temp = ct > dt ? ct : dt;
    return GP_OK;
}

/* One batch launch, on the device's context. */
typedef struct gp_nv_launch {
    gp_codec_job *j;
    gp_stream stream;
    uint32_t k;
    int decompress;
} gp_nv_launch;

static gp_status gp_nv_launch_fn(void *arg)
{
    gp_nv_launch *l = arg;
    const gp_nv_algo *a = gp_nv_algo_of(l->j->c);
    gp_nv_status s = l->decompress ? a->decompress(l->j, l->k, l->stream) : a->compress(l->j, l->k, l->stream);
    if (!s) return GP_OK;
    gp_error_set(GP_ERR_BACKEND, "codec %s: nvcompBatched%s%sAsync of %u chunks failed: %s (nvCOMP status %d)",
                 l->j->c->desc, a->name, l->decompress ? "Decompress" : "Compress", l->k, gp_nv_text(s), s);
    return GP_ERR_BACKEND;
}

/* The arrays go up in one copy, the batch runs, the results come back in
 * one copy: all in stream order, read by the host after its wait.  Those
 * copies are the device's threads' (GP_COPY_BY_KERNEL): on a copy engine
 * they would wait behind the other lane's data. */
static gp_status gp_nv_run(gp_codec_job *j, gp_stream stream, uint32_t k, int decompress)
{
    gp_backend *be = j->c->be;
    uint64_t up = GP_CODEC_UPLOAD_BYTES(j->max_chunks), down = GP_CODEC_DOWNLOAD_BYTES(j->max_chunks);
    gp_status st = be->copy(be, j->dev_block, j->host_block, up, GP_COPY_H2D | GP_COPY_BY_KERNEL, stream);
    gp_nv_launch l = {j, stream, k, decompress};
    if (st == GP_OK) st = be->in_context(be, gp_nv_launch_fn, &l);
    if (st == GP_OK)
        st = be->copy(be, (char *)j->host_block + up, (char *)j->dev_block + up, down,
                      GP_COPY_D2H | GP_COPY_BY_KERNEL, stream);
    return st;
}

/* The host arrays already hold device addresses (slots, the slice), so
 * gp_nv_run copies them up as they are. */
static gp_status gp_nv_compress(gp_codec_job *j, gp_stream stream, uint32_t k) { return gp_nv_run(j, stream, k, 0); }
static gp_status gp_nv_decompress(gp_codec_job *j, gp_stream stream, uint32_t k) { return gp_nv_run(j, stream, k, 1); }

static const char *gp_nv_status_text(const gp_codec *c, int32_t status)
{
    (void)c;
    return gp_nv_text(status);
}

static const gp_codec_ops gp_nv_ops = {
    .temp_bytes = gp_nv_temp_bytes,
    .compress = gp_nv_compress,
    .decompress = gp_nv_decompress,
    .status_text = gp_nv_status_text,
    .device_arrays = 1,
};

gp_status gp_codec_nvcomp_init(gp_codec *c, unsigned elem_size, const char *nvcomp_path)
{
    gp_status st = gp_nvcomp_load(nvcomp_path);
    if (st != GP_OK) return st;
    int type = gp_nv_type(c->id, elem_size);
    c->width = gp_nv_type_width(type);
    c->ops = &gp_nv_ops;
    snprintf(c->desc, sizeof c->desc, "%s (%s, %u KiB chunks)", gp_codec_id_name(c->id), gp_nv_type_name(type),
             c->chunk >> 10);
    const gp_nv_algo *a = gp_nv_algo_of(c);
    gp_nv_alignments ca, da;
    size_t max_out = 0;
    gp_nv_status s = a->align(c, &ca, &da);
    if (s) return gp_nv_fail(c, "(De)CompressGetRequiredAlignments", s);
    s = a->max_out(c, &max_out);
    if (s) return gp_nv_fail(c, "CompressGetMaxOutputChunkSize", s);
    /* Slots and sources must suit both directions; the staging is 256-byte
     * aligned and slots are multiples of GP_CODEC_ALIGN. */
    size_t in_align = ca.input > da.output ? ca.input : da.output;
    size_t slot_align = ca.output > da.input ? ca.output : da.input;
    size_t temp_align = ca.temp > da.temp ? ca.temp : da.temp;
    if (!in_align || in_align > 256 || slot_align > GP_CODEC_ALIGN || temp_align > 256)
        return gp_error_set(GP_ERR_BACKEND, "codec %s: nvCOMP asks for alignments gpupool does not provide "
                            "(input %zu, output %zu, temp %zu)", c->desc, in_align, slot_align, temp_align);
    c->in_align = (uint32_t)in_align;
    c->slot = gp_codec_pad(max_out);
    return GP_OK;
}
