/*
 * test_offload.c -- the offload data path (offload.c) on the host backend:
 * offload and restore keep addresses and bytes and give device memory back;
 * dropped contents; the host limit fails cleanly; a corrupted host copy is
 * caught and the memory stays offloaded; prefetch; the pressure callback
 * offloads idle lower-priority tags only; several tags at once; the pool's
 * integrity after each step.
 */
#include <string.h>

#include "checksum.h"
#include "offload.h"
#include "pool_check.h"

static gp_tag T_W, T_O, T_H;

static void fill(void *ptr, size_t n, unsigned seed)
{
    unsigned char *c = ptr;
    for (size_t i = 0; i < n; i++) c[i] = (unsigned char)(seed * 131u + i * 7u + (i >> 9));
}

static int same(const void *ptr, size_t n, unsigned seed)
{
    const unsigned char *c = ptr;
    for (size_t i = 0; i < n; i++)
        if (c[i] != (unsigned char)(seed * 131u + i * 7u + (i >> 9))) return 0;
    return 1;
}

static gp_pool *pool_with(uint64_t capacity, gp_backend **be)
{
    gp_config cfg;
    gp_config_default(&cfg);
    cfg.chunk = 256 * KiB;
    cfg.small_size = 64 * KiB;
    cfg.large_chunk = 1 * MiB;
    cfg.cache_slack = -1;
    CHECK(gp_backend_host_create(capacity, be) == GP_OK);
    gp_pool *p;
    CHECK(gp_pool_create(*be, &cfg, &p) == GP_OK);
    return p;
}

static int state_of(gp_pool *p, void *ptr)
{
    gp_block_info b;
    return gp_pool_lookup(p, ptr, &b) == GP_OK ? b.state : -1;
}

enum { N = 24 };

static void test_round_trip(void)
{
    gp_backend *be;
    gp_pool *p = pool_with(256 * MiB, &be);
    gp_offloader *o;
    CHECK(gp_offloader_create(p, 0, 3, &o) == GP_OK);
    void *w[N];
    size_t sz[N];
    for (int i = 0; i < N; i++) {
        sz[i] = (size_t)(i % 5 + 1) * 700 * KiB + (size_t)i * 512 + 1;
        w[i] = gp_alloc(p, sz[i], NULL, T_W, GP_PRIO_NORMAL, NULL);
        fill(w[i], sz[i], (unsigned)i);
    }
    void *other = gp_alloc(p, 3 * MiB, NULL, T_O, GP_PRIO_NORMAL, NULL);
    fill(other, 3 * MiB, 77);
    gp_stats s0, s1;
    gp_host_counters c0, c1;
    gp_pool_stats(p, &s0, 0);
    gp_host_counters_get(be, &c0);
    gp_offload_opts opts = {.keep = 1, .codec = GP_CODEC_RAW};
    gp_offload_result r;
    CHECK(gp_offload_tags(o, &T_W, 1, &opts, &r) == GP_OK);
    CHECK(r.bytes > 0 && r.copied > 0 && r.copied <= r.bytes && r.host_bytes >= r.copied && r.released >= r.copied);
    CHECK(r.bytes + r.kept >= 40 * MiB);
    gp_pool_stats(p, &s1, 0);
    gp_host_counters_get(be, &c1);
    CHECK(s1.reserved == s0.reserved - r.released && c1.mapped == c0.mapped - r.released);
    CHECK(s1.offloaded == r.bytes);
    CHECK(gp_offload_is_offloaded(o, T_W) && !gp_offload_is_offloaded(o, T_O));
    gp_offload_stats os;
    gp_offload_stats_get(o, &os);
    CHECK(os.host_bytes == r.host_bytes && os.tag_host_bytes[T_W] == r.host_bytes && os.n_offload == 1);
    CHECK(same(other, 3 * MiB, 77));
    CHECK(pool_consistent(p, be) == 0);
    /* Offloaded memory is really gone from the "device" (the host backend
     * would refuse a copy from it, as a GPU would fault). */
    int gone = 0;
    for (int i = 0; i < N; i++) gone += state_of(p, w[i]) == GP_BLOCK_OFFLOADED;
    CHECK(gone > 0);
    gp_offload_result rr;
    CHECK(gp_restore_tags(o, &T_W, 1, &rr) == GP_OK);
    CHECK(rr.bytes == r.bytes && rr.copied == r.copied);
    for (int i = 0; i < N; i++) CHECK(state_of(p, w[i]) == GP_BLOCK_USED && same(w[i], sz[i], (unsigned)i));
    gp_pool_stats(p, &s1, 0);
    CHECK(s1.offloaded == 0 && s1.allocated == s0.allocated);
    gp_offload_stats_get(o, &os);
    CHECK(os.host_bytes == 0 && os.tag_host_bytes[T_W] == 0 && os.n_restore == 1);
    CHECK(!gp_offload_is_offloaded(o, T_W));
    /* Restoring what is resident does nothing. */
    CHECK(gp_restore_tags(o, &T_W, 1, &rr) == GP_OK && rr.bytes == 0);
    /* A second cycle pins nothing new. */
    uint64_t pins = os.n_pin;
    CHECK(gp_offload_tags(o, &T_W, 1, &opts, &r) == GP_OK && gp_restore_tags(o, &T_W, 1, &rr) == GP_OK);
    gp_offload_stats_get(o, &os);
    CHECK(os.n_pin <= pins + 1); /* (at most the slab grown ahead after the first) */
    CHECK(gp_offload_tags(o, &T_W, 1, &opts, &r) == GP_OK && gp_restore_tags(o, &T_W, 1, &rr) == GP_OK);
    gp_offload_stats s2;
    gp_offload_stats_get(o, &s2);
    CHECK(s2.n_pin == os.n_pin);
    for (int i = 0; i < N; i++) CHECK(same(w[i], sz[i], (unsigned)i));
    CHECK(pool_consistent(p, be) == 0);
    /* Frees while offloaded, then restore. */
    CHECK(gp_offload_tags(o, &T_W, 1, &opts, &r) == GP_OK);
    for (int i = 0; i < N; i += 3) CHECK(gp_free(p, w[i]) == GP_OK);
    CHECK(gp_restore_tags(o, &T_W, 1, &rr) == GP_OK);
    for (int i = 0; i < N; i++) {
        if (i % 3 == 0) continue;
        CHECK(same(w[i], sz[i], (unsigned)i));
        gp_free(p, w[i]);
    }
    gp_free(p, other);
    CHECK(pool_consistent(p, be) == 0);
    gp_offloader_destroy(o);
    done(p);
}

static void test_drop_limit_corrupt(void)
{
    gp_backend *be;
    gp_pool *p = pool_with(256 * MiB, &be);
    gp_offloader *o;
    /* A host limit of 64 MiB: 32 MiB slabs, two of them. */
    CHECK(gp_offloader_create(p, 64 * MiB, 2, &o) == GP_OK);
    void *big = gp_alloc(p, 80 * MiB, NULL, T_W, GP_PRIO_NORMAL, NULL);
    fill(big, 80 * MiB, 3);
    gp_stats s0, s1;
    gp_pool_stats(p, &s0, 0);
    gp_offload_opts opts = {.keep = 1, .codec = GP_CODEC_RAW};
    gp_offload_result r;
    CHECK(gp_offload_tags(o, &T_W, 1, &opts, &r) == GP_ERR_LIMIT);
    CHECK(strstr(gp_last_error(), "GPUPOOL_HOST_LIMIT") != NULL);
    gp_pool_stats(p, &s1, 0);
    CHECK(s1.reserved == s0.reserved && s1.offloaded == 0 && state_of(p, big) == GP_BLOCK_USED);
    CHECK(same(big, 80 * MiB, 3));
    CHECK(pool_consistent(p, be) == 0);
    /* Dropped contents need no host room: the memory comes back, its
     * contents undefined. */
    opts.keep = 0;
    CHECK(gp_offload_tags(o, &T_W, 1, &opts, &r) == GP_OK && r.copied == 0 && r.host_bytes == 0 && r.released > 0);
    gp_offload_result rr;
    CHECK(gp_restore_tags(o, &T_W, 1, &rr) == GP_OK && state_of(p, big) == GP_BLOCK_USED);
    memset(big, 0, 80 * MiB); /* usable again */
    gp_free(p, big);

    /* A corrupted host copy: the restore fails naming the tag, the memory
     * stays offloaded, and comes back once the copy is mended. */
    void *x = gp_alloc(p, 20 * MiB, NULL, T_W, GP_PRIO_NORMAL, NULL);
    fill(x, 20 * MiB, 4);
    opts.keep = 1;
    CHECK(gp_offload_tags(o, &T_W, 1, &opts, &r) == GP_OK);
    CHECK(gp_offload_corrupt_for_test(o, T_W) == GP_OK);
    gp_pool_stats(p, &s0, 0);
    CHECK(gp_restore_tags(o, &T_W, 1, &rr) == GP_ERR_BACKEND);
    CHECK(strstr(gp_last_error(), "checksum") && strstr(gp_last_error(), "'offl'"));
    gp_pool_stats(p, &s1, 0);
    CHECK(state_of(p, x) == GP_BLOCK_OFFLOADED && s1.reserved == s0.reserved);
    CHECK(pool_consistent(p, be) == 0);
    CHECK(gp_offload_corrupt_for_test(o, T_W) == GP_OK); /* flips it back */
    CHECK(gp_restore_tags(o, &T_W, 1, &rr) == GP_OK && same(x, 20 * MiB, 4));
    gp_free(p, x);
    CHECK(pool_consistent(p, be) == 0);
    gp_offloader_destroy(o);
    done(p);
}

static void test_prefetch_multi(void)
{
    gp_backend *be;
    gp_pool *p = pool_with(256 * MiB, &be);
    gp_offloader *o;
    CHECK(gp_offloader_create(p, 0, 4, &o) == GP_OK);
    void *a = gp_alloc(p, 9 * MiB + 3, NULL, T_W, GP_PRIO_NORMAL, NULL);
    void *b = gp_alloc(p, 5 * MiB + 5, NULL, T_O, GP_PRIO_NORMAL, NULL);
    fill(a, 9 * MiB + 3, 8);
    fill(b, 5 * MiB + 5, 9);
    gp_tag both[2] = {T_W, T_O};
    gp_offload_opts opts = {.keep = 1, .codec = GP_CODEC_RAW};
    gp_offload_result r, rr;
    CHECK(gp_offload_tags(o, both, 2, &opts, &r) == GP_OK && state_of(p, a) == GP_BLOCK_OFFLOADED &&
          state_of(p, b) == GP_BLOCK_OFFLOADED);
    /* Restoring one tag of a joint offload brings both back. */
    CHECK(gp_prefetch_tags(o, &T_O, 1) == GP_OK);
    CHECK(gp_restore_tags(o, &T_O, 1, &rr) == GP_OK);
    CHECK(state_of(p, a) == GP_BLOCK_USED && same(a, 9 * MiB + 3, 8) && same(b, 5 * MiB + 5, 9));
    CHECK(!gp_offload_is_offloaded(o, T_W));
    /* A prefetch that fails is reported by the restore that waits for it. */
    CHECK(gp_offload_tags(o, &T_W, 1, &opts, &r) == GP_OK);
    CHECK(gp_offload_corrupt_for_test(o, T_W) == GP_OK);
    CHECK(gp_prefetch_tags(o, &T_W, 1) == GP_OK);
    CHECK(gp_restore_tags(o, &T_W, 1, &rr) == GP_ERR_BACKEND && strstr(gp_last_error(), "checksum"));
    CHECK(gp_offload_corrupt_for_test(o, T_W) == GP_OK);
    CHECK(gp_restore_tags(o, &T_W, 1, &rr) == GP_OK && same(a, 9 * MiB + 3, 8));
    /* Bad input. */
    gp_tag bad = (gp_tag)(GP_MAX_TAGS - 1);
    CHECK(gp_offload_tags(o, &bad, 1, &opts, &r) == GP_ERR_INVALID);
    CHECK(gp_restore_tags(o, NULL, 0, &rr) == GP_ERR_INVALID);
    CHECK(gp_offload_register(o, T_W, 300) == GP_ERR_INVALID);
    gp_free(p, a);
    gp_free(p, b);
    gp_offloader_destroy(o);
    done(p);
}

/* Under pressure an allocation of priority P offloads idle registered tags
 * below P (never a busy one, never its own level), lowest first. */
static void test_pressure(void)
{
    gp_backend *be;
    gp_pool *p = pool_with(64 * MiB, &be);
    gp_offloader *o;
    CHECK(gp_offloader_create(p, 0, 2, &o) == GP_OK);
    void *lo = gp_alloc(p, 20 * MiB, NULL, T_W, GP_PRIO_LOW, NULL);
    void *mid = gp_alloc(p, 20 * MiB, NULL, T_O, GP_PRIO_NORMAL, NULL);
    fill(lo, 20 * MiB, 1);
    fill(mid, 20 * MiB, 2);
    CHECK(gp_offload_register(o, T_W, GP_PRIO_LOW) == GP_OK && gp_offload_register(o, T_O, GP_PRIO_NORMAL) == GP_OK);
    /* T_W busy: a normal request fails rather than take it. */
    CHECK(gp_offload_use(o, T_W, 1) == GP_OK);
    gp_status st;
    void *x = gp_alloc(p, 30 * MiB, NULL, T_H, GP_PRIO_NORMAL, &st);
    CHECK(x == NULL && st == GP_ERR_OOM && state_of(p, lo) == GP_BLOCK_USED);
    /* Idle: the low tag goes; the normal one stays (same level). */
    CHECK(gp_offload_use(o, T_W, 0) == GP_OK);
    x = gp_alloc(p, 30 * MiB, NULL, T_H, GP_PRIO_NORMAL, &st);
    CHECK(x != NULL && state_of(p, lo) == GP_BLOCK_OFFLOADED && state_of(p, mid) == GP_BLOCK_USED);
    gp_offload_stats os;
    gp_offload_stats_get(o, &os);
    CHECK(os.n_pressure == 1);
    CHECK(pool_consistent(p, be) == 0);
    /* A high request may then take the normal tag too. */
    void *y = gp_alloc(p, 25 * MiB, NULL, T_H, GP_PRIO_HIGH, &st);
    CHECK(y != NULL && state_of(p, mid) == GP_BLOCK_OFFLOADED);
    /* Restore with the device full of higher-priority memory fails
     * cleanly, the bytes safe on the host. */
    gp_offload_result rr;
    CHECK(gp_restore_tags(o, &T_W, 1, &rr) == GP_ERR_OOM && state_of(p, lo) == GP_BLOCK_OFFLOADED);
    CHECK(pool_consistent(p, be) == 0);
    gp_free(p, x);
    gp_free(p, y);
    st = gp_restore_tags(o, &T_W, 1, &rr);
    if (st != GP_OK) fprintf(stderr, "restore: %s\n", gp_last_error());
    CHECK(st == GP_OK && same(lo, 20 * MiB, 1));
    CHECK(gp_restore_tags(o, &T_O, 1, &rr) == GP_OK && same(mid, 20 * MiB, 2));
    gp_free(p, lo);
    gp_free(p, mid);
    gp_offloader_destroy(o);
    done(p);
}

/* Memory still offloaded when the offloader goes: no leak, no double
 * unmap when the pool goes. */
static void test_destroy_while_offloaded(void)
{
    gp_backend *be;
    gp_pool *p = pool_with(64 * MiB, &be);
    gp_offloader *o;
    CHECK(gp_offloader_create(p, 0, 1, &o) == GP_OK);
    gp_alloc(p, 6 * MiB, NULL, T_W, GP_PRIO_NORMAL, NULL);
    gp_offload_opts opts = {.keep = 1, .codec = GP_CODEC_RAW};
    gp_offload_result r;
    CHECK(gp_offload_tags(o, &T_W, 1, &opts, &r) == GP_OK);
    CHECK(gp_prefetch_tags(o, &T_W, 1) == GP_OK);
    gp_offloader_destroy(o);
    done(p);
}

int main(void)
{
    CHECK(gp_tag_intern("offl", &T_W) == GP_OK);
    CHECK(gp_tag_intern("other", &T_O) == GP_OK);
    CHECK(gp_tag_intern("hungry", &T_H) == GP_OK);
    test_round_trip();
    test_drop_limit_corrupt();
    test_prefetch_multi();
    test_pressure();
    test_destroy_while_offloaded();
    /* The checksum sees every word, and where it is. */
    uint64_t words[32];
    for (int i = 0; i < 32; i++) words[i] = 0x0101010101010101ull * (unsigned)i;
    uint64_t w0 = gp_checksum(words, sizeof words, 0);
    words[5] ^= 1ull << 63;
    CHECK(gp_checksum(words, sizeof words, 0) != w0);
    words[5] ^= 1ull << 63;
    CHECK(gp_checksum(words, sizeof words, 0) == w0 && gp_checksum(words, sizeof words, 7) != w0);
    uint64_t t = words[3];
    words[3] = words[19];
    words[19] = t;
    CHECK(gp_checksum(words, sizeof words, 0) != w0);
    return check_done();
}
