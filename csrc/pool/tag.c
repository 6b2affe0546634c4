/*
 * tag.c -- tag names interned to small ids, process-wide, so that a block
 * header carries two bytes instead of a string and per-tag figures live in
 * plain arrays indexed by id.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "error.h"

static pthread_mutex_t gp_tag_lock = PTHREAD_MUTEX_INITIALIZER;

/* fork() while another thread interns: the lock is held across the fork,
 * else the child would find it locked for ever (test_fork_while_interning).
 * Nothing is locked under it, so the order against the pools' handlers
 * does not matter. */
static void gp_tag_fork_prepare(void) { pthread_mutex_lock(&gp_tag_lock); }
static void gp_tag_fork_release(void) { pthread_mutex_unlock(&gp_tag_lock); }
static void gp_tag_atfork(void) { pthread_atfork(gp_tag_fork_prepare, gp_tag_fork_release, gp_tag_fork_release); }
static pthread_once_t gp_tag_atfork_once = PTHREAD_ONCE_INIT;
static char gp_tag_names[GP_MAX_TAGS][GP_TAG_NAME_MAX + 1] = {"untagged"};
/* Readers use gp_tag_names[id] without the lock: a name is complete before
 * the count that makes its id valid is published (release/acquire). */
static atomic_uint gp_tag_n = 1;
/* GP_LIFE_* per tag, read on every allocation when placement is on: relaxed
 * atomics, since a lifetime set concurrently with an allocation may apply
 * to it or not. */
static _Atomic unsigned char gp_tag_life[GP_MAX_TAGS];

/* Memory that usually lives for the whole run: these names start long. */
static const char *const gp_long_names[] = {
    "weights", "parameters", "params", "buffers", "lora", "optimizer",
    "optimizer_state", "kv_cache", NULL,
};

static int gp_long_name(const char *name)
{
    for (int i = 0; gp_long_names[i]; i++)
        if (strcmp(name, gp_long_names[i]) == 0) return 1;
    return 0;
}

static int gp_tag_name_ok(const char *name, size_t n)
{
    if (n == 0 || n > GP_TAG_NAME_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if (name[i] < 0x21 || name[i] > 0x7e) return 0;
    return 1;
}

gp_status gp_tag_intern(const char *name, gp_tag *out)
{
    size_t n = name ? strlen(name) : 0;
    if (!gp_tag_name_ok(name ? name : "", n))
        return gp_error_set(GP_ERR_INVALID,
                            "tag name '%.80s' is not valid: expected 1 to %d printable "
                            "characters without spaces", name ? name : "(null)", GP_TAG_NAME_MAX);
    pthread_once(&gp_tag_atfork_once, gp_tag_atfork);
    pthread_mutex_lock(&gp_tag_lock);
    unsigned count = atomic_load_explicit(&gp_tag_n, memory_order_relaxed);
    for (unsigned i = 0; i < count; i++) {
        if (strcmp(gp_tag_names[i], name) == 0) {
            pthread_mutex_unlock(&gp_tag_lock);
            *out = (gp_tag)i;
            return GP_OK;
        }
    }
    if (count == GP_MAX_TAGS) {
        pthread_mutex_unlock(&gp_tag_lock);
        return gp_error_set(GP_ERR_TOO_MANY,
                            "cannot create tag '%s': all %d tags are in use (tags live for "
                            "the whole process; reuse names rather than making one per step)",
                            name, GP_MAX_TAGS);
    }
    memcpy(gp_tag_names[count], name, n + 1);
    atomic_store_explicit(&gp_tag_life[count], gp_long_name(name) ? GP_LIFE_LONG : GP_LIFE_SHORT,
                          memory_order_relaxed);
    atomic_store_explicit(&gp_tag_n, count + 1, memory_order_release);
    pthread_mutex_unlock(&gp_tag_lock);
    *out = (gp_tag)count;
    return GP_OK;
}

const char *gp_tag_name(gp_tag tag)
{
    return tag < atomic_load_explicit(&gp_tag_n, memory_order_acquire) ? gp_tag_names[tag] : NULL;
}

unsigned gp_tag_count(void) { return atomic_load_explicit(&gp_tag_n, memory_order_acquire); }

gp_status gp_tag_set_lifetime(gp_tag tag, int lifetime)
{
    if (!gp_tag_name(tag))
        return gp_error_set(GP_ERR_INVALID, "gpupool: tag id %u was never interned", (unsigned)tag);
    if (lifetime != GP_LIFE_SHORT && lifetime != GP_LIFE_LONG)
        return gp_error_set(GP_ERR_INVALID, "gpupool: lifetime %d of tag '%s' is not valid: expected "
                            "%d (short) or %d (long)", lifetime, gp_tag_name(tag), GP_LIFE_SHORT,
                            GP_LIFE_LONG);
    atomic_store_explicit(&gp_tag_life[tag], (unsigned char)lifetime, memory_order_relaxed);
    return GP_OK;
}

int gp_tag_lifetime(gp_tag tag)
{
    return tag < GP_MAX_TAGS ? atomic_load_explicit(&gp_tag_life[tag], memory_order_relaxed) : GP_LIFE_SHORT;
}
