/*
 * test_config.c -- unit tests of the options (config.c): every GPUPOOL_*
 * option with good and bad values, the words of the error messages, sizes
 * at their edges, the environment (unknown variables included), printing
 * and parsing back.  Run under ASan and UBSan by the test suite.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "codec.h"
#include "error.h"
#include "check.h"
#include "rng.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define GiB (1ull << 30)
#define TiB (1ull << 40)

extern char **environ;

static int cfg_eq(const gp_config *a, const gp_config *b)
{
    return a->mode == b->mode && a->reserve.bytes == b->reserve.bytes &&
           a->reserve.fraction == b->reserve.fraction && a->limit.bytes == b->limit.bytes &&
           a->limit.fraction == b->limit.fraction && a->priority == b->priority &&
           strcmp(a->codec, b->codec) == 0 && strcmp(a->nvcomp, b->nvcomp) == 0 &&
           a->offload_threads == b->offload_threads &&
           strcmp(a->tenant, b->tenant) == 0 && a->log == b->log && a->trace == b->trace &&
           a->chunk == b->chunk && a->small_size == b->small_size &&
           a->large_chunk == b->large_chunk && a->cache_slack == b->cache_slack &&
           a->torch_patch == b->torch_patch && a->placement == b->placement && a->debug == b->debug &&
           a->device_limit.bytes == b->device_limit.bytes &&
           a->device_limit.fraction == b->device_limit.fraction &&
           a->reclaim_timeout_ms == b->reclaim_timeout_ms && a->tenant_turn_ms == b->tenant_turn_ms &&
           a->tenant_share == b->tenant_share;
}

static int has(const char *needle) { return strstr(gp_last_error(), needle) != NULL; }

/* A folder holding a stand-in libnvcomp.so.6 (an ELF header, nothing more),
 * and a file that is not a library: what GPUPOOL_NVCOMP is checked against. */
static char nv_dir[64], nv_lib[96], nv_text[96];

static void write_file(const char *path, const char *bytes, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fwrite(bytes, 1, n, f) == n);
    fclose(f);
}

static void make_nvcomp(void)
{
    snprintf(nv_dir, sizeof nv_dir, "/tmp/gp_test_config_XXXXXX");
    CHECK(mkdtemp(nv_dir) != NULL);
    snprintf(nv_lib, sizeof nv_lib, "%s/libnvcomp.so.6", nv_dir);
    snprintf(nv_text, sizeof nv_text, "%s/notes.txt", nv_dir);
    write_file(nv_lib, "\x7f" "ELF\2\1\1", 7);
    write_file(nv_text, "root:x:0:0\n", 11);
}

static void remove_nvcomp(void)
{
    unlink(nv_lib);
    unlink(nv_text);
    rmdir(nv_dir);
}

/* Set `name` to `value` on a default config; 1 when accepted. */
static int set_ok(gp_config *cfg, const char *name, const char *value)
{
    gp_config_default(cfg);
    return gp_config_set(cfg, name, value) == GP_OK;
}

/* A bad value is refused, the config is left as it was, and the message
 * names the variable and quotes the value. */
static int set_bad(const char *name, const char *value)
{
    gp_config cfg, before;
    gp_config_default(&cfg);
    CHECK(gp_config_set(&cfg, "tenant", "team-a") == GP_OK);
    before = cfg;
    gp_error_clear();
    if (gp_config_set(&cfg, name, value) != GP_ERR_INVALID) return 0;
    char quoted[128];
    snprintf(quoted, sizeof quoted, "='%s'", value);
    size_t n;
    const gp_option_info *o = gp_config_options(&n);
    int named = 0;
    for (size_t i = 0; i < n; i++) named |= strcmp(o[i].key, name) == 0 && has(o[i].env);
    int ok = cfg_eq(&cfg, &before) && named && has(quoted) && has("is not valid");
    if (!ok) fprintf(stderr, "  set_bad(%s, '%s'): %s\n", name, value, gp_last_error());
    return ok;
}

static int size_is(const char *text, int frac, uint64_t bytes, double fraction)
{
    gp_size_spec s = {12345, 0.5};
    if (gp_parse_size(text, frac, &s) != GP_OK) {
        fprintf(stderr, "  size '%s' refused: %s\n", text, gp_last_error());
        return 0;
    }
    double d = s.fraction - fraction;
    return s.bytes == bytes && d < 1e-12 && d > -1e-12;
}

static int size_bad(const char *text, int frac)
{
    gp_size_spec s = {12345, 0.5};
    gp_error_clear();
    return gp_parse_size(text, frac, &s) == GP_ERR_INVALID && s.bytes == 12345 &&
           s.fraction == 0.5 && has("is not a valid size") && has("expected a");
}

static int get_is(const gp_config *cfg, const char *name, const char *want)
{
    char buf[128];
    if (gp_config_get(cfg, name, buf, sizeof buf) != GP_OK) return 0;
    if (strcmp(buf, want) != 0) fprintf(stderr, "  get(%s) = '%s', want '%s'\n", name, buf, want);
    return strcmp(buf, want) == 0;
}

/* Remove every GPUPOOL_* variable (in any letter case), so that the caller's environment (a test
 * knob, a user setting) does not leak into the tests. */
static void clear_env(void)
{
    for (int again = 1; again;) {
        again = 0;
        for (char **e = environ; *e; e++) {
            if (strncasecmp(*e, "GPUPOOL_", 8) == 0) {
                char name[256];
                size_t k = strcspn(*e, "=");
                snprintf(name, sizeof name, "%.*s", (int)k, *e);
                unsetenv(name);
                again = 1; /* environ changed under us */
                break;
            }
        }
    }
}

static void test_table(void)
{
    size_t n = 0;
    const gp_option_info *o = gp_config_options(&n);
    const char *keys[] = {"mode", "reserve", "limit", "priority", "codec", "nvcomp", "offload_threads",
                          "tenant", "log", "trace", "chunk", "small_size", "torch_patch",
                          "placement", "large_chunk", "cache_slack", "host_limit", "host_reserve", "debug",
                          "device_limit", "reclaim_timeout", "tenant_turn", "tenant_share", "tenant_swap"};
    CHECK(n == sizeof keys / sizeof keys[0]);
    gp_config cfg;
    gp_config_default(&cfg);
    for (size_t i = 0; i < n; i++) {
        CHECK(o[i].env && o[i].key && o[i].def && o[i].accepted && o[i].help);
        CHECK(*o[i].def && *o[i].accepted && *o[i].help);
        /* The variable is GPUPOOL_ and the keyword in upper case. */
        char env[64] = "GPUPOOL_";
        for (size_t j = 0; o[i].key[j] && j < 40; j++)
            env[8 + j] = (char)(o[i].key[j] >= 'a' && o[i].key[j] <= 'z' ? o[i].key[j] - 32 : o[i].key[j]);
        CHECK(strcmp(env, o[i].env) == 0);
        /* The documented default is what gp_config_default gives: its
         * first word (a note may follow, as the reserve's). */
        char def[64];
        snprintf(def, sizeof def, "%.*s", (int)strcspn(o[i].def, " "), o[i].def);
        CHECK(get_is(&cfg, o[i].key, def));
    }
    CHECK(strstr(o[1].def, "80%") != NULL);
    for (size_t i = 0; i < n && i < sizeof keys / sizeof keys[0]; i++) CHECK(strcmp(o[i].key, keys[i]) == 0);
}

static void test_defaults(void)
{
    gp_config c;
    memset(&c, 0xab, sizeof c);
    gp_config_default(&c);
    CHECK(c.mode == GP_MODE_EXPANDABLE);
    CHECK(c.reserve.bytes == 0 && c.reserve.fraction == 0);
    CHECK(c.limit.bytes == 0 && c.limit.fraction == 0);
    CHECK(c.priority == GP_PRIO_NORMAL);
    CHECK(strcmp(c.codec, "auto") == 0 && c.nvcomp[0] == '\0');
    CHECK(c.offload_threads == 8);
    CHECK(c.tenant[0] == '\0');
    CHECK(c.log == GP_LOG_OOM);
    CHECK(c.trace == 0);
    CHECK(c.chunk == 2 * MiB);
    CHECK(c.small_size == 1 * MiB);
    CHECK(c.large_chunk == 64 * MiB);
    CHECK(c.cache_slack == 0.05);
    CHECK(c.torch_patch == 1);
    CHECK(c.debug == 0);
    CHECK(c.device_limit.bytes == 0 && c.device_limit.fraction == 0);
    CHECK(c.reclaim_timeout_ms == 30000);
    CHECK(c.tenant_turn_ms == 1000 && c.tenant_share == 0.25);
    CHECK(c.placement == GP_PLACE_LIFETIME);
    CHECK(c.host_limit.bytes == 0 && c.host_limit.fraction == 0.5);
    /* Defaults are not given options: a reserve still implies reserve mode,
     * a large chunk below the chunk is still raised silently. */
    CHECK(c.mode_given == 0 && c.large_chunk_given == 0);
    CHECK(set_ok(&c, "reserve", "1GiB") && c.mode == GP_MODE_RESERVE);
}

static void test_sizes(void)
{
    CHECK(size_is("4096", 0, 4096, 0));
    CHECK(size_is("0", 1, 0, 0));
    CHECK(size_is("0MiB", 0, 0, 0));
    CHECK(size_is("1B", 0, 1, 0));
    CHECK(size_is("7b", 0, 7, 0));
    CHECK(size_is("1K", 0, KiB, 0));
    CHECK(size_is("1k", 0, KiB, 0));
    CHECK(size_is("1KiB", 0, KiB, 0));
    CHECK(size_is("1kib", 0, KiB, 0));
    CHECK(size_is("1KB", 0, 1000, 0));
    CHECK(size_is("1kB", 0, 1000, 0));
    CHECK(size_is("1M", 0, MiB, 0));
    CHECK(size_is("512MiB", 0, 512 * MiB, 0));
    CHECK(size_is("1MB", 0, 1000000, 0));
    CHECK(size_is("1G", 0, GiB, 0));
    CHECK(size_is("1GIB", 0, GiB, 0));
    CHECK(size_is("20GB", 0, 20000000000ull, 0));
    CHECK(size_is("1T", 0, TiB, 0));
    CHECK(size_is("1TiB", 0, TiB, 0));
    CHECK(size_is("1TB", 0, 1000000000000ull, 0));
    CHECK(size_is("1.5GiB", 0, 3 * GiB / 2, 0));
    CHECK(size_is("1.5 GiB", 0, 3 * GiB / 2, 0));
    CHECK(size_is("2  MiB", 0, 2 * MiB, 0));
    CHECK(size_is("0.5KB", 0, 500, 0));
    CHECK(size_is("0.1KiB", 0, 102, 0)); /* 102.4, rounded down */
    CHECK(size_is("1.999B", 0, 1, 0));
    CHECK(size_is("0.000001TB", 0, 1000000, 0));
    CHECK(size_is("1.0000000000000000000000001KiB", 0, KiB, 0));
    CHECK(size_is("007MiB", 0, 7 * MiB, 0));
    CHECK(size_is("80%", 1, 0, 0.8));
    CHECK(size_is("100%", 1, 0, 1.0));
    CHECK(size_is("0.5%", 1, 0, 0.005));
    CHECK(size_is("12.5 %", 1, 0, 0.125));
    CHECK(size_is("0.8", 1, 0, 0.8));
    CHECK(size_is("1.0", 1, 0, 1.0));
    CHECK(size_is("0.333333333333333333333333", 1, 0, 1.0 / 3));
    /* The largest size is 2^63-1 bytes. */
    CHECK(size_is("9223372036854775807", 0, 9223372036854775807ull, 0));
    CHECK(size_is("8388607TiB", 0, 8388607ull * TiB, 0));
    CHECK(size_is("8388607.999999TiB", 0, 8388607ull * TiB + 999999ull * TiB / 1000000, 0));
    CHECK(size_bad("9223372036854775808", 0));
    CHECK(size_bad("8388608TiB", 0));
    CHECK(size_bad("9223372036854775.808KB", 0));
    CHECK(size_bad("18446744073709551616", 0));
    CHECK(size_bad("99999999999999999999999999GiB", 0));
    /* Malformed. */
    CHECK(size_bad("", 1));
    CHECK(size_bad("-1", 1));
    CHECK(size_bad("-1GiB", 1));
    CHECK(size_bad("+1", 1));
    CHECK(size_bad(" 1", 1));
    CHECK(size_bad("1 ", 1));
    CHECK(size_bad("1MiB ", 1));
    CHECK(size_bad("1MiBx", 1));
    CHECK(size_bad("12XB", 1) && has("'12XB'") && has("unknown unit 'XB'"));
    CHECK(size_bad("1KI", 1));
    CHECK(size_bad("1EiB", 1));
    CHECK(size_bad("nan", 1));
    CHECK(size_bad("inf", 1));
    CHECK(size_bad("NaN%", 1));
    CHECK(size_bad("1e3", 1));
    CHECK(size_bad("0x10", 1));
    CHECK(size_bad(".5", 1));
    CHECK(size_bad("5.", 1));
    CHECK(size_bad("5.GiB", 1));
    CHECK(size_bad("1..5", 1));
    CHECK(size_bad("1.2.3", 1));
    CHECK(size_bad("1,5GiB", 1)); /* no locale's decimal comma */
    CHECK(size_bad("MiB", 1));
    CHECK(size_bad("%", 1));
    CHECK(size_bad("1%%", 1));
    CHECK(size_bad("0.1B", 1) && has("less than one byte"));
    /* Fractions and percentages: in (0, 1] and (0%, 100%]. */
    CHECK(size_bad("0%", 1));
    CHECK(size_bad("0.0%", 1));
    CHECK(size_bad("100.1%", 1));
    CHECK(size_bad("101%", 1));
    CHECK(size_bad("0.0", 1));
    CHECK(size_bad("1.5", 1));
    CHECK(size_bad("1.0000001", 1));
    /* Only where fractions are allowed; the message then does not offer them. */
    CHECK(size_bad("80%", 0) && !has("80%,") && has("512MiB"));
    CHECK(size_bad("0.8", 0));
    CHECK(size_bad("1.0", 0));
    gp_size_spec s;
    CHECK(gp_parse_size(NULL, 1, &s) == GP_ERR_INVALID);
    CHECK(gp_parse_size("1", 1, NULL) == GP_ERR_INVALID);
    /* A long value is quoted cut short, and the message still says why. */
    char big[300];
    memset(big, '7', sizeof big - 2);
    big[sizeof big - 2] = 'X';
    big[sizeof big - 1] = '\0';
    CHECK(size_bad(big, 1) && has("...'") && has("expected"));
}

static void test_resolve(void)
{
    CHECK(gp_size_resolve((gp_size_spec){0, 0}, 100 * GiB) == 0);
    CHECK(gp_size_resolve((gp_size_spec){4096, 0}, 100 * GiB) == 4096);
    CHECK(gp_size_resolve((gp_size_spec){4096, 0.5}, 100 * GiB) == 4096);
    CHECK(gp_size_resolve((gp_size_spec){0, 0.5}, 100 * GiB) == 50 * GiB);
    CHECK(gp_size_resolve((gp_size_spec){0, 0.8}, 80 * GiB) == 64 * GiB);
    CHECK(gp_size_resolve((gp_size_spec){0, 0.8}, 10) == 8);
    CHECK(gp_size_resolve((gp_size_spec){0, 0.25}, 3) == 0); /* rounded down */
    CHECK(gp_size_resolve((gp_size_spec){0, 1.0}, UINT64_MAX) == UINT64_MAX);
    CHECK(gp_size_resolve((gp_size_spec){0, 0.9999999999999999}, UINT64_MAX) <= UINT64_MAX);
    CHECK(gp_size_resolve((gp_size_spec){0, 0.5}, 0) == 0);
    CHECK(gp_size_resolve((gp_size_spec){0, -0.5}, 100) == 0);
    gp_size_spec p;
    CHECK(gp_parse_size("80%", 1, &p) == GP_OK && gp_size_resolve(p, 80 * GiB) == 64 * GiB);
    CHECK(gp_parse_size("0.7", 1, &p) == GP_OK && gp_size_resolve(p, 100) == 70);
}

static void test_priority(void)
{
    int p = -7;
    CHECK(gp_parse_priority("low", &p) == GP_OK && p == GP_PRIO_LOW);
    CHECK(gp_parse_priority("normal", &p) == GP_OK && p == GP_PRIO_NORMAL);
    CHECK(gp_parse_priority("high", &p) == GP_OK && p == GP_PRIO_HIGH);
    CHECK(gp_parse_priority("critical", &p) == GP_OK && p == GP_PRIO_CRITICAL);
    CHECK(gp_parse_priority("HIGH", &p) == GP_OK && p == GP_PRIO_HIGH);
    CHECK(gp_parse_priority("Critical", &p) == GP_OK && p == GP_PRIO_CRITICAL);
    CHECK(gp_parse_priority("0", &p) == GP_OK && p == 0);
    CHECK(gp_parse_priority("255", &p) == GP_OK && p == 255);
    CHECK(gp_parse_priority("007", &p) == GP_OK && p == 7);
    p = -7;
    const char *bad[] = {"256", "-1", "+1", "", " 1", "1 ", "1x", "urgent", "lowest",
                         "99999999999999999999", "2.0", "0x10", NULL};
    for (int i = 0; bad[i]; i++) {
        char quoted[64];
        snprintf(quoted, sizeof quoted, "'%s'", bad[i]);
        CHECK(gp_parse_priority(bad[i], &p) == GP_ERR_INVALID && p == -7 && has(quoted) &&
              has("critical"));
    }
    CHECK(gp_parse_priority(NULL, &p) == GP_ERR_INVALID);
    CHECK(gp_parse_priority("low", NULL) == GP_ERR_INVALID);
    CHECK(strcmp(gp_priority_name(GP_PRIO_LOW), "low") == 0);
    CHECK(strcmp(gp_priority_name(GP_PRIO_NORMAL), "normal") == 0);
    CHECK(strcmp(gp_priority_name(GP_PRIO_HIGH), "high") == 0);
    CHECK(strcmp(gp_priority_name(GP_PRIO_CRITICAL), "critical") == 0);
    CHECK(gp_priority_name(4) == NULL && gp_priority_name(255) == NULL && gp_priority_name(-1) == NULL);
}

static void test_options(void)
{
    gp_config c;
    /* mode */
    CHECK(set_ok(&c, "mode", "reserve") && c.mode == GP_MODE_RESERVE);
    CHECK(set_ok(&c, "mode", "EXPANDABLE") && c.mode == GP_MODE_EXPANDABLE);
    CHECK(set_bad("mode", "fast") && has("expandable or reserve"));
    CHECK(set_bad("mode", ""));
    CHECK(set_bad("mode", "reserve "));
    /* reserve */
    CHECK(set_ok(&c, "reserve", "20GiB") && c.reserve.bytes == 20 * GiB && c.reserve.fraction == 0);
    CHECK(set_ok(&c, "reserve", "50%") && c.reserve.bytes == 0 && c.reserve.fraction == 0.5);
    CHECK(set_ok(&c, "reserve", "0.9") && c.reserve.fraction == 0.9);
    CHECK(set_ok(&c, "reserve", "none") && c.reserve.bytes == 0 && c.reserve.fraction == 0);
    CHECK(set_bad("reserve", "120%"));
    CHECK(set_bad("reserve", "lots"));
    /* limit: a later value replaces an earlier one entirely */
    gp_config_default(&c);
    CHECK(gp_config_set(&c, "limit", "80%") == GP_OK && c.limit.fraction == 0.8);
    CHECK(gp_config_set(&c, "limit", "1GiB") == GP_OK && c.limit.bytes == GiB && c.limit.fraction == 0);
    CHECK(gp_config_set(&c, "limit", "NONE") == GP_OK && c.limit.bytes == 0 && c.limit.fraction == 0);
    CHECK(gp_config_set(&c, "limit", "0") == GP_OK && c.limit.bytes == 0 && c.limit.fraction == 0);
    CHECK(set_bad("limit", "12XB") && has("GPUPOOL_LIMIT='12XB' is not valid") &&
          has("expected a size such as 512MiB, 20GB, 4096, 80% or 0.8") && has("unknown unit"));
    CHECK(set_bad("limit", "-5GiB"));
    CHECK(set_bad("limit", "0%"));
    CHECK(set_bad("limit", "") && has("empty"));
    CHECK(set_bad("limit", "none please"));
    /* priority */
    CHECK(set_ok(&c, "priority", "critical") && c.priority == GP_PRIO_CRITICAL);
    CHECK(set_ok(&c, "priority", "200") && c.priority == 200);
    CHECK(set_bad("priority", "urgent") && has("0..255"));
    CHECK(set_bad("priority", "256"));
    /* codec: codec.h's names, stored in their canonical spelling */
    for (int i = 0; i < GP_CODEC_COUNT; i++) {
        const char *name = gp_codec_id_name((gp_codec_id)i);
        CHECK(set_ok(&c, "codec", name) && strcmp(c.codec, name) == 0);
    }
    CHECK(set_ok(&c, "codec", "Bitcomp") && strcmp(c.codec, "bitcomp") == 0);
    CHECK(set_bad("codec", "gzip") && has("GPUPOOL_CODEC") && has("one of: raw auto zstd ans bitcomp"));
    CHECK(strstr(gp_last_error(), "is not known") == NULL); /* the codec's own words do not leak in */
    CHECK(set_bad("codec", "none"));
    CHECK(set_bad("codec", "ans "));
    /* nvcomp: a shared library, or a folder holding libnvcomp.so.6; it fits */
    CHECK(set_ok(&c, "nvcomp", nv_dir) && strcmp(c.nvcomp, nv_dir) == 0);
    CHECK(set_ok(&c, "nvcomp", nv_lib) && strcmp(c.nvcomp, nv_lib) == 0);
    CHECK(set_ok(&c, "nvcomp", "none") && c.nvcomp[0] == '\0');
    CHECK(set_bad("nvcomp", "/nonexistent/libnvcomp.so.6") && has("No such file"));
    /* Any existing path was accepted: /etc/passwd, ".", a folder without it. */
    CHECK(set_bad("nvcomp", nv_text) && has("not a shared library") && has("libnvcomp.so.6 (a shared library)"));
    CHECK(set_bad("nvcomp", ".") && has("the folder holds no libnvcomp.so.6"));
    CHECK(set_bad("nvcomp", "/") && has("the folder holds no libnvcomp.so.6"));
    CHECK(set_bad("nvcomp", "/dev/null") && has("neither a file nor a folder"));
    char long_path[GP_PATH_MAX + 1];
    memset(long_path, 'x', GP_PATH_MAX);
    long_path[GP_PATH_MAX] = '\0';
    gp_config_default(&c);
    CHECK(gp_config_set(&c, "nvcomp", long_path) == GP_ERR_INVALID && has("GPUPOOL_NVCOMP") && has("at most 1023") &&
          c.nvcomp[0] == '\0');

    /* offload_threads */
    CHECK(set_ok(&c, "offload_threads", "1") && c.offload_threads == 1);
    CHECK(set_ok(&c, "offload_threads", "64") && c.offload_threads == 64);
    CHECK(set_bad("offload_threads", "0") && has("1..64"));
    CHECK(set_bad("offload_threads", "65"));
    CHECK(set_bad("offload_threads", "-1"));
    CHECK(set_bad("offload_threads", "4x"));
    CHECK(set_bad("offload_threads", "4.0"));
    CHECK(set_bad("offload_threads", "99999999999999999999"));
    /* tenant */
    CHECK(set_ok(&c, "tenant", "job-42_a.b") && strcmp(c.tenant, "job-42_a.b") == 0);
    char t63[64], t64[65];
    memset(t63, 'x', 63);
    t63[63] = '\0';
    memset(t64, 'y', 64);
    t64[64] = '\0';
    CHECK(set_ok(&c, "tenant", t63) && strcmp(c.tenant, t63) == 0);
    CHECK(set_bad("tenant", t64));
    CHECK(set_bad("tenant", "a b"));
    CHECK(set_bad("tenant", "a/b"));
    CHECK(set_bad("tenant", "caf\xc3\xa9"));
    CHECK(set_bad("tenant", ""));
    /* log */
    CHECK(set_ok(&c, "log", "off") && c.log == GP_LOG_OFF);
    CHECK(set_ok(&c, "log", "oom") && c.log == GP_LOG_OOM);
    CHECK(set_ok(&c, "log", "ALL") && c.log == GP_LOG_ALL);
    CHECK(set_bad("log", "verbose") && has("off, oom or all"));
    CHECK(set_bad("log", "2"));
    /* placement */
    CHECK(set_ok(&c, "placement", "none") && c.placement == GP_PLACE_NONE);
    CHECK(set_ok(&c, "GPUPOOL_PLACEMENT", "Lifetime") && c.placement == GP_PLACE_LIFETIME);
    CHECK(set_bad("placement", "long") && has("lifetime or none"));
    CHECK(set_bad("placement", "1"));
    /* trace and torch_patch: booleans */
    const char *yes[] = {"1", "true", "yes", "on", "TRUE", "Yes", "ON", NULL};
    const char *no[] = {"0", "false", "no", "off", "False", "NO", "Off", NULL};
    for (int i = 0; yes[i]; i++) {
        CHECK(set_ok(&c, "trace", yes[i]) && c.trace == 1);
        CHECK(set_ok(&c, "torch_patch", yes[i]) && c.torch_patch == 1);
        CHECK(set_ok(&c, "GPUPOOL_DEBUG", yes[i]) && c.debug == 1);
    }
    for (int i = 0; no[i]; i++) {
        CHECK(set_ok(&c, "trace", no[i]) && c.trace == 0);
        CHECK(set_ok(&c, "torch_patch", no[i]) && c.torch_patch == 0);
        CHECK(set_ok(&c, "debug", no[i]) && c.debug == 0);
    }
    const char *notbool[] = {"2", "maybe", "y", "n", "01", "", " 1", NULL};
    for (int i = 0; notbool[i]; i++) {
        CHECK(set_bad("trace", notbool[i]));
        CHECK(set_bad("torch_patch", notbool[i]));
        CHECK(set_bad("debug", notbool[i]));
    }
    /* chunk: absolute, a power of two in [64KiB, 1GiB] */
    CHECK(set_ok(&c, "chunk", "64KiB") && c.chunk == 64 * KiB);
    CHECK(set_ok(&c, "chunk", "1GiB") && c.chunk == GiB);
    CHECK(set_ok(&c, "chunk", "4194304") && c.chunk == 4 * MiB);
    CHECK(set_bad("chunk", "3MiB") && has("power of two"));
    CHECK(set_bad("chunk", "32KiB"));
    CHECK(set_bad("chunk", "2GiB"));
    CHECK(set_bad("chunk", "2MB"));
    CHECK(set_bad("chunk", "50%"));
    CHECK(set_bad("chunk", "0.5"));
    CHECK(set_bad("chunk", "0"));
    /* small_size: absolute, in [4KiB, 64MiB] */
    CHECK(set_ok(&c, "small_size", "4KiB") && c.small_size == 4 * KiB);
    CHECK(set_ok(&c, "small_size", "64MiB") && c.small_size == 64 * MiB);
    CHECK(set_ok(&c, "small_size", "100000") && c.small_size == 100000);
    CHECK(set_bad("small_size", "4095"));
    CHECK(set_bad("small_size", "65MiB"));
    CHECK(set_bad("small_size", "10%"));
    CHECK(set_bad("small_size", "none"));
    /* large_chunk: as chunk */
    CHECK(set_ok(&c, "large_chunk", "32MiB") && c.large_chunk == 32 * MiB);
    CHECK(set_ok(&c, "GPUPOOL_LARGE_CHUNK", "1GiB") && c.large_chunk == GiB);
    CHECK(set_bad("large_chunk", "48MiB") && has("power of two"));
    CHECK(set_bad("large_chunk", "2GiB"));
    CHECK(set_bad("large_chunk", "5%"));
    CHECK(set_ok(&c, "large_chunk", "64MiB") && c.large_chunk_given);
    gp_config_default(&c);
    CHECK(!c.large_chunk_given);
    /* cache_slack: a fraction of allocated bytes, 0 or none; never bytes */
    CHECK(set_ok(&c, "cache_slack", "10%") && c.cache_slack == 0.1);
    CHECK(set_ok(&c, "cache_slack", "0.25") && c.cache_slack == 0.25);
    CHECK(set_ok(&c, "cache_slack", "0") && c.cache_slack == 0);
    CHECK(set_ok(&c, "cache_slack", "None") && c.cache_slack < 0);
    CHECK(set_bad("cache_slack", "512MiB") && has("not a fraction"));
    CHECK(set_bad("cache_slack", "150%"));
    CHECK(set_bad("cache_slack", "-5%"));
    CHECK(set_bad("cache_slack", "lots"));
    /* device_limit: a size as limit's */
    CHECK(set_ok(&c, "device_limit", "24GiB") && c.device_limit.bytes == 24 * GiB);
    CHECK(set_ok(&c, "device_limit", "30%") && c.device_limit.fraction == 0.3);
    CHECK(set_ok(&c, "device_limit", "none") && c.device_limit.bytes == 0 && c.device_limit.fraction == 0);
    CHECK(set_bad("device_limit", "lots"));
    CHECK(set_bad("device_limit", "-1GiB"));
    /* host_limit: a size, at least one 32 MiB pinned slab (2 bytes was taken) */
    CHECK(set_ok(&c, "host_limit", "32MiB") && c.host_limit.bytes == 32 * MiB);
    CHECK(set_ok(&c, "host_limit", "25%") && c.host_limit.fraction == 0.25);
    CHECK(set_ok(&c, "host_limit", "0") && c.host_limit.bytes == 0 && c.host_limit.fraction == 0);
    CHECK(set_bad("host_limit", "2") && has("less than 32MiB") && has("at least 32MiB"));
    CHECK(set_bad("host_limit", "32MiB1"));
    CHECK(set_bad("host_limit", "33554431") && has("at least 32MiB"));
    /* host_reserve: a size or a share of host memory, 0 by default, at most
     * the host limit (whichever is given last is refused) */
    CHECK(c.host_reserve.bytes == 0 && c.host_reserve.fraction == 0);
    CHECK(set_ok(&c, "host_reserve", "8GiB") && c.host_reserve.bytes == 8 * GiB);
    CHECK(get_is(&c, "host_reserve", "8GiB"));
    CHECK(set_ok(&c, "GPUPOOL_HOST_RESERVE", "10%") && c.host_reserve.fraction == 0.1);
    CHECK(set_ok(&c, "host_reserve", "50%") && c.host_reserve.fraction == 0.5); /* (the default limit) */
    CHECK(set_ok(&c, "host_reserve", "0") && c.host_reserve.bytes == 0 && get_is(&c, "host_reserve", "0"));
    CHECK(set_ok(&c, "host_reserve", "none") && c.host_reserve.bytes == 0 && get_is(&c, "host_reserve", "0"));
    gp_config_default(&c);
    CHECK(gp_config_set(&c, "host_reserve", "60%") == GP_ERR_INVALID && has("GPUPOOL_HOST_RESERVE=60%") &&
          has("above GPUPOOL_HOST_LIMIT=50%") && has("expected at most the limit"));
    CHECK(c.host_reserve.fraction == 0);
    CHECK(set_bad("host_reserve", "lots") && has("a size such as"));
    CHECK(set_bad("host_reserve", "-1GiB"));
    {
        gp_config r;
        gp_config_default(&r);
        CHECK(gp_config_set(&r, "host_limit", "1GiB") == GP_OK);
        CHECK(gp_config_set(&r, "host_reserve", "1GiB") == GP_OK);  /* equal: fits */
        CHECK(gp_config_set(&r, "host_reserve", "2GiB") == GP_ERR_INVALID && has("HOST_RESERVE=2GiB") &&
              has("(2147483648 bytes)") && has("GPUPOOL_HOST_LIMIT=1GiB (1073741824 bytes)"));
        CHECK(r.host_reserve.bytes == GiB); /* (as it was) */
        CHECK(gp_config_set(&r, "host_limit", "512MiB") == GP_ERR_INVALID && has("above GPUPOOL_HOST_LIMIT=512MiB"));
        CHECK(r.host_limit.bytes == GiB);
        CHECK(gp_config_set(&r, "host_limit", "none") == GP_OK); /* no limit: any reserve */
        CHECK(gp_config_set(&r, "host_reserve", "100TiB") == GP_OK);
    }
    /* reclaim_timeout: a duration in ms, s (the default) or min, up to a day */
    CHECK(set_ok(&c, "reclaim_timeout", "30") && c.reclaim_timeout_ms == 30000);
    CHECK(set_ok(&c, "reclaim_timeout", "2.5s") && c.reclaim_timeout_ms == 2500);
    CHECK(set_ok(&c, "reclaim_timeout", "500ms") && c.reclaim_timeout_ms == 500);
    CHECK(set_ok(&c, "reclaim_timeout", "2MIN") && c.reclaim_timeout_ms == 120000);
    CHECK(set_ok(&c, "reclaim_timeout", "0") && c.reclaim_timeout_ms == 0);
    CHECK(set_ok(&c, "reclaim_timeout", "86400s") && c.reclaim_timeout_ms == 86400000);
    CHECK(set_bad("reclaim_timeout", "86401") && has("longer than a day"));
    CHECK(set_bad("reclaim_timeout", "99999999999999999999") && has("longer than a day"));
    CHECK(set_bad("reclaim_timeout", "5h") && has("ms, s or min"));
    CHECK(set_bad("reclaim_timeout", "-1"));
    CHECK(set_bad("reclaim_timeout", "1."));
    CHECK(set_bad("reclaim_timeout", "1 s"));
    CHECK(set_bad("reclaim_timeout", "forever"));
    /* Finer than a millisecond is refused, never rounded: 1.5ms was 1 ms and
     * 0.000000001 was 0, "do not wait". */
    CHECK(set_bad("reclaim_timeout", "1.5ms") && has("whole number of milliseconds"));
    CHECK(set_bad("reclaim_timeout", "0.000000001") && has("whole number of milliseconds"));
    CHECK(set_bad("reclaim_timeout", "0.0005s") && has("whole number of milliseconds"));
    CHECK(set_bad("reclaim_timeout", "0.00001min") && has("whole number of milliseconds"));
    CHECK(set_bad("reclaim_timeout", "1.0000001") && has("whole number of milliseconds"));
    CHECK(set_bad("tenant_turn", "0.5ms") && has("whole number of milliseconds"));
    CHECK(set_bad("tenant_turn", "0.0000000001s") && has("whole number of milliseconds"));
    CHECK(set_ok(&c, "reclaim_timeout", "0.001") && c.reclaim_timeout_ms == 1);
    CHECK(set_ok(&c, "reclaim_timeout", "1.000000000s") && c.reclaim_timeout_ms == 1000);
    CHECK(set_ok(&c, "reclaim_timeout", "0.0001min") && c.reclaim_timeout_ms == 6);
    CHECK(set_ok(&c, "reclaim_timeout", "0.0ms") && c.reclaim_timeout_ms == 0);
    CHECK(set_ok(&c, "tenant_turn", "1.5s") && c.tenant_turn_ms == 1500);
    gp_config_default(&c);
    char buf[32];
    CHECK(gp_config_set(&c, "reclaim_timeout", "1.5s") == GP_OK && gp_config_get(&c, "reclaim_timeout", buf,
          sizeof buf) == GP_OK && strcmp(buf, "1500ms") == 0);
    CHECK(gp_config_set(&c, "reclaim_timeout", "2min") == GP_OK && gp_config_get(&c, "reclaim_timeout", buf,
          sizeof buf) == GP_OK && strcmp(buf, "120s") == 0);
    /* tenant_turn: the same durations; tenant_share: a share above 0, at most 1 */
    CHECK(set_ok(&c, "tenant_turn", "250ms") && c.tenant_turn_ms == 250);
    CHECK(set_bad("tenant_turn", "2h") && has("ms, s or min"));
    CHECK(set_ok(&c, "tenant_share", "25%") && c.tenant_share == 0.25);
    CHECK(set_ok(&c, "tenant_share", "1") && c.tenant_share == 1);
    CHECK(set_bad("tenant_share", "0") && has("above 0"));
    CHECK(set_bad("tenant_share", "150%"));
    CHECK(set_bad("tenant_share", "1GiB") && has("not a fraction"));
}

static void test_names(void)
{
    gp_config c, before;
    CHECK(set_ok(&c, "GPUPOOL_LIMIT", "1GiB") && c.limit.bytes == GiB);
    CHECK(set_ok(&c, "gpupool_limit", "2GiB") && c.limit.bytes == 2 * GiB);
    CHECK(set_ok(&c, "LIMIT", "3GiB") && c.limit.bytes == 3 * GiB);
    CHECK(set_ok(&c, "Small_Size", "8KiB") && c.small_size == 8 * KiB);
    CHECK(set_ok(&c, "GPUPOOL_OFFLOAD_THREADS", "8") && c.offload_threads == 8);
    /* Unknown names, with the list of the real ones. */
    gp_config_default(&c);
    before = c;
    const char *unknown[] = {"limt", "GPUPOOL_LIMT", "GPUPOOL_", "", "gpupool_limit_", "limit ", NULL};
    for (int i = 0; unknown[i]; i++) {
        char quoted[64];
        snprintf(quoted, sizeof quoted, "'%s'", unknown[i]);
        CHECK(gp_config_set(&c, unknown[i], "1GiB") == GP_ERR_INVALID && cfg_eq(&c, &before));
        CHECK(has(quoted) && has("limit") && has("offload_threads") && has("torch_patch"));
    }
    CHECK(gp_config_set(&c, NULL, "1") == GP_ERR_INVALID);
    CHECK(gp_config_set(NULL, "limit", "1") == GP_ERR_INVALID);
    CHECK(gp_config_set(&c, "limit", NULL) == GP_ERR_INVALID && has("GPUPOOL_LIMIT") && cfg_eq(&c, &before));
    /* The message is in the variable's name even when set by keyword. */
    CHECK(gp_config_set(&c, "Mode", "fast") == GP_ERR_INVALID && has("GPUPOOL_MODE='fast'"));
}

static void test_get(void)
{
    gp_config c;
    gp_config_default(&c);
    CHECK(get_is(&c, "mode", "expandable"));
    CHECK(get_is(&c, "GPUPOOL_CHUNK", "2MiB"));
    CHECK(get_is(&c, "limit", "none"));
    CHECK(gp_config_set(&c, "limit", "20GB") == GP_OK && get_is(&c, "limit", "20GB"));
    CHECK(gp_config_set(&c, "limit", "80%") == GP_OK && get_is(&c, "limit", "80%"));
    CHECK(gp_config_set(&c, "limit", "12.5%") == GP_OK && get_is(&c, "limit", "12.5%"));
    CHECK(gp_config_set(&c, "limit", "0.25") == GP_OK && get_is(&c, "limit", "25%"));
    CHECK(gp_config_set(&c, "limit", "1000") == GP_OK && get_is(&c, "limit", "1KB"));
    CHECK(gp_config_set(&c, "limit", "1536") == GP_OK && get_is(&c, "limit", "1536"));
    CHECK(gp_config_set(&c, "limit", "1.5GiB") == GP_OK && get_is(&c, "limit", "1536MiB"));
    CHECK(gp_config_set(&c, "limit", "1TB") == GP_OK && get_is(&c, "limit", "1TB"));
    CHECK(gp_config_set(&c, "limit", "3TiB") == GP_OK && get_is(&c, "limit", "3TiB"));
    CHECK(gp_config_set(&c, "limit", "5") == GP_OK && get_is(&c, "limit", "5"));
    CHECK(gp_config_set(&c, "priority", "high") == GP_OK && get_is(&c, "priority", "high"));
    CHECK(gp_config_set(&c, "priority", "7") == GP_OK && get_is(&c, "priority", "7"));
    CHECK(gp_config_set(&c, "priority", "1") == GP_OK && get_is(&c, "priority", "normal"));
    CHECK(gp_config_set(&c, "trace", "yes") == GP_OK && get_is(&c, "trace", "1"));
    CHECK(gp_config_set(&c, "tenant", "t1") == GP_OK && get_is(&c, "tenant", "t1"));
    char buf[8];
    CHECK(gp_config_get(&c, "nonsense", buf, sizeof buf) == GP_ERR_INVALID && has("'nonsense'"));
    CHECK(gp_config_get(&c, "mode", buf, 4) == GP_ERR_INVALID && strlen(buf) == 3);
    CHECK(gp_config_get(&c, "mode", buf, 0) == GP_ERR_INVALID);
    CHECK(gp_config_get(&c, "mode", NULL, 8) == GP_ERR_INVALID);
    CHECK(gp_config_set(&c, "mode", "reserve") == GP_OK);
    CHECK(gp_config_get(&c, "mode", buf, 7) == GP_ERR_INVALID && has("GPUPOOL_MODE"));
    CHECK(gp_config_get(&c, "mode", buf, 8) == GP_OK && strcmp(buf, "reserve") == 0);

    /* Every option printed parses back to the same config. */
    gp_config a, b;
    gp_config_default(&a);
    const char *set[][2] = {{"mode", "reserve"},     {"reserve", "0.9"},     {"limit", "20GB"},
                            {"priority", "42"},      {"codec", "BITCOMP"}, {"nvcomp", nv_dir}, {"offload_threads", "9"},
                            {"tenant", "x.y-z"},     {"log", "all"},         {"trace", "on"},
                            {"chunk", "128KiB"},     {"small_size", "12345"}, {"torch_patch", "off"},
                            {"debug", "yes"}, {"device_limit", "24GiB"}, {"reclaim_timeout", "250ms"},
                            {"tenant_turn", "2s"}, {"tenant_share", "0.25"}};
    for (size_t i = 0; i < sizeof set / sizeof set[0]; i++) CHECK(gp_config_set(&a, set[i][0], set[i][1]) == GP_OK);
    size_t n;
    const gp_option_info *o = gp_config_options(&n);
    gp_config_default(&b);
    for (size_t i = 0; i < n; i++) {
        char v[128];
        CHECK(gp_config_get(&a, o[i].key, v, sizeof v) == GP_OK);
        CHECK(gp_config_set(&b, o[i].env, v) == GP_OK);
    }
    CHECK(cfg_eq(&a, &b));
}

/* A fraction prints as a percentage that sets exactly the same double: the
 * printer once wrote 13 decimals, and 3.599999999999996554% printed as 3.6%,
 * which is another fraction.  Percentages and fractions of many digits,
 * nines and zeros most, as each option with a fraction takes them. */
static void test_fractions_print_exactly(void)
{
    static const char *const keys[] = {"limit", "reserve", "host_limit", "cache_slack", "tenant_share"};
    rng_state = 0x9e3779b97f4a7c15ull;
    size_t wrong = 0;
    for (int i = 0; i < 40000; i++) {
        char text[64], printed[64];
        int percent = rnd() % 2, w = percent ? snprintf(text, sizeof text, "%d.", (int)(rnd() % 101))
                                             : snprintf(text, sizeof text, "0.");
        for (int k = 0, nd = 1 + (int)(rnd() % 21); k < nd; k++) {
            unsigned r = (unsigned)(rnd() % 20);
            text[w++] = (char)('0' + (r < 5 ? 9 : r < 10 ? 0 : r % 10));
        }
        snprintf(text + w, sizeof text - (size_t)w, "%s", percent ? "%" : "");
        const char *key = keys[rnd() % 5];
        gp_config a, b;
        gp_config_default(&a);
        gp_config_default(&b);
        if (gp_config_set(&a, key, text) != GP_OK) continue; /* (0, or above 100%) */
        CHECK(gp_config_get(&a, key, printed, sizeof printed) == GP_OK && gp_config_set(&b, key, printed) == GP_OK);
        int same = a.limit.fraction == b.limit.fraction && a.reserve.fraction == b.reserve.fraction &&
                   a.host_limit.fraction == b.host_limit.fraction && a.cache_slack == b.cache_slack &&
                   a.tenant_share == b.tenant_share;
        if (!same && wrong++ < 5) fprintf(stderr, "%s=%s prints as %s, another fraction\n", key, text, printed);
    }
    CHECK(wrong == 0);
    /* The shortest such text. */
    gp_config c;
    gp_config_default(&c);
    CHECK(gp_config_set(&c, "limit", "0.041") == GP_OK && get_is(&c, "limit", "4.1%"));
    CHECK(gp_config_set(&c, "limit", "3.599999999999996554%") == GP_OK && get_is(&c, "limit", "3.599999999999996%"));
    CHECK(gp_config_set(&c, "limit", "0.0000001%") == GP_OK && get_is(&c, "limit", "0.0000001%"));
}

static void test_env(void)
{
    gp_config c, before;
    clear_env();
    gp_config_default(&c);
    before = c;
    CHECK(gp_config_from_env(&c) == GP_OK && cfg_eq(&c, &before));

    setenv("GPUPOOL_MODE", "reserve", 1);
    setenv("GPUPOOL_RESERVE", "70%", 1);
    setenv("GPUPOOL_LIMIT", "30GiB", 1);
    setenv("GPUPOOL_PRIORITY", "high", 1);
    setenv("GPUPOOL_CODEC", "zstd", 1);
    setenv("GPUPOOL_NVCOMP", nv_dir, 1);
    setenv("GPUPOOL_OFFLOAD_THREADS", "2", 1);
    setenv("GPUPOOL_TENANT", "jobs", 1);
    setenv("GPUPOOL_LOG", "off", 1);
    setenv("GPUPOOL_TRACE", "true", 1);
    setenv("GPUPOOL_CHUNK", "4MiB", 1);
    setenv("GPUPOOL_SMALL_SIZE", "512KiB", 1);
    setenv("GPUPOOL_TORCH_PATCH", "0", 1);
    setenv("GPUPOOLX", "not ours", 1);
    setenv("OTHER_GPUPOOL_LIMIT", "not ours", 1);
    CHECK(gp_config_from_env(&c) == GP_OK);
    CHECK(c.mode == GP_MODE_RESERVE && c.reserve.fraction == 0.7 && c.limit.bytes == 30 * GiB);
    CHECK(c.priority == GP_PRIO_HIGH && strcmp(c.codec, "zstd") == 0 && c.offload_threads == 2);
    CHECK(strcmp(c.nvcomp, nv_dir) == 0);
    CHECK(strcmp(c.tenant, "jobs") == 0 && c.log == GP_LOG_OFF && c.trace == 1);
    CHECK(c.chunk == 4 * MiB && c.small_size == 512 * KiB && c.torch_patch == 0);
    unsetenv("GPUPOOLX");
    unsetenv("OTHER_GPUPOOL_LIMIT");

    /* A malformed value: the message names it, nothing is applied. */
    clear_env();
    gp_config_default(&c);
    setenv("GPUPOOL_LIMIT", "1GiB", 1);
    setenv("GPUPOOL_CHUNK", "3MiB", 1);
    CHECK(gp_config_from_env(&c) == GP_ERR_INVALID && cfg_eq(&c, &before));
    CHECK(has("GPUPOOL_CHUNK='3MiB'") && has("power of two"));
    setenv("GPUPOOL_CHUNK", "", 1);
    CHECK(gp_config_from_env(&c) == GP_ERR_INVALID && cfg_eq(&c, &before));
    CHECK(has("GPUPOOL_CHUNK=''") && has("empty"));
    unsetenv("GPUPOOL_CHUNK");
    CHECK(gp_config_from_env(&c) == GP_OK && c.limit.bytes == GiB);

    /* Unknown variables, in any letter case, are errors naming them. */
    const char *typos[] = {"GPUPOOL_LIMT", "gpupool_limit", "Gpupool_Mode", "GPUPOOL_", "GPUPOOL_MODE_",
                           "GPUPOOL_CHUNKSIZE", NULL};
    for (int i = 0; typos[i]; i++) {
        clear_env();
        gp_config_default(&c);
        setenv("GPUPOOL_LIMIT", "1GiB", 1);
        setenv(typos[i], "1", 1);
        gp_error_clear();
        CHECK(gp_config_from_env(&c) == GP_ERR_INVALID && cfg_eq(&c, &before));
        CHECK(has(typos[i]) && has("GPUPOOL_LIMIT") && has("GPUPOOL_TORCH_PATCH"));
        if (!has(typos[i])) fprintf(stderr, "  env %s: %s\n", typos[i], gp_last_error());
    }
    clear_env();
    CHECK(gp_config_from_env(NULL) == GP_ERR_INVALID);
}

/* What single options cannot check: gp_config_validate. */
static int valid(const char *const (*set)[2], size_t n, uint64_t device_total)
{
    gp_config c;
    gp_config_default(&c);
    for (size_t i = 0; i < n; i++) CHECK(gp_config_set(&c, set[i][0], set[i][1]) == GP_OK);
    gp_error_clear();
    return gp_config_validate(&c, device_total) == GP_OK;
}

#define VALID(total, ...) valid((const char *const[][2]){__VA_ARGS__}, \
                                sizeof((const char *const[][2]){__VA_ARGS__}) / sizeof(const char *const[2]), total)

static void test_validate(void)
{
    CHECK(VALID(0, {"trace", "0"}));
    /* A limit below a chunk (as before). */
    CHECK(!VALID(0, {"limit", "1MiB"}) && has("GPUPOOL_LIMIT=1MiB") && has("at least 2MiB"));
    CHECK(VALID(0, {"limit", "2MiB"}));
    /* The large chunk, given, is at least the chunk; the default is raised
     * to a larger chunk silently, as before. */
    CHECK(!VALID(0, {"chunk", "4MiB"}, {"large_chunk", "2MiB"}) && has("GPUPOOL_LARGE_CHUNK=2MiB") &&
          has("less than GPUPOOL_CHUNK=4MiB") && has("at least 4MiB"));
    CHECK(!VALID(0, {"large_chunk", "1MiB"}) && has("GPUPOOL_LARGE_CHUNK=1MiB"));
    CHECK(VALID(0, {"chunk", "4MiB"}, {"large_chunk", "4MiB"}));
    CHECK(VALID(0, {"chunk", "128MiB"}));
    /* The device limit needs a tenant group, and at least a chunk. */
    CHECK(!VALID(0, {"device_limit", "24GiB"}) && has("GPUPOOL_DEVICE_LIMIT=24GiB") &&
          has("without GPUPOOL_TENANT") && has("GPUPOOL_LIMIT"));
    CHECK(!VALID(0, {"device_limit", "50%"}) && has("without GPUPOOL_TENANT"));
    CHECK(VALID(0, {"tenant", "lab"}, {"device_limit", "24GiB"}));
    CHECK(VALID(0, {"tenant", "lab"}, {"device_limit", "none"}));
    CHECK(VALID(0, {"device_limit", "none"}));
    CHECK(!VALID(0, {"tenant", "lab"}, {"device_limit", "2"}) && has("GPUPOOL_DEVICE_LIMIT=2 is 2 bytes") &&
          has("at least 2MiB"));
    CHECK(!VALID(0, {"tenant", "lab"}, {"chunk", "4MiB"}, {"device_limit", "3MiB"}) && has("at least 4MiB"));
    CHECK(VALID(0, {"tenant", "lab"}, {"device_limit", "0.000001"})); /* device not known yet */
    CHECK(!VALID(GiB, {"tenant", "lab"}, {"device_limit", "0.000001"}) && has("less than one chunk"));
    CHECK(VALID(GiB, {"tenant", "lab"}, {"device_limit", "1%"}));
}

int main(void)
{
    clear_env();
    make_nvcomp();
    test_validate();
    test_table();
    test_defaults();
    test_sizes();
    test_resolve();
    test_priority();
    test_options();
    test_names();
    test_get();
    test_fractions_print_exactly();
    test_env();
    remove_nvcomp();
    return check_done();
}
