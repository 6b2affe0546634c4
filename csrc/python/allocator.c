/*
 * allocator.c -- what PyTorch calls: the two symbols its
 * CUDAPluggableAllocator loads from this same shared object,
 *
 *   void *gpupool_malloc(ssize_t size, int device, cudaStream_t stream);
 *   void  gpupool_free(void *ptr, ssize_t size, int device, cudaStream_t stream);
 *
 * and what they need: one allocator stack per CUDA device (stack.h: its
 * backend, adaptors, pool and offloader), created on the first allocation
 * on it with the configuration given to gp_registry_configure (GPUPOOL_*
 * variables and enable() keywords), and the thread-local context (tag and
 * priority) that gpupool.tag() sets.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/types.h>

#include "module.h"
#include "pystack.h"
#include "stack.h"
#include "torch_abi.h"

static gp_config g_cfg;
static int g_configured;
static uint64_t g_host_capacity; /* non-zero: device pools over the host backend (tests) */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(gp_stack *) g_stacks[GP_MAX_DEVICES];
/* Per device, the devices granted access to its memory (a bit each, under
 * g_lock): a stack made later grants them when it is made. */
static uint64_t g_peers[GP_MAX_DEVICES];
static atomic_ullong g_free_errors;
static char g_create_error[1024];

/* The tag context of this thread: tag id and priority (GP_PRIO_DEFAULT: the
 * pool's configured priority).  t_tag is -1 while the thread has no context
 * of its own -- autograd's backward threads, threads a library starts --
 * and it then allocates under the inherited context, which
 * gpupool.tag(..., inherit=True) sets for the whole process: one atomic
 * word, tag * GP_CTX_PRIO + priority + 1, so that both change together. */
#define GP_CTX_PRIO 512
static _Thread_local int t_tag = -1;
static _Thread_local int t_prio = GP_PRIO_DEFAULT;
static atomic_int g_inherited = GP_TAG_UNTAGGED * GP_CTX_PRIO + GP_PRIO_DEFAULT + 1;

static _Thread_local gp_handout t_hand;

gp_handout gp_set_handout(gp_handout h)
{
    gp_handout old = t_hand;
    t_hand = h;
    return old;
}

void gp_context(gp_tag *tag, int *prio, int *own)
{
    *own = t_tag >= 0;
    if (*own) {
        *tag = (gp_tag)t_tag;
        *prio = t_prio;
        return;
    }
    int v = atomic_load_explicit(&g_inherited, memory_order_relaxed);
    *tag = (gp_tag)(v / GP_CTX_PRIO);
    *prio = v % GP_CTX_PRIO - 1;
}

/* fork(): g_lock is held while stacks are made and read, so it is taken
 * before any pool's lock -- in the fork handlers too, which is why these
 * are installed after the pool layer's (prepare handlers run in reverse
 * order of installation).  Installed before g_lock is first taken: a fork
 * before that cannot find it held. */
static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;
static void gp_registry_fork_prepare(void) { pthread_mutex_lock(&g_lock); }
static void gp_registry_fork_release(void) { pthread_mutex_unlock(&g_lock); }
static void gp_registry_atfork(void)
{
    gp_pool_atfork_install();
    pthread_atfork(gp_registry_fork_prepare, gp_registry_fork_release, gp_registry_fork_release);
}

static void gp_registry_lock(void)
{
    pthread_once(&g_atfork_once, gp_registry_atfork);
    pthread_mutex_lock(&g_lock);
}

static void gp_log_oom(const char *what)
{
    if (g_cfg.log != GP_LOG_OFF) fprintf(stderr, "%s\n", what);
}

/* The stack of `device`, created on first use (slow path, under g_lock). */
gp_stack *gp_registry_stack(int device)
{
    if (device < 0 || device >= GP_MAX_DEVICES) {
        gp_error_set(GP_ERR_INVALID, "gpupool: device %d is out of range (0..%d)", device, GP_MAX_DEVICES - 1);
        return NULL;
    }
    gp_stack *p = atomic_load_explicit(&g_stacks[device], memory_order_acquire);
    if (p) return p;
    gp_registry_lock();
    p = atomic_load_explicit(&g_stacks[device], memory_order_relaxed);
    if (!p) {
        if (!g_configured) gp_config_default(&g_cfg);
        gp_stack_set_context_source(gp_pystack_capture); /* (history stacks) */
        gp_backend *be;
        gp_status st = g_host_capacity ? gp_backend_host_create(g_host_capacity, &be)
                                       : gp_backend_cuda_create(device, &be);
        if (st == GP_OK) be->device = device; /* (the host backend stands in for this device) */
        /* The device's name in the tenant registry: the same GPU in every
         * process, whatever its CUDA_VISIBLE_DEVICES. */
        char id[64] = "host";
        if (st == GP_OK && !g_host_capacity && g_cfg.tenant[0] &&
            (st = gp_backend_cuda_uuid(device, id, sizeof id)) != GP_OK)
            be->destroy(be);
        if (st == GP_OK) st = gp_stack_create(be, id, &g_cfg, &p);
        if (st != GP_OK) {
            snprintf(g_create_error, sizeof g_create_error, "%s", gp_last_error());
            p = NULL;
        } else {
            /* Peers asked for before there was a stack: the caller that
             * asked has returned, so a failure can only be told here. */
            for (int peer = 0; peer < GP_MAX_DEVICES; peer++)
                if ((g_peers[device] >> peer & 1) && gp_stack_grant_peer(p, peer) != GP_OK) {
                    g_peers[device] &= ~(1ull << peer);
                    fprintf(stderr, "gpupool: device %d cannot access device %d's memory, copies between them "
                            "will fail: %s\n", peer, device, gp_last_error());
                }
            atomic_store_explicit(&g_stacks[device], p, memory_order_release);
            if (g_cfg.log == GP_LOG_ALL) {
                gp_stats s;
                gp_pool_stats(gp_stack_pool(p), &s, 0);
                fprintf(stderr, "gpupool: device %d pool created (%s mode, reserved %llu bytes)\n",
                        device, g_cfg.mode == GP_MODE_RESERVE ? "reserve" : "expandable",
                        (unsigned long long)s.reserved);
            }
        }
    }
    pthread_mutex_unlock(&g_lock);
    return p;
}

gp_status gp_registry_grant_peer(int device, int peer)
{
    if (device < 0 || device >= GP_MAX_DEVICES || peer < 0 || peer >= GP_MAX_DEVICES || peer == device)
        return gp_error_set(GP_ERR_INVALID, "gpupool: access of device %d to device %d's memory: two different "
                            "devices 0..%d are needed", peer, device, GP_MAX_DEVICES - 1);
    gp_registry_lock();
    gp_stack *p = atomic_load(&g_stacks[device]);
    gp_status st = p ? gp_stack_grant_peer(p, peer) : GP_OK;
    if (st == GP_OK) g_peers[device] |= 1ull << peer;
    pthread_mutex_unlock(&g_lock);
    return st;
}

uint64_t gp_registry_peers(int device)
{
    if (device < 0 || device >= GP_MAX_DEVICES) return 0;
    gp_registry_lock();
    uint64_t peers = g_peers[device];
    pthread_mutex_unlock(&g_lock);
    return peers;
}

int gp_registry_on_host(void)
{
    gp_registry_lock();
    int host = g_host_capacity != 0;
    pthread_mutex_unlock(&g_lock);
    return host;
}

/* Whether a device stack exists (g_lock held). */
static int gp_registry_live(void)
{
    int live = 0;
    for (int i = 0; i < GP_MAX_DEVICES; i++) live |= atomic_load(&g_stacks[i]) != NULL;
    return live;
}

int gp_registry_configure(const gp_config *cfg)
{
    gp_registry_lock();
    int live = gp_registry_live();
    if (!live) {
        g_cfg = *cfg;
        g_configured = 1;
    }
    pthread_mutex_unlock(&g_lock);
    return live ? -1 : 0;
}

int gp_registry_use_host(uint64_t capacity)
{
    gp_registry_lock();
    int live = gp_registry_live();
    if (!live) g_host_capacity = capacity;
    pthread_mutex_unlock(&g_lock);
    return live ? -1 : 0;
}

void gp_registry_config(gp_config *out)
{
    gp_registry_lock();
    if (g_configured) *out = g_cfg;
    else gp_config_default(out);
    pthread_mutex_unlock(&g_lock);
}

gp_stack *gp_registry_get(int device)
{
    return device >= 0 && device < GP_MAX_DEVICES ? atomic_load(&g_stacks[device]) : NULL;
}

/* The one place above the pool that asks a device itself: a backend made
 * for the question and destroyed (no memory is reserved or mapped). */
uint64_t gp_registry_device_free(int device)
{
    gp_backend *be;
    uint64_t free_b = 0, total = 0;
    gp_registry_lock();
    uint64_t host = g_host_capacity;
    pthread_mutex_unlock(&g_lock);
    gp_status st = host ? gp_backend_host_create(host, &be) : gp_backend_cuda_create(device, &be);
    if (st != GP_OK) return 0;
    if (be->mem_info(be, &free_b, &total) != GP_OK) free_b = 0;
    be->destroy(be);
    return free_b;
}

const char *gp_registry_error(void) { return g_create_error; }

unsigned long long gp_registry_free_errors(void) { return atomic_load(&g_free_errors); }

void gp_context_set(int tag, int prio, int *old_tag, int *old_prio)
{
    *old_tag = t_tag;
    *old_prio = t_prio;
    t_tag = tag;
    t_prio = prio;
}

void gp_context_set_inherited(int tag, int prio, int *old_tag, int *old_prio)
{
    int old = atomic_exchange(&g_inherited, tag * GP_CTX_PRIO + prio + 1);
    *old_tag = old / GP_CTX_PRIO;
    *old_prio = old % GP_CTX_PRIO - 1;
}

__attribute__((visibility("default"))) void *gpupool_malloc(ssize_t size, int device, void *stream)
{
    if (size <= 0) return NULL; /* PyTorch keeps NULL for empty tensors */
    gp_stack *p = atomic_load_explicit(&g_stacks[device & (GP_MAX_DEVICES - 1)], memory_order_acquire);
    if (!p || device < 0 || device >= GP_MAX_DEVICES) {
        p = gp_registry_stack(device);
        if (!p) {
            char msg[1200];
            snprintf(msg, sizeof msg, "gpupool: cannot create the pool of device %d: %s", device,
                     g_create_error[0] ? g_create_error : gp_last_error());
            fprintf(stderr, "%s\n", msg);
            gp_torch_throw(0, msg); /* does not return when torch's C++ runtime is there */
            return NULL;
        }
    }
    if (__builtin_expect(t_hand.next < t_hand.n, 0) && device == t_hand.device &&
        (uint64_t)size == t_hand.sizes[t_hand.next])
        return t_hand.ptrs[t_hand.next++];
    gp_tag tag;
    int prio;
    int own;
    gp_context(&tag, &prio, &own);
    gp_status st;
    void *r = gp_stack_alloc(p, (size_t)size, stream, tag, prio, &st);
    if (r) return r;
    /* Out of memory and limits are torch.OutOfMemoryError, which callers
     * catch to retry smaller; anything else (a driver error, too many
     * streams) is a RuntimeError, which no retry can cure. */
    int oom = st == GP_ERR_OOM || st == GP_ERR_LIMIT;
    char msg[1200];
    if (oom) {
        /* This allocation's own report (the pool's last may be another
         * thread's by now). */
        char report[GP_OOM_REPORT_MAX];
        snprintf(report, sizeof report, "%s", gp_last_error());
        gp_log_oom(report);
        /* "CUDA out of memory." first: code that matches PyTorch's message
         * (accelerate's batch-size finder, for one) recognises it. */
        snprintf(msg, sizeof msg, "CUDA out of memory. %s", report);
    } else {
        snprintf(msg, sizeof msg, "gpupool: allocation of %zd bytes on device %d failed (%s): %s", size,
                 device, gp_status_str(st), gp_last_error());
        fprintf(stderr, "%s\n", msg);
    }
    gp_torch_throw(oom, msg); /* does not return when torch's C++ runtime is there */
    return NULL;
}

__attribute__((visibility("default"))) void gpupool_free(void *ptr, ssize_t size, int device, void *stream)
{
    (void)size;
    (void)stream;
    if (!ptr) return;
    gp_stack *p = device >= 0 && device < GP_MAX_DEVICES
                      ? atomic_load_explicit(&g_stacks[device], memory_order_acquire) : NULL;
    if (!p) {
        atomic_fetch_add(&g_free_errors, 1);
        fprintf(stderr, "gpupool: free of %p on device %d, which has no gpupool pool\n", ptr, device);
        return;
    }
    gp_status st = gp_stack_free(p, ptr); /* (the tenant's poll too: a free is an allocator call) */
    if (st != GP_OK) {
        /* PyTorch's deleter cannot take an error: count it and say it. */
        atomic_fetch_add(&g_free_errors, 1);
        fprintf(stderr, "%s\n", gp_last_error());
    }
}
