/*
 * gpupool.h -- the public C API of gpupool, a caching, pooled GPU memory
 * allocator.  This header is the contract: every function says what it
 * promises, what it needs from the caller and how it reports failure.
 *
 * Model
 * -----
 * A pool (gp_pool) serves one device.  It owns a backend (backend.h): the
 * thing that reserves virtual address space, maps physical memory into it and
 * orders work between streams.  The CUDA backend drives a real GPU; the host
 * backend pretends with mmap, for tests and CI.
 *
 * Memory lives in arenas: large virtual ranges reserved once.  Physical
 * memory is mapped into an arena in chunks (2 MiB by default) as the pool
 * grows, and free chunks can be unmapped again (gp_pool_trim) so that
 * reserved memory follows allocated memory.  Inside an arena, blocks are kept
 * in two-level segregated-fit bins (TLSF): finding a block is O(1).
 *
 * Streams: a block freed on stream S is at once reusable by allocations on S
 * (stream order protects it).  Another stream reuses it only after the pool
 * made that stream wait for S (gp_backend.stream_wait: no host wait).
 *
 * Every allocation carries a tag (an interned name, gp_tag_intern) and a
 * priority (an int, higher is more important; GP_PRIO_*).
 *
 * Threads: every function may be called from any thread; a pool serialises
 * its callers with one lock.  Tag interning and the error slot are
 * process-wide / thread-local respectively.
 *
 * fork(): a pool's device memory belongs to the process that made it.
 * Fork handlers (pthread_atfork) hold every pool's lock across a fork, so
 * that the child never finds one held by a thread it does not have; in
 * the child, a pool made before the fork refuses every call that changes it
 * or reaches its device (GP_ERR_INVALID: "this pool belongs to process N;
 * ... use the 'spawn' start method"), while what it says of itself (stats,
 * walk, check) still reads; destroying it there frees host memory only.
 * The rule is the same for every backend.  Pools made in the child work.
 * The handlers are installed by the first gp_pool_create; a layer above
 * that takes a lock of its own around pool calls installs its handlers
 * after calling gp_pool_atfork_install(), so that its prepare handler runs
 * first (they run in reverse order) and locks are taken in one order.
 *
 * Errors: functions return a gp_status (or NULL) and leave a message that
 * names what was wrong in a thread-local slot, read with gp_last_error().
 * Nothing in this API aborts the process on bad input: a foreign pointer, a
 * double free or an overflowing size is reported, and the pool stays intact.
 */
#ifndef GPUPOOL_H
#define GPUPOOL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gp_status {
    GP_OK = 0,
    GP_ERR_OOM = 1,         /* the device (or the pool's reserve) is full   */
    GP_ERR_LIMIT = 2,       /* a pool or tag limit would be exceeded         */
    GP_ERR_INVALID = 3,     /* bad argument: size, name, option value        */
    GP_ERR_FOREIGN = 4,     /* pointer not allocated by this pool            */
    GP_ERR_DOUBLE_FREE = 5, /* pointer already freed                         */
    GP_ERR_BACKEND = 6,     /* the device API failed                         */
    GP_ERR_NOMEM = 7,       /* host malloc failed                            */
    GP_ERR_TOO_MANY = 8     /* out of tags or streams                        */
} gp_status;

/* A short, static description of a status ("out of memory", ...). */
const char *gp_status_str(gp_status s);

/* The message left by the last failing call on this thread ("" if none).
 * Valid until the next failing call on the same thread. */
const char *gp_last_error(void);

/* ---------------------------------------------------------------- config */

typedef enum gp_mode {
    GP_MODE_EXPANDABLE = 0, /* grow by mapping chunks, give them back        */
    GP_MODE_RESERVE = 1     /* map everything at creation, never again       */
} gp_mode;

typedef enum gp_log { GP_LOG_OFF = 0, GP_LOG_OOM = 1, GP_LOG_ALL = 2 } gp_log;

/* A size as the user wrote it: absolute bytes, or a fraction of the device's
 * total memory (80% and 0.8 both give fraction 0.8).  Both zero: unset. */
typedef struct gp_size_spec {
    uint64_t bytes;
    double fraction;
} gp_size_spec;

/* Resolve a size spec against a device of `total` bytes (0 if unset). */
uint64_t gp_size_resolve(gp_size_spec s, uint64_t total);

#define GP_TENANT_MAX 64
#define GP_CODEC_MAX 16
#define GP_PATH_MAX 1024

/* Every tunable of gpupool.  gp_config_default() fills the defaults;
 * gp_config_from_env() applies the GPUPOOL_* variables; gp_config_set()
 * applies one option by name, as enable(**opts) does. */
typedef struct gp_config {
    gp_mode mode;            /* GPUPOOL_MODE        expandable|reserve        */
    int mode_given;          /* GPUPOOL_MODE was set: a reserve no longer
                                implies reserve mode, it must agree with it */
    gp_size_spec reserve;    /* GPUPOOL_RESERVE     reserve-mode pool size;
                                setting one implies reserve mode          */
    gp_size_spec limit;      /* GPUPOOL_LIMIT       cap on reserved bytes     */
    int priority;            /* GPUPOOL_PRIORITY    default priority          */
    char codec[GP_CODEC_MAX];/* GPUPOOL_CODEC       a codec.h name (auto)     */
    char nvcomp[GP_PATH_MAX];/* GPUPOOL_NVCOMP      libnvcomp.so.6 or folder  */
    int offload_threads;     /* GPUPOOL_OFFLOAD_THREADS                       */
    char tenant[GP_TENANT_MAX]; /* GPUPOOL_TENANT   arbiter group             */
    gp_log log;              /* GPUPOOL_LOG         off|oom|all               */
    int trace;               /* GPUPOOL_TRACE       record alloc/free history */
    uint64_t chunk;          /* GPUPOOL_CHUNK       physical mapping unit     */
    uint64_t small_size;     /* GPUPOOL_SMALL_SIZE  below: the small arena    */
    uint64_t large_chunk;    /* GPUPOOL_LARGE_CHUNK mapping unit, large arena */
    double cache_slack;      /* GPUPOOL_CACHE_SLACK cache kept when growing,
                                a fraction of allocated; < 0: unbounded     */
    int torch_patch;         /* GPUPOOL_TORCH_PATCH patch torch.cuda APIs     */
    int placement;           /* GPUPOOL_PLACEMENT   GP_PLACE_* (lifetime|none) */
    gp_size_spec host_limit; /* GPUPOOL_HOST_LIMIT  pinned host memory for
                                offload; a fraction is of the host's RAM   */
    gp_size_spec host_reserve; /* GPUPOOL_HOST_RESERVE pinned in the
                                background when the offloader is made     */
    int debug;               /* GPUPOOL_DEBUG       gp_pool_check every
                                GP_DEBUG_EVERY allocs+frees; abort if corrupt */
    gp_size_spec device_limit; /* GPUPOOL_DEVICE_LIMIT the device as the tenant
                                  group sees it (arbiter.h)                   */
    uint64_t reclaim_timeout_ms; /* GPUPOOL_RECLAIM_TIMEOUT how long an
                                  allocation waits for other tenants          */
    uint64_t tenant_turn_ms; /* GPUPOOL_TENANT_TURN how long a tenant keeps its
                                memory across steps before an equal priority */
    double tenant_share;     /* GPUPOOL_TENANT_SHARE the compute share of the
                                tenants below a busy higher priority (0, 1] */
    int tenant_swap;         /* GPUPOOL_TENANT_SWAP the tenant may be swapped
                                out whole while parked (arbiter.h)          */
    int large_chunk_given;   /* GPUPOOL_LARGE_CHUNK was set: it must be at
                                least the chunk (the default is raised to it) */
} gp_config;

/* Lifetime-aware placement: with GP_PLACE_LIFETIME, blocks of long-lived
 * tags (gp_tag_set_lifetime) come from a region of each arena of their own,
 * so that short-lived churn never leaves holes between long-lived blocks. */
enum { GP_PLACE_NONE = 0, GP_PLACE_LIFETIME = 1 };

void gp_config_default(gp_config *cfg);

/* Apply one option.  `name` is the variable (GPUPOOL_LIMIT) or the keyword
 * (limit), case-insensitive.  On a malformed value returns GP_ERR_INVALID and
 * leaves a message naming the option, the value and what is accepted;
 * `cfg` is then unchanged. */
gp_status gp_config_set(gp_config *cfg, const char *name, const char *value);

/* Apply every GPUPOOL_* variable set in the environment.  An unknown
 * GPUPOOL_* variable is an error too (a typo must not pass silently). */
gp_status gp_config_from_env(gp_config *cfg);

/* What single options cannot check: a pool limit below one chunk
 * (GPUPOOL_CHUNK), absolute or a fraction that resolves to less on a device
 * of `device_total` bytes (0: not known yet, fractions are not checked), is
 * refused -- nothing could be mapped under it (and a fraction that resolved
 * to 0 would mean no limit); the same for GPUPOOL_DEVICE_LIMIT, which
 * needs GPUPOOL_TENANT too; and a GPUPOOL_LARGE_CHUNK given below the
 * chunk.  GP_ERR_INVALID with a message naming the options and what is
 * accepted. */
gp_status gp_config_validate(const gp_config *cfg, uint64_t device_total);

/* The option table, for `python -m gpupool config` and documentation. */
typedef struct gp_option_info {
    const char *env;         /* GPUPOOL_LIMIT            */
    const char *key;         /* limit                    */
    const char *def;         /* default, as text         */
    const char *accepted;    /* what values are accepted */
    const char *help;        /* one line of meaning      */
} gp_option_info;

const gp_option_info *gp_config_options(size_t *count);

/* Write the current value of option `key` as text (for reports). */
gp_status gp_config_get(const gp_config *cfg, const char *name, char *buf,
                        size_t len);

/* Parse a size ("512MiB", "20GB", "4096", "80%", "0.8"); the fraction forms
 * are accepted only when allow_fraction.  Returns GP_ERR_INVALID with a
 * message on bad text. */
gp_status gp_parse_size(const char *text, int allow_fraction, gp_size_spec *out);

/* ------------------------------------------------------- tags, priorities */

typedef uint16_t gp_tag;
#define GP_MAX_TAGS 1024
#define GP_TAG_NAME_MAX 63
#define GP_TAG_UNTAGGED 0 /* the tag "untagged", always id 0 */

/* Intern a tag name (1..63 printable characters) to a small id, the same id
 * for the same name for the life of the process.  GP_ERR_TOO_MANY past
 * GP_MAX_TAGS names, GP_ERR_INVALID for a bad name. */
gp_status gp_tag_intern(const char *name, gp_tag *out);
/* The name of an interned tag, or NULL for an id never handed out. */
const char *gp_tag_name(gp_tag tag);
/* How many tags are interned. */
unsigned gp_tag_count(void);

/* A tag's lifetime decides where its blocks are placed (GP_PLACE_LIFETIME).
 * Names of memory that lives for the whole run start long ("weights",
 * "parameters", "params", "buffers", "lora", "optimizer", "optimizer_state",
 * "kv_cache"); every other tag, "untagged" included, starts short --
 * gradients too, which zero_grad(set_to_none=True) drops every step.  The
 * lifetime applies to allocations made after it is set.
 * GP_ERR_INVALID for a tag never interned or a bad lifetime. */
enum { GP_LIFE_SHORT = 0, GP_LIFE_LONG = 1 };
gp_status gp_tag_set_lifetime(gp_tag tag, int lifetime);
int gp_tag_lifetime(gp_tag tag);

/* Priorities are ints 0..255; higher is more important.  When memory must be
 * given up (the pool limit or the device is reached), a request of priority
 * P may release cached (free, mapped) memory last held at priority <= P,
 * lowest priority first, and asks the pressure callback for live memory of
 * priority < P; it never takes anything from higher priorities.  Cached
 * memory keeps the priority of the block freed into it (the highest, where
 * free blocks merged).  GP_PRIO_DEFAULT asks for the pool's configured
 * priority (GPUPOOL_PRIORITY). */
/* The named priorities, 0 up: X(NAME, name) makes GP_PRIO_NAME, its name
 * (gp_priority_name, gpupool._C.PRIORITY_NAMES for Python). */
#define GP_PRIORITIES(X) X(LOW, low) X(NORMAL, normal) X(HIGH, high) X(CRITICAL, critical)
enum {
#define GP_PRIO_ENUM(NAME, name) GP_PRIO_##NAME,
    GP_PRIORITIES(GP_PRIO_ENUM)
#undef GP_PRIO_ENUM
    GP_PRIO_NAMED /* how many have a name */
};
#define GP_PRIO_MAX 255
#define GP_PRIO_DEFAULT (-1)
/* "low", "normal", "high", "critical" or a decimal int 0..255. */
gp_status gp_parse_priority(const char *text, int *out);
/* The name of a priority ("high") or NULL when it has none. */
const char *gp_priority_name(int prio);

/* --------------------------------------------------------------- the pool */

typedef struct gp_pool gp_pool;
typedef struct gp_backend gp_backend;
/* A stream as the backend knows it (cudaStream_t for CUDA; NULL is the
 * default stream). */
typedef void *gp_stream;

/* The largest device a pool takes: its arenas span twice the device, and
 * the bins' classes must hold any block of them. */
#define GP_DEVICE_MAX (1ull << 50)

/* Create a pool over `backend`, which it then owns (destroyed with the pool,
 * also when creation fails).  In reserve mode the whole reserve is mapped
 * here, so a failure to map it is reported now, not at the first alloc.
 * GP_ERR_INVALID for a device of more than GP_DEVICE_MAX bytes. */
gp_status gp_pool_create(gp_backend *backend, const gp_config *cfg,
                         gp_pool **out);

/* Unmap and release everything, then destroy the backend.  Live blocks are
 * released too: the caller promises nothing uses them any more. */
void gp_pool_destroy(gp_pool *pool);

/* Install the pool layer's fork handlers (see fork() above); idempotent. */
void gp_pool_atfork_install(void);

/* Allocate `size` bytes (> 0) for use on `stream`, under `tag` and
 * `priority` (0..255, or GP_PRIO_DEFAULT).  The address is aligned to 512
 * bytes.  Never calls the backend when a cached block fits (nor asks about
 * record_stream events then: see gp_record_stream).  Returns NULL on
 * failure with gp_last_error() set: GP_ERR_OOM (device full; decided from
 * the driver's free memory and the cache the request may release before
 * anything is mapped, so a hopeless request costs no mapping) or GP_ERR_LIMIT
 * (pool or tag limit) once the pool released the cached memory of
 * priorities up to `priority` and the pressure callback had its chance (see
 * the priorities above), GP_ERR_OOM at once for a size above 256 TiB (none
 * overflows: rounding it up stays far below 2^64), GP_ERR_INVALID for size 0;
 * `*status` (if not NULL) receives the status. */
void *gp_alloc(gp_pool *pool, size_t size, gp_stream stream, gp_tag tag,
               int priority, gp_status *status);

/* Allocate `n` blocks (1..GP_APART_MAX sizes, each as gp_alloc takes it) in
 * memory mapped for them alone: one run of whole chunks newly mapped, the
 * blocks one after the other in it, the last one to the run's end (it may
 * hold up to a chunk more than asked: the arena whose chunk wastes least is
 * chosen).  No other block shares their chunks while they live, so an
 * offload of their tag releases all of them whatever else is allocated
 * around.  Never takes a cached block, nor asks the pressure callback;
 * under the limit and the device's free memory it may release idle cache
 * as gp_alloc does.  All or nothing: out[0..n) receives the addresses, or
 * nothing is allocated and the status says why (GP_ERR_OOM, GP_ERR_LIMIT,
 * GP_ERR_INVALID for bad sizes, tag or priority, or while a CUDA graph is
 * captured).  Each block is freed with gp_free. */
#define GP_APART_MAX (1 << 20)
gp_status gp_pool_alloc_apart(gp_pool *pool, const uint64_t *sizes, size_t n, gp_stream stream, gp_tag tag,
                              int priority, void **out);

/* The live blocks of `tag`, of streams (not of CUDA graph pools), that
 * share a chunk with anything else: another tag's block, free or offloaded
 * memory.  An offload of the tag alone keeps such a block on the device
 * when what shares its chunk stays; moved apart (gp_pool_alloc_apart)
 * it goes.  Their addresses, in address order, go to addrs[0..cap); *n is
 * how many there are (more than cap: call again with room).  *graphs is the
 * number of live CUDA graph pools: a graph captured before reads blocks at
 * the addresses it saw, so a caller moves nothing while one lives. */
gp_status gp_pool_tag_mixed(gp_pool *pool, gp_tag tag, uintptr_t *addrs, size_t cap, size_t *n,
                            unsigned *graphs);

/* Free a block.  A pointer the pool never returned (GP_ERR_FOREIGN) or one
 * already freed (GP_ERR_DOUBLE_FREE) is reported and changes nothing. */
gp_status gp_free(gp_pool *pool, void *ptr);

/* The stream a live block was allocated on, its size and tag. */
typedef struct gp_block_info {
    uintptr_t addr;
    uint64_t size;      /* rounded size, what the block occupies    */
    uint64_t requested; /* what the caller asked for (0 when free)  */
    gp_stream stream;
    gp_tag tag;
    uint8_t priority;
    uint8_t state;      /* GP_BLOCK_*                               */
    uint8_t arena;      /* which arena (GP_ARENA_*)                 */
    uint8_t in_graph_pool; /* held by a CUDA graph pool (capture)   */
    uint8_t lifetime;      /* region it lies in: GP_LIFE_*          */
    uint64_t graph_pool;   /* that pool's key, when in_graph_pool   */
} gp_block_info;

/* PENDING: freed, but a stream named with gp_record_stream may still use
 * it; it returns to the free bins once the work queued there has completed.
 * OFFLOADED: live, but its memory is on the host (gp_pool_offload_*): the
 * address stays valid and reserved, no kernel may touch it until restored.
 * FREE_OFFLOADED: free memory inside an offloaded run; it becomes FREE when
 * the run is restored (and a live OFFLOADED block that is freed becomes
 * one).
 * TRANSIT: whole chunks of cache a trim unmaps without the pool's lock (a
 * restore's, on a thread that does not allocate); they become unmapped
 * space when that thread takes the lock again. */
enum {
    GP_BLOCK_FREE_UNMAPPED = 0, GP_BLOCK_FREE = 1, GP_BLOCK_USED = 2, GP_BLOCK_PENDING = 3,
    GP_BLOCK_OFFLOADED = 4, GP_BLOCK_FREE_OFFLOADED = 5, GP_BLOCK_TRANSIT = 6
};
enum { GP_ARENA_SMALL = 0, GP_ARENA_LARGE = 1, GP_ARENA_COUNT = 2 };

/* Look up a live block by any address inside it.  GP_ERR_FOREIGN if none. */
gp_status gp_pool_lookup(gp_pool *pool, const void *ptr, gp_block_info *out);

/* Visit every block of every arena in address order (used, free and
 * unmapped), under the pool's lock: `fn` must not call back into the pool.
 * Stops early when `fn` returns non-zero. */
typedef int (*gp_block_fn)(void *arg, const gp_block_info *block);
void gp_pool_walk(gp_pool *pool, gp_block_fn fn, void *arg);

/* Copy every block of every arena, in address order (what gp_pool_walk
 * visits), into out[0..max); returns how many blocks the pool holds, which
 * may exceed max: then only the first max were copied (copy again into a
 * larger array).  The lock is held for the copy only, so that the caller
 * may do anything with the result -- build Python objects, whose allocation
 * may run a garbage collector that frees pool memory.  out may be NULL when
 * max is 0. */
size_t gp_pool_blocks_read(gp_pool *pool, gp_block_info *out, size_t max);

/* Tensor.record_stream: the live block at `ptr` (its start) is also used on
 * `stream`.  When it is freed, an event is recorded on every such stream and
 * the block is not handed out again (state GP_BLOCK_PENDING) until those
 * events completed: an allocation that finds no cached block (a miss)
 * queries them, without a host wait -- a hit makes no driver call, so a
 * completed block may wait for the next miss; an allocation that would
 * fail, and a trim, synchronise the device, which releases all (also a
 * block whose event could not be recorded).  Recording the block's
 * own stream does nothing.  GP_ERR_FOREIGN / GP_ERR_DOUBLE_FREE for a pointer
 * that is not a live block's start, GP_ERR_TOO_MANY past 8 streams. */
gp_status gp_record_stream(gp_pool *pool, void *ptr, gp_stream stream);

/* CUDA graph capture.  Memory allocated while a stream captures a graph must
 * stay the graph's (its kernels keep the addresses) and the capture may make
 * no device synchronisation nor stream wait.  A graph pool, named by `key`
 * (PyTorch's graph memory pool id), holds the blocks allocated during the
 * captures into it; nothing outside it is handed those blocks, nor are they
 * unmapped, until every graph holding the pool released it.
 *
 * gp_pool_capture_prepare: call before the capture starts on `stream`.  It
 *   synchronises the device, hands every cached block to `stream` and maps
 *   ahead (expandable mode) the pool's peak allocated bytes beyond what is
 *   allocated now, so that a capture that repeats a warm-up finds its memory
 *   without a driver call.  With another capture underway it does nothing.
 * gp_pool_capture_begin: allocations on `stream` (and on streams joined to
 *   its capture, asked of the backend) now go to graph pool `key`, made if
 *   new, shared if it exists (graphs captured with pool=other.pool()); the
 *   caller holds one reference to it.  Memory comes from the graph pool's
 *   free blocks, then the capturing stream's, then new mappings (the only
 *   driver calls a capture can make, counted in n_capture_maps).
 * gp_pool_capture_end: the capture on `stream` ended.
 * gp_pool_capture_release: drop one reference (a graph was reset or
 *   destroyed).  At zero, once no capture is underway, the device is
 *   synchronised and the pool's memory returns to the stream that captured;
 *   blocks still live return when freed.  If that synchronisation fails
 *   (here or at a capture's end), the error says so and the memory stays
 *   with the graph pool until the next capture end or release returns it;
 *   releasing the key again retries at once.
 * Errors: GP_ERR_INVALID for an unknown stream or key, GP_ERR_TOO_MANY past
 * 16 live graph pools or 4 streams capturing into one. */
gp_status gp_pool_capture_prepare(gp_pool *pool, gp_stream stream);
gp_status gp_pool_capture_begin(gp_pool *pool, uint64_t key, gp_stream stream);
gp_status gp_pool_capture_end(gp_pool *pool, gp_stream stream);
gp_status gp_pool_capture_release(gp_pool *pool, uint64_t key);
/* The tags that allocated into graph pool `key`, in tags[0..*n) (at most
 * cap; *n counts them all), when any of the pool's blocks (live, or its
 * scratch) is offloaded, else those of them holding offloaded memory: what
 * a replay needs restored first, since the graph's kernels read and write
 * its memory at the addresses the capture handed out.  The pool's blocks
 * are walked only once an offload took some of the graph's (until a call
 * finds none away), else it costs a look at its tags.  GP_ERR_INVALID for
 * a key no graph pool has. */
gp_status gp_pool_capture_away(gp_pool *pool, uint64_t key, gp_tag *tags, size_t cap, size_t *n);

/* Unmap free chunks until at least `bytes` were released (UINT64_MAX: all),
 * whatever priority cached them, lowest first.  Synchronises the device
 * first (a chunk may still be read by a stream that freed it) when there is
 * cache to release or a block pending record_stream events, which the sync
 * frees (in reserve mode too, which never unmaps).  Returns the bytes
 * released. */
uint64_t gp_pool_trim(gp_pool *pool, uint64_t bytes);

/* gp_pool_trim(pool, UINT64_MAX): what torch.cuda.empty_cache() does. */
uint64_t gp_pool_empty_cache(gp_pool *pool);

/* Called when a request of `priority` finds the pool limit or the device
 * full after releasing the cached memory it may release, before it fails,
 * and only while live memory of a lower priority exists or an offload is
 * under way (gp_pool_releasing): the callback (offload, the arbiter) may
 * give up live memory of priority lower than `priority` -- never of
 * `priority` or above -- and returns the bytes it freed; it waits for the
 * offloads under way, after which the request is retried even if it freed
 * nothing itself.  Called without the pool's lock held, so it may call gp_*
 * functions (gp_free of the blocks it gives up, even gp_alloc); the request
 * is then decided afresh (its tag's limit, its stream, a capture begun or
 * ended meanwhile) as if it had just been made.  Asked at most once per
 * request. */
typedef uint64_t (*gp_pressure_fn)(void *arg, gp_pool *pool, uint64_t needed,
                                   int priority);
void gp_pool_set_pressure(gp_pool *pool, gp_pressure_fn fn, void *arg);
/* An offload of the pool's memory was queued (delta +1) or has finished
 * (-1) on another thread: until then a request that finds no room asks
 * the pressure callback, which waits for it.  (Offload plans count
 * themselves from gp_pool_offload_begin to gp_pool_plan_end.) */
void gp_pool_releasing(gp_pool *pool, int delta);

/* Limits.  The pool limit caps reserved (mapped) bytes; 0 removes it.  A tag
 * limit caps the bytes allocated under that tag; 0 removes it. */
void gp_pool_set_limit(gp_pool *pool, uint64_t bytes);
gp_status gp_pool_set_tag_limit(gp_pool *pool, gp_tag tag, uint64_t bytes);

/* Re-home live blocks under `tag` (and `priority`, or GP_PRIO_DEFAULT to
 * keep each block's own): the blocks containing the `n` addresses (any
 * address inside a live block; a block named twice counts once).  The
 * figures of the old and new tags and priorities move exactly; where a
 * block lies does not change.  All or nothing: GP_ERR_FOREIGN for an
 * address in no live block, GP_ERR_LIMIT if the tag's limit would be
 * exceeded, GP_ERR_INVALID for a bad tag or priority.  `*bytes` (if not
 * NULL) receives the bytes of the blocks that changed tag or priority. */
gp_status gp_pool_retag(gp_pool *pool, void *const *ptrs, size_t n, gp_tag tag,
                        int priority, uint64_t *bytes);

/* The pool's integrity, checked as tlsf_check checks a TLSF heap: the block
 * list covers every arena without gap or overlap; each free block sits in
 * the bins of its slot, region and size class, and the bitmaps agree with
 * the lists; the pointer hash holds exactly the used blocks; every block
 * header is in use or spare; the record_stream table matches the pending
 * blocks; free neighbours that may merge have merged; the figures (pool, per
 * tag, per priority) equal sums over the blocks; the chunk table's mapped
 * chunks equal reserved.  Returns the number of violations found (0: the
 * pool is consistent) and describes the first in `msg` (at most `n` bytes,
 * NUL-terminated; may be NULL when n is 0).  Takes the pool's lock; O(blocks
 * + bins).  With GPUPOOL_DEBUG=1 the pool runs it itself every
 * GP_DEBUG_EVERY allocations and frees and aborts, naming the violation, if
 * the pool is corrupt. */
size_t gp_pool_check(gp_pool *pool, char *msg, size_t n);
#define GP_DEBUG_EVERY 256

/* ------------------------------------------------------- offload, pool side */

/* The pool's part of offloading memory to the host (offload.c does the
 * copies and keeps the host copy).  Physical memory is given back in whole
 * chunks: a chunk is *released* when every block in it is a live block of
 * the tags being offloaded or free cache of a stream; a chunk shared with
 * other live memory (another tag, a pending record_stream block, a CUDA
 * graph's private memory) stays mapped.  Released chunks form *runs*
 * (maximal chunk-aligned ranges).
 *
 * The addresses never change: every live block of the tags that touches a
 * released chunk becomes OFFLOADED (still in the pointer hash: it can be
 * freed, retagged and looked up; no kernel may touch it until restored);
 * its bytes inside runs are copied, its bytes in a shared chunk stay where
 * they are.  A block touching no released chunk stays resident (`kept`).
 * Free cache in runs becomes FREE_OFFLOADED (no allocation lands there).
 * Figures: OFFLOADED blocks leave `allocated` (and their tag's and
 * priority's) for `offloaded`; `reserved` drops as chunks are unmapped;
 * `active_blocks` still counts them (they are live allocations).
 *
 * A plan covers one offload or one restore:
 *   gp_pool_offload_begin  plans and marks, under the lock; every run's
 *                          chunks are still mapped.  An empty plan (n_runs
 *                          0) when nothing can move.
 *   gp_pool_restore_begin  a plan over runs offloaded earlier, to map
 *                          them again (chunks still mapped stay so).
 *   gp_pool_plan_unmap     give back the chunks of [addr, addr+size) (a
 *                          chunk-aligned piece of one run), once its data is
 *                          safe on the host.
 *   gp_pool_plan_map       map fresh chunks there again (restore, or undoing
 *                          a failed offload).  On GP_ERR_OOM it has first
 *                          released cached chunks of priority <= `priority`
 *                          and retried; the caller may then ask others to
 *                          give memory up and call it again.
 *   gp_pool_plan_end       finish: `resident` 1 when every chunk of the plan
 *                          is mapped (the blocks are live and usable again,
 *                          free pieces go back to the bins; GP_ERR_INVALID,
 *                          and nothing changes, when one is not), 0 to
 *                          leave the runs offloaded (a chunk whose give-back
 *                          failed may stay mapped: it counts as reserved
 *                          until a restore maps the rest); the plan is
 *                          then freed.
 * The chunks of a run are touched by nobody else meanwhile (no allocation
 * lands in them, trim skips them), so the caller copies without the lock.
 * Refused while a CUDA graph captures (GP_ERR_INVALID): a capture may not
 * synchronise. */
typedef struct gp_offload_run {
    uintptr_t addr;     /* chunk-aligned                                  */
    uint64_t size;      /* a multiple of `chunk`                          */
    uint64_t chunk;     /* the mapping unit of its arena                  */
} gp_offload_run;

/* Bytes to copy: the part of one live block inside one run. */
typedef struct gp_offload_range {
    uintptr_t addr;
    uint64_t size;
    gp_tag tag;
    uint8_t priority;
} gp_offload_range;

typedef struct gp_offload_plan {
    int restore;                /* a restore plan (else an offload)        */
    size_t n_runs;
    gp_offload_run *runs;       /* in address order                       */
    size_t n_ranges;
    gp_offload_range *ranges;   /* in address order; only these bytes are
                                   copied (free space is not)             */
    uint64_t bytes;             /* sum of ranges[].size                    */
    uint64_t released;          /* sum of runs[].size                      */
    uint64_t offloaded;         /* offload: bytes of the blocks that became
                                   OFFLOADED (whole blocks)                */
    uint64_t kept;              /* offload: bytes of the tags' live blocks
                                   that stay resident (see above)          */
    int graphs;                 /* offload: it takes memory of a CUDA
                                   graph pool (a replay may run on a stream
                                   the pool never saw: no fence covers it) */
    int refill;                 /* offload, set by the caller: each unmap
                                   first maps again, within what it gave
                                   back and the limit, cache the last
                                   restore gave back to stay under the peak
                                   (an optimizer's state offloaded behind
                                   its step: the forward pass that follows
                                   finds the cache its last one left, not
                                   maps on the thread that allocates) */
} gp_offload_plan;

/* Plan the offload of the live blocks of `tags` (n_tags of them).
 * GP_ERR_INVALID for a tag never interned or while a graph captures,
 * GP_ERR_NOMEM when host memory for the plan is short. */
gp_status gp_pool_offload_begin(gp_pool *pool, const gp_tag *tags, size_t n_tags,
                                gp_offload_plan **out);
/* The same, of the first blocks of `tags` in address order (arena by
 * arena) until they hold `most` bytes (0: all): a part of the tags, as a
 * cap needs, whose next offload takes the next blocks. */
gp_status gp_pool_offload_begin_upto(gp_pool *pool, const gp_tag *tags, size_t n_tags, uint64_t most,
                                     gp_offload_plan **out);
/* Plan the restore of `runs` (as an offload plan listed them; every block
 * in each must still be offloaded: GP_ERR_INVALID otherwise).  The plan's ranges
 * are those of the blocks still live in them (some may have been freed
 * since): the same addresses and sizes the offload plan gave them. */
gp_status gp_pool_restore_begin(gp_pool *pool, const gp_offload_run *runs, size_t n_runs,
                                gp_offload_plan **out);
gp_status gp_pool_plan_unmap(gp_pool *pool, gp_offload_plan *plan, uintptr_t addr,
                             uint64_t size);
gp_status gp_pool_plan_map(gp_pool *pool, gp_offload_plan *plan, uintptr_t addr,
                           uint64_t size, int priority);
gp_status gp_pool_plan_end(gp_pool *pool, gp_offload_plan *plan, int resident);
/* Whether `run` is an offloaded run of the pool now (every block in it
 * offloaded, live or free): GP_ERR_INVALID naming the first block that is
 * not.  For the offloader's integrity check. */
gp_status gp_pool_run_check(gp_pool *pool, const gp_offload_run *run);
/* The OFFLOADED blocks of `tags` (n_tags 0: of every tag), whole, as
 * ranges in address order: *out (free() it) and *n.  A block retagged while
 * offloaded is found under its tag now. */
gp_status gp_pool_offloaded_blocks(gp_pool *pool, const gp_tag *tags, size_t n_tags, gp_offload_range **out,
                                   size_t *n);

/* The configuration the pool was made with (its limit as set now). */
void gp_pool_config(gp_pool *pool, gp_config *out);

/* Block the host until all work on the pool's device has completed (the
 * backend's synchronize; counted in n_sync). */
gp_status gp_pool_synchronize(gp_pool *pool);
/* What gp_pool_synchronize waits for, as events to wait for later: one
 * recorded now on each stream the pool knows (those that allocate, and
 * those record_stream named), at most `cap`, in events[0..*n) (the caller
 * releases them with the backend's event_release).  Work queued after it,
 * on those streams or others, is not waited for: an offload asked behind a
 * step does not wait for the next forward pass.  Fails (no events) while
 * a graph is being captured or where an event cannot be recorded. */
gp_status gp_pool_fence(gp_pool *pool, uint64_t *events, size_t cap, size_t *n);
/* The highest `allocated` since the last call with `reset` (then restarted
 * from `allocated` now): what one phase of a step needed at most, read by
 * the optimizer's offload hooks apart from the peaks a user resets. */
uint64_t gp_pool_window_peak(gp_pool *pool, int reset);
/* The pool's backend, for the layers above that copy (offload.c). */
gp_backend *gp_pool_backend(gp_pool *pool);
/* GP_OK when this process may use the pool; the error a pool made before
 * a fork gives in the child otherwise (for layers above that must check
 * before they take locks of their own). */
gp_status gp_pool_in_process(gp_pool *pool);

/* -------------------------------------------------------------- statistics */

/* The figures, one list each, from which gp_stats / gp_tag_stats, the
 * dicts of Pool.stats() and the keys of gpupool's torch.cuda.memory_stats()
 * are all made: X(field, kind, PyTorch key).  The kind says how a figure
 * behaves: GP_STAT_CURRENT a level now (or a setting), GP_STAT_PEAK the
 * highest level since gp_pool_reset_peaks, GP_STAT_TOTAL a counter that only
 * grows (reset_accumulated_memory_stats restarts PyTorch's from a
 * baseline).  The key is that of torch.cuda.memory_stats() which reports the
 * figure as it is, NULL if none does (figures PyTorch derives from several
 * of ours are worked out in gpupool/_torch_patch.py). */
enum { GP_STAT_CURRENT = 0, GP_STAT_PEAK = 1, GP_STAT_TOTAL = 2 };

#define GP_STATS_FIELDS(X)                                                                      \
    X(allocated, GP_STAT_CURRENT, "allocated_bytes.all.current")   /* bytes in live blocks (rounded) */ \
    X(allocated_peak, GP_STAT_PEAK, "allocated_bytes.all.peak")                                 \
    X(requested, GP_STAT_CURRENT, "requested_bytes.all.current")   /* bytes the callers asked for */ \
    X(requested_peak, GP_STAT_PEAK, "requested_bytes.all.peak")                                 \
    X(reserved, GP_STAT_CURRENT, "reserved_bytes.all.current")     /* bytes of mapped physical memory */ \
    X(reserved_peak, GP_STAT_PEAK, "reserved_bytes.all.peak")                                   \
    X(active_blocks, GP_STAT_CURRENT, "allocation.all.current")    /* live blocks */            \
    X(active_blocks_peak, GP_STAT_PEAK, "allocation.all.peak")                                  \
    X(n_alloc, GP_STAT_TOTAL, "allocation.all.allocated")          /* successful calls */       \
    X(n_free, GP_STAT_TOTAL, "allocation.all.freed")                                            \
    X(cache_hits, GP_STAT_TOTAL, NULL)             /* allocs served with no backend call */     \
    X(n_map, GP_STAT_TOTAL, "num_device_alloc")    /* backend mapping calls */                  \
    X(n_unmap, GP_STAT_TOTAL, "num_device_free")                                                \
    X(n_map_fail, GP_STAT_TOTAL, NULL)             /* mapping calls that failed */              \
    X(n_stream_waits, GP_STAT_TOTAL, NULL)         /* cross-stream reuses */                    \
    X(n_sync, GP_STAT_TOTAL, "num_sync_all_streams") /* device synchronisations */              \
    X(n_sync_pool, GP_STAT_TOTAL, NULL)            /* host waits for the pool's streams alone */ \
    X(n_trim, GP_STAT_TOTAL, NULL)                 /* trims that released something */          \
    X(n_trim_idle, GP_STAT_TOTAL, NULL)            /* of them, of idle cache with no wait */    \
    X(n_oom, GP_STAT_TOTAL, "num_ooms")            /* allocations that failed for OOM / limit */ \
    X(n_alloc_retries, GP_STAT_TOTAL, "num_alloc_retries") /* allocs that trimmed and retried */ \
    X(segments, GP_STAT_CURRENT, "segment.all.current") /* maximal mapped address runs (full) */ \
    X(free_blocks, GP_STAT_CURRENT, "inactive_split.all.current") /* free mapped blocks (full) */ \
    X(free_bytes, GP_STAT_CURRENT, NULL)           /* reserved - allocated */                   \
    X(largest_free, GP_STAT_CURRENT, NULL)         /* largest free mapped block (full) */       \
    X(limit, GP_STAT_CURRENT, NULL)                /* pool limit, 0 = none */                   \
    X(device_total, GP_STAT_CURRENT, NULL)         /* the backend's memory size */              \
    X(chunk, GP_STAT_CURRENT, NULL)                /* physical mapping unit */                  \
    X(offloaded, GP_STAT_CURRENT, NULL)            /* bytes of live blocks offloaded now */     \
    X(allocated_total, GP_STAT_TOTAL, "allocated_bytes.all.allocated") /* bytes handed out, rounded */ \
    X(requested_total, GP_STAT_TOTAL, "requested_bytes.all.allocated") /* bytes asked for */    \
    X(mapped_total, GP_STAT_TOTAL, "reserved_bytes.all.allocated")    /* bytes mapped */        \
    X(unmapped_total, GP_STAT_TOTAL, "reserved_bytes.all.freed")      /* bytes unmapped */      \
    X(refilled_total, GP_STAT_TOTAL, NULL) /* of them, cache a restore gave back, mapped by offloads */ \
    X(pending, GP_STAT_CURRENT, NULL)      /* freed bytes waiting for record_stream events */   \
    X(n_capture_maps, GP_STAT_TOTAL, NULL) /* chunks mapped while a graph captured */ \
    X(ns_lock_wait, GP_STAT_TOTAL, NULL)   /* ns allocs and frees waited for the pool's lock */ \
    X(ns_slow, GP_STAT_TOTAL, NULL)        /* ns allocs spent past the cache (growth, trims, pressure) */

/* Per tag. */
#define GP_TAG_STATS_FIELDS(X)                                                  \
    X(allocated, GP_STAT_CURRENT, NULL)                                         \
    X(allocated_peak, GP_STAT_PEAK, NULL)                                       \
    X(requested, GP_STAT_CURRENT, NULL)                                         \
    X(active_blocks, GP_STAT_CURRENT, NULL)                                     \
    X(n_alloc, GP_STAT_TOTAL, NULL)       /* stays with the tag that allocated */ \
    X(limit, GP_STAT_CURRENT, NULL)       /* 0 = none */                        \
    X(offloaded, GP_STAT_CURRENT, NULL)   /* bytes of its live blocks offloaded now */

/* Per priority. */
#define GP_PRIO_STATS_FIELDS(X)                                                 \
    X(allocated, GP_STAT_CURRENT, NULL)                                         \
    X(allocated_peak, GP_STAT_PEAK, NULL)

#define GP_STAT_MEMBER(field, kind, torch_key) uint64_t field;

typedef struct gp_stats {
    GP_STATS_FIELDS(GP_STAT_MEMBER)
    /* Not a figure (the layout): virtual bytes reserved per arena. */
    uint64_t arena_size[GP_ARENA_COUNT];
} gp_stats;

typedef struct gp_tag_stats {
    GP_TAG_STATS_FIELDS(GP_STAT_MEMBER)
} gp_tag_stats;

typedef struct gp_prio_stats {
    GP_PRIO_STATS_FIELDS(GP_STAT_MEMBER)
} gp_prio_stats;

/* Every figure at one instant: the pool's, each tag's, each priority's and
 * the history's, so that they agree with each other (the tags' allocated
 * bytes add up to the pool's, ...).  About 64 KiB: allocate it. */
typedef struct gp_figures {
    gp_stats pool;                       /* as gp_pool_stats               */
    gp_prio_stats prio[GP_PRIO_MAX + 1]; /* by priority                    */
    size_t history_capacity, history_len; /* as gp_pool_history_info      */
    uint64_t history_recorded;
    unsigned n_tags;                     /* tags[0..n_tags): every tag
                                            interned when copied           */
    gp_tag_stats tags[GP_MAX_TAGS];
} gp_figures;

/* Copy every figure under one hold of the pool's lock; `full` as for
 * gp_pool_stats. */
void gp_pool_figures(gp_pool *pool, gp_figures *out, int full);

/* A consistent copy of the pool's figures (taken under its lock; O(1) but
 * for `segments`, `free_blocks` and `largest_free`, which walk the arenas
 * only when `full` is non-zero, else they are left 0). */
void gp_pool_stats(gp_pool *pool, gp_stats *out, int full);
/* The largest request the pool can serve now without giving anything up:
 * its largest free block or, in expandable mode, what the device (its
 * driver's free memory) and the pool limit still let it map, whichever is
 * larger.  What PyTorch's cacheInfo() answers, for cuDNN to size its
 * workspace.  Walks the arenas and asks the driver: not for the hot path. */
uint64_t gp_pool_headroom(gp_pool *pool);
/* Figures of one tag (zeros for a tag never used). */
void gp_pool_tag_stats(gp_pool *pool, gp_tag tag, gp_tag_stats *out);
/* Figures by priority: allocated bytes now and at peak. */
void gp_pool_prio_stats(gp_pool *pool, int prio, uint64_t *allocated,
                        uint64_t *peak);
/* Reset every peak to the current value. */
void gp_pool_reset_peaks(gp_pool *pool);

/* A short text for an out-of-memory error: the request, allocated,
 * reserved, largest free block, the biggest tags.  Writes at most `len`
 * bytes (NUL-terminated); returns the length it wanted. */
size_t gp_pool_oom_report(gp_pool *pool, uint64_t requested, char *buf,
                          size_t len);

/* Copy the last OOM report this pool produced ("" if none) to `buf`: at
 * most `len` bytes, NUL-terminated; returns its length (less than
 * GP_OOM_REPORT_MAX).  A copy, taken under the pool's lock: another
 * thread's failure may write a new one at any time.  (The thread whose
 * allocation failed finds its own report in gp_last_error().) */
#define GP_OOM_REPORT_MAX 1024
size_t gp_pool_last_oom(gp_pool *pool, char *buf, size_t len);

/* ----------------------------------------------------------------- history */

/* What a history event records (gp_event.action).  ALLOC: a block handed
 * out (addr, size = its rounded size).  FREE_REQUESTED: gp_free of it;
 * FREE_COMPLETED: it became reusable -- at once, or when the events of its
 * record_stream streams completed (the two come in this order, and both
 * always come).  MAP / UNMAP: physical memory mapped into or released from
 * [addr, addr+size) (one event per contiguous range; stream 0).  OOM: an
 * allocation failed for lack of memory or a limit: size = bytes requested,
 * addr = bytes the device had free (when the history is on, the backend
 * is asked once on that failure path).  OFFLOAD / RESTORE: the physical
 * memory behind live blocks moved to host memory and back (recorded by the
 * layer that does it, through gp_pool_history_note). */
enum {
    GP_EV_ALLOC = 0, GP_EV_FREE_REQUESTED = 1, GP_EV_FREE_COMPLETED = 2, GP_EV_MAP = 3,
    GP_EV_UNMAP = 4, GP_EV_OOM = 5, GP_EV_OFFLOAD = 6, GP_EV_RESTORE = 7, GP_EV_COUNT = 8
};

typedef struct gp_event {
    uint64_t time_ns;   /* CLOCK_MONOTONIC, nanoseconds                   */
    uintptr_t addr;
    uint64_t size;
    gp_stream stream;   /* the block's stream; NULL for MAP/UNMAP         */
    uint32_t context;   /* the recording thread's gp_set_context value    */
    gp_tag tag;         /* the block's tag (the request's, for OOM)       */
    uint8_t priority;
    uint8_t action;     /* GP_EV_*                                        */
} gp_event;

/* The default ring size of GPUPOOL_TRACE=1 (as PyTorch's memory history). */
#define GP_HISTORY_DEFAULT 100000

/* Record the pool's history in a ring of the newest `max_entries` events
 * (0: stop and drop it).  Switching it on while it is on resizes the ring,
 * keeping the newest events.  `stacks` is kept for the layer above, which
 * asks gp_pool_history_stacks whether to set a context (a Python stack)
 * before each call.  While off, recording costs one branch per event.
 * GP_ERR_NOMEM when the ring cannot be allocated (the history is then as it
 * was).  A pool created with cfg.trace starts with GP_HISTORY_DEFAULT
 * entries and stacks on. */
gp_status gp_pool_history(gp_pool *pool, size_t max_entries, int stacks);

/* Non-zero while the history is on with stacks requested.  Lock-free (a
 * relaxed atomic read), for the allocation paths of the layer above. */
int gp_pool_history_stacks(const gp_pool *pool);

/* The ring's capacity (0: history off), events held, events ever recorded
 * (recorded - len were overwritten). */
void gp_pool_history_info(gp_pool *pool, size_t *capacity, size_t *len,
                          uint64_t *recorded);

/* Copy the newest min(len, max) events to `out`, oldest first; returns how
 * many were copied. */
size_t gp_pool_history_read(gp_pool *pool, gp_event *out, size_t max);

/* Record an event that happens outside the pool (GP_EV_OFFLOAD,
 * GP_EV_RESTORE: offload.c); nothing when the history is off.
 * GP_ERR_INVALID for an action out of range. */
gp_status gp_pool_history_note(gp_pool *pool, int action, uintptr_t addr,
                               uint64_t size, gp_tag tag, int priority);

/* The context (an id the caller defines; 0 = none) that this thread's
 * following events carry, until it sets another.  Thread-local. */
void gp_set_context(uint32_t context);

/* ---------------------------------------------------------------- backends */

/* A host backend: "device memory" is mmap'd host memory, up to `capacity`
 * bytes mapped at once (OOM beyond), with fake streams (any pointer value)
 * and fault injection (backend_host.h, gp_host_*). */
gp_status gp_backend_host_create(uint64_t capacity, gp_backend **out);

/* The CUDA backend for `device` (an ordinal): libcuda.so.1 is loaded with
 * dlopen on first use.  GP_ERR_BACKEND with a message when there is no
 * driver, no such device, or the device lacks virtual memory management. */
gp_status gp_backend_cuda_create(int device, gp_backend **out);
/* The UUID of CUDA device `device`, as nvidia-smi writes it
 * ("GPU-xxxxxxxx-xxxx-..."): what names a device across processes whatever
 * their CUDA_VISIBLE_DEVICES (the tenant registry's key). */
gp_status gp_backend_cuda_uuid(int device, char *buf, size_t len);
/* Queue on `stream` (a CUstream) a copy of `size` bytes from `src` on CUDA
 * device `src_device` to `dst` on `dst_device`, whether or not either
 * device may access the other's memory: the driver goes through the host
 * where there is no peer-to-peer path (cuMemcpyPeerAsync).  The two
 * devices' primary contexts are retained on first use and kept. */
gp_status gp_backend_cuda_copy_peer(void *dst, int dst_device, const void *src, int src_device, uint64_t size,
                                    void *stream);

/* GPUPOOL_LOG=all: a backend that forwards to `inner` (which it then owns,
 * also when this fails) and prints each map, unmap and device
 * synchronisation on stderr, with its size and duration. */
gp_status gp_backend_logged(gp_backend *inner, gp_backend **out);

#ifdef __cplusplus
}
#endif
#endif /* GPUPOOL_H */
