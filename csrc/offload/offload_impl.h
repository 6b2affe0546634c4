/*
 * offload_impl.h -- the insides of offload, shared by its files:
 *   offload.c         the offloader: the API, restores and prefetches,
 *                     background offloads, the registry of offloadable
 *                     tags and the pressure callback
 *   offload_record.c  a record's life (its states and every transition),
 *                     which records a restore wants, the integrity check
 *   offload_copy.c    the data path: pieces, the two copy lanes, codecs,
 *                     checksums, the offload and restore pipelines
 */
#ifndef GP_OFFLOAD_IMPL_H
#define GP_OFFLOAD_IMPL_H

#include <pthread.h>

#include "codec.h"
#include "pinned.h"
#include "offload.h"
#include "util.h"
#include "workq.h"

/* Largest piece copied (or compressed) as one: big enough that a copy's
 * fixed cost (a few us) is lost in its transfer time at PCIe speed, small
 * enough to pipeline. */
#define GP_PIECE_MAX (16ull << 20)
/* Shortest part a raw piece is cut to where it fills a slab's tail: a
 * copy's fixed cost is still small beside it. */
#define GP_PART_MIN (1ull << 20)
/* Slab of pinned host memory: a few per GiB (pinning cost is per byte),
 * small enough that the store holds little more than it must. */
#define GP_HOST_SLAB (32ull << 20)
/* Threads that pin slabs (pinned.c): at most one per core, and no more
 * than this.  Their registrations take turns (hostmem.c), so more threads
 * only populate more at once: 8 populate at about 40 GB/s, and on the
 * H200 machine a cold 8 GiB offload ran at 29.1 GB/s with 8 against 27.6
 * with 16 (the copies into the slabs share the host's memory with the
 * populating). */
#define GP_PIN_THREADS 8u
/* Checksums one offload or restore may compute (a device array of this
 * many words, taken from the pool once): 2 TiB in GP_PIECE_MAX pieces,
 * 256 GiB of 2 MiB chunks. */
#define GP_SUMS_MAX (128u << 10)
/* Operations one thread may run inside each other: a restore, and the
 * offload it makes room with. */
#define GP_OP_DEPTH 2
/* Device staging of each of the two lanes' codec jobs, taken from the pool
 * on the first compressed offload and kept: 2 x 80 MiB at most, and no
 * more than 1/16 of the device each (a small device compresses in smaller
 * pieces; one too small for a chunk's slot offloads raw). */
#define GP_STAGING_HALF (80ull << 20)
#define GP_STAGING_SHARE 16
/* Streams an offload's fence may name (gp_pool_fence); more: a device sync. */
#define GP_FENCE_MAX 32
#define GP_CODECS_OPEN 16
/* Once an offload finds a tag's host copy written, this many of the tag's
 * restores keep no copy (gp_record_retire): memory written between its
 * uses (an optimizer's state, weights in training) then pays the check
 * that finds it written once in this many offloads plus one. */
#define GP_CLEAN_SKIP 8

typedef struct gp_piece {
    uintptr_t addr;     /* device bytes [addr, addr+size)              */
    uint64_t size;
    gp_extent host;     /* where they are (ptr NULL: contents dropped) */
    gp_extent host2;    /* compressed: chunks [split, n_chunks), where
                           `host` filled a slab's tail (else empty)     */
    uint64_t split;
    uint64_t stored;    /* bytes stored in host and host2              */
    uint64_t sum;       /* checksum of its device bytes (checksum.h)   */
    gp_tag tag;
    int copied;         /* its copy out was queued                     */
    int summed;         /* `sum` was read back (restore checks it)     */
    gp_codec_chunk *chunks; /* compressed: the codec's table (NULL: raw) */
    uint64_t n_chunks;
} gp_piece;

/* A record's life.  An offload makes it (NEW: only that operation sees
 * it) and publishes it (OFFLOADED: in o->records, nobody holds it).  A
 * restore or a prefetch job takes it (RESTORING, PREFETCHING: only the
 * holder restores it; everyone else waits on o->cond), and either retires
 * it or gives it back (OFFLOADED again).  Retired, it is freed, or kept
 * with its host copy (CLEAN: in o->clean) for the tags' next offload,
 * which takes it back (NEW again) where the device still holds the same
 * bytes, or frees it.  Every change goes through gp_record_move, which
 * refuses any other transition.  The state is guarded by o->lock; the
 * clean list changes only under `op` too. */
typedef enum gp_record_state {
    GP_REC_NEW,
    GP_REC_OFFLOADED,
    GP_REC_PREFETCHING,
    GP_REC_RESTORING,
    GP_REC_CLEAN,
    GP_REC_STATES
} gp_record_state;

/* One offload: what it released and where its bytes are. */
typedef struct gp_record {
    struct gp_record *next;
    unsigned n_tags;
    gp_offload_run *runs;
    size_t n_runs;
    gp_piece *pieces;
    size_t n_pieces;
    uint64_t offloaded, copied, host_bytes, released;
    uint64_t lost;      /* bytes a failed offload lost (restore says so) */
    int dropped;        /* keep = 0: no piece has a host copy, by choice */
    int priority;       /* the highest of its blocks': what restoring may displace */
    uint32_t swap;      /* the swap that made it (gp_offload_swap_out), 0: none */
    gp_codec *codec;    /* the codec of its pieces (NULL: raw)        */
    gp_record_state state;
    gp_tag tags[];      /* the distinct tags offloaded, in the order given */
} gp_record;

/* A set of tags (what a restore may not displace, what it wants). */
typedef struct gp_tagset {
    uint64_t bits[GP_MAX_TAGS / 64];
} gp_tagset;

static inline void gp_tagset_add(gp_tagset *s, gp_tag t) { s->bits[t / 64] |= 1ull << (t % 64); }
static inline int gp_tagset_has(const gp_tagset *s, gp_tag t) { return (int)(s->bits[t / 64] >> (t % 64) & 1); }

/* What a restore or prefetch of some tags is after: records made under
 * them, and records holding blocks that carry them now (a block retagged
 * while offloaded is in a record under its old tag). */
typedef struct gp_want {
    gp_tagset tags;
    gp_offload_range *blocks; /* offloaded blocks of the tags, in address order */
    size_t n_blocks;
} gp_want;

typedef struct gp_reg {
    int prio;           /* -1: not offloadable under pressure         */
    int busy;
    uint64_t last_use;  /* the offloader's clock at its last use event */
    uint64_t begun[3];  /* ... at its last three uses from idle, newest
                           first (0: none): when it comes back next     */
    unsigned elem_size; /* the dtype hint for codecs (0: unknown)     */
    unsigned clean_skip; /* restores left that keep no host copy of it
                            (GP_CLEAN_SKIP after one was found written) */
} gp_reg;

struct gp_offloader {
    gp_pool *pool;
    gp_backend *be;
    pthread_mutex_t op;    /* one offload or restore at a time          */
    pthread_mutex_t lock;  /* records, registry, figures                */
    pthread_cond_t cond;   /* a prefetch or a background offload finished */
    gp_workq *q;           /* unmaps (each waits for its copies' event) */
    gp_workq *mq;          /* maps ahead of restores: one thread, so in
                              address order (they hold the pool lock one
                              at a time anyway; with several threads the
                              one that just mapped took the next lock
                              ahead of the waiters, and the first chunks
                              the copies wait for came last)             */
    gp_workq *pq;          /* prefetches and background offloads (one
                              thread, in order: they take `op`)          */
    gp_pinned *hs;
    uint64_t host_reserve; /* host bytes to keep pinned ahead (GPUPOOL_HOST_RESERVE) */
    gp_stream streams[2];
    int n_streams;
    gp_record *records;
    gp_record *clean;      /* restored records that kept their host
                              copies, newest first                       */
    gp_reg reg[GP_MAX_TAGS];
    uint64_t clock;
    gp_batch prefetches;   /* (waited for through the records' flags and
                              n_background)                              */
    unsigned n_background; /* background offloads queued or running      */
    unsigned n_deferred;   /* prefetches queued behind background offloads
                              (gp_prefetch_tags) that have not yet taken
                              their records: restores and prefetches wait
                              for them as for the offloads               */
    int reclaiming;        /* the tag a reclaim is offloading now (-1:
                              none): marking it busy waits for that offload,
                              so that a tag marked busy is on the device
                              once restored, and stays                     */
    /* Checksums: GP_SUMS_MAX words on the device and where they are read
     * back.  An operation uses those from `sums_at`; an offload that a
     * restore makes room with runs inside it and takes those after the
     * restore's (from `sums_free`), never the restore's own. */
    uint64_t *sums_dev;
    uint64_t *sums_host;
    size_t sums_at, sums_free;
    unsigned depth;        /* operations running (under `op`): 0, 1 or 2 */
    /* The last failure of a background offload, reported by the next
     * restore. */
    gp_status bg_status;
    char bg_error[512];
    gp_offload_stats st;
    uint32_t swaps;        /* swaps made (their ids), under `op`            */
    /* Compression (under `op`): codecs opened so far (they must outlive
     * the records that used them), the two jobs' device staging (from the
     * pool) and pinned host scratch. */
    struct {
        int id;
        unsigned elem_size;
        gp_codec *c;
    } codecs[GP_CODECS_OPEN];
    unsigned n_codecs;
    char nvcomp[GP_PATH_MAX];
    void *staging;
    void *scratch[2];
    uint64_t scratch_bytes[2];
};

/* Host bytes piece p holds (both extents). */
static inline uint64_t gp_piece_host_bytes(const gp_piece *p) { return p->host.size + p->host2.size; }

/* The running operation's part of the checksums, and how many it may take. */
static inline uint64_t *gp_sums_dev(const gp_offloader *o) { return o->sums_dev + o->sums_at; }
static inline uint64_t *gp_sums_host(const gp_offloader *o) { return o->sums_host + o->sums_at; }
static inline size_t gp_sums_room(const gp_offloader *o) { return GP_SUMS_MAX - o->sums_at; }

/* offload_copy.c */
/* Give back the host room of piece p (both extents). */
void gp_piece_host_free(gp_offloader *o, gp_piece *p);
/* Offload `tags` (`op` is held): a published record, or every failure
 * undone -- or, where undoing failed too, a record published with the
 * bytes it lost counted. */
gp_status gp_offload_locked(gp_offloader *o, const gp_tag *tags, size_t n_tags, const gp_offload_opts *opts,
                            gp_offload_result *res);
/* Restore record r, which the caller holds (`op` is held), displacing no
 * tag of `keep`; bytes its offload lost in blocks still live are refused
 * unless `accept_loss`. */
gp_status gp_restore_record_locked(gp_offloader *o, gp_record *r, const gp_tagset *keep, int accept_loss,
                                   gp_offload_result *res);
void gp_offload_copy_free(gp_offloader *o);

/* offload_record.c */
gp_record *gp_record_new(const gp_tag *tags, size_t n_tags, const gp_offload_plan *pl, uint64_t piece_max);
/* Free a NEW record and its host room. */
void gp_record_free(gp_offloader *o, gp_record *r);
/* Publish NEW record r: OFFLOADED, its figures counted (its bytes as
 * copied out unless it is a clean record taken whole). */
void gp_record_publish(gp_offloader *o, gp_record *r, int copied_out);
/* Change r's state (o->lock is held); aborts on a transition the life
 * above does not have: that is memory about to be lost or freed twice. */
void gp_record_move(gp_offloader *o, gp_record *r, gp_record_state from, gp_record_state to);
/* Take r out of the records once restored by its holder: kept CLEAN
 * where every piece has a checked host copy (`op` is held), else freed. */
void gp_record_retire(gp_offloader *o, gp_record *r);
/* The clean record whose host copy holds the bytes and layout offload
 * record r is about to copy out, if any: the same tags, runs and pieces'
 * bytes, tag by tag (their contents are for the caller's checksums to
 * compare).  None: the clean records sharing a tag with r are freed (a
 * restore frees them too, so each tag is in one at most).  `op` is held. */
gp_record *gp_clean_find(gp_offloader *o, const gp_record *r);
/* Host bytes the clean records hold: room an offload that needs it takes,
 * which pinning ahead counts as free. */
uint64_t gp_clean_bytes(gp_offloader *o);
/* Take clean record q for an offload (NEW again; counted in n_clean). */
void gp_clean_take(gp_offloader *o, gp_record *q);
/* Free clean record q; `written`: an offload found the device's bytes
 * changed, so its first tag keeps no copy for the next GP_CLEAN_SKIP
 * restores. */
void gp_clean_drop(gp_offloader *o, gp_record *q, int written);
/* Free clean records, the oldest first, until the pinned store has `room`
 * bytes free beyond its reservations, or none is left: clean copies only
 * hold room the store has pinned anyway. */
void gp_clean_room(gp_offloader *o, uint64_t room);
/* What a restore or prefetch of `tags` wants; gp_want_free after. */
gp_status gp_want_of(gp_offloader *o, const gp_tag *tags, size_t n, gp_want *w);
void gp_want_free(gp_want *w);
/* Whether r holds memory w wants. */
int gp_record_wanted(const gp_record *r, const gp_want *w);
/* The tags of r and of w, which restoring r may not displace. */
void gp_keep_of(const gp_record *r, const gp_want *w, gp_tagset *keep);
const char *gp_tags_text(const gp_record *r, char *buf, size_t len);

/* offload.c */
/* Take and give back `op` (this thread then runs an operation: the
 * pool's pressure callback starts no other on it). */
void gp_op_lock(gp_offloader *o);
void gp_op_unlock(gp_offloader *o);
/* Offload idle registered tags of priority below `below` (none of `keep`,
 * if given), until `needed` bytes were released; `op` is held. */
gp_status gp_reclaim_locked(gp_offloader *o, uint64_t needed, int below, const gp_tagset *keep,
                            uint64_t *released);

#endif /* GP_OFFLOAD_IMPL_H */
