/*
 * fuzz_config.c -- libFuzzer target: every way text becomes configuration.
 *
 * The first byte picks what the rest is given to:
 *   0  gp_config_set with one option (by variable or keyword, the second
 *      byte picks which) and the rest as its value;
 *   1  gp_config_set with the text before the first '=' as the name;
 *   2  gp_parse_size, fractions allowed or not;
 *   3  gp_parse_priority;
 *   4  gp_config_from_env, the rest as lines NAME=VALUE put in the
 *      environment (a GPUPOOL_ prefix added when the byte says);
 *   5  several gp_config_set calls in a row (one per line, NAME=VALUE).
 * Whatever the text: an answer of GP_OK or GP_ERR_INVALID, never a crash;
 * on GP_ERR_INVALID a message that names the option or the text and says
 * what is accepted, and the configuration untouched; on GP_OK the value
 * round-trips -- gp_config_get prints text that gp_config_set accepts and
 * that gives the very same configuration -- and sizes and priorities equal
 * what an independent parser here makes of the same text.
 *
 * Build and run: see tests/fuzz/README.md.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "gpupool.h"

static const gp_option_info *options;
static size_t n_options;

/* ------------------------------------------------ an independent parser */

static int lower(int c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

static int ieq(const char *a, const char *b)
{
    while (*a && *b && lower((unsigned char)*a) == lower((unsigned char)*b)) a++, b++;
    return !*a && !*b;
}

/* What an independent reading of a size says: it must be refused, it must
 * be accepted (as bytes in [lo, hi], or as a fraction), or either (it lies
 * within rounding of a bound). */
enum { REF_NO, REF_YES, REF_EITHER };
typedef struct ref_answer {
    int verdict;
    long double lo, hi; /* bytes */
    double fraction;
} ref_answer;

/* "512MiB", "1.5 GB", "80%", "0.8", read by the documented rules (digits,
 * an optional point and digits -- those past the 15th ignored --, spaces,
 * a unit, case-insensitive) but computed otherwise: the number by strtold,
 * bytes in long double, where the library works in exact integers. */
static ref_answer ref_size(const char *s, int allow_fraction)
{
    static const struct {
        const char *name;
        long double mult;
    } units[] = {{"b", 1},         {"k", 1024.0L},  {"kib", 1024.0L}, {"kb", 1e3L},   {"m", 1048576.0L},
                 {"mib", 1048576.0L}, {"mb", 1e6L}, {"g", 1073741824.0L}, {"gib", 1073741824.0L},
                 {"gb", 1e9L},      {"t", 1099511627776.0L}, {"tib", 1099511627776.0L}, {"tb", 1e12L}};
    ref_answer no = {REF_NO, 0, 0, 0};
    char num[64];
    size_t k = 0;
    if (!(*s >= '0' && *s <= '9')) return no;
    while (s[0] == '0' && s[1] >= '0' && s[1] <= '9') s++; /* (leading zeros weigh nothing) */
    for (; *s >= '0' && *s <= '9'; s++)
        if (k < 40) num[k++] = *s;
        else if (k == 40) return no; /* (more than 2^63 whatever follows) */
    int point = *s == '.';
    if (point) {
        num[k++] = *s++;
        if (!(*s >= '0' && *s <= '9')) return no;
        for (int d = 0; *s >= '0' && *s <= '9'; s++, d++)
            if (d < 15) num[k++] = *s;
    }
    num[k] = '\0';
    long double v = strtold(num, NULL);
    const char *sp = s;
    while (*s == ' ') s++;
    if (s != sp && !*s) return no;
    int percent = s[0] == '%' && !s[1];
    if (percent || (!*s && point)) {
        /* The bounds are compared in double, as documented values are. */
        double f = (double)v / (percent ? 100 : 1);
        if (!allow_fraction || !((double)v > 0 && (double)v <= (percent ? 100 : 1))) return no;
        return (ref_answer){REF_YES, 0, 0, f};
    }
    long double mult = 1;
    if (*s) {
        size_t i = 0, n = sizeof units / sizeof units[0];
        while (i < n && !ieq(s, units[i].name)) i++;
        if (i == n) return no;
        mult = units[i].mult;
    }
    long double x = v * mult, eps = 1e-6L + x * 1e-15L;
    ref_answer a = {REF_YES, floorl(x - eps), floorl(x + eps), 0};
    if (a.lo < 0) a.lo = 0;
    const long double max = 9223372036854775807.0L;
    if (v == 0) return (ref_answer){REF_YES, 0, 0, 0}; /* "0": unset */
    if (a.lo > max || a.hi < 1) return no;              /* too large; less than a byte */
    if (a.hi > max || a.lo < 1) a.verdict = REF_EITHER;
    return a;
}

static int ref_priority(const char *s)
{
    static const char *const names[] = {"low", "normal", "high", "critical"};
    for (int i = 0; i < 4; i++)
        if (ieq(s, names[i])) return i;
    if (!*s) return -1;
    long v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return -1;
        if ((v = v * 10 + (*s - '0')) > 255) return -1; /* (leading zeros are fine) */
    }
    return (int)v;
}

/* ----------------------------------------------------------- the checks */

/* Two configurations are the same when every option prints the same (the
 * option table names every field) and the fractions are the same doubles: a
 * fraction prints as a percentage that reads back to it exactly, and two
 * fractions can print alike. */
static int config_equal(const gp_config *a, const gp_config *b)
{
    for (size_t k = 0; k < n_options; k++) {
        char ta[256], tb[256];
        if (gp_config_get(a, options[k].key, ta, sizeof ta) != GP_OK ||
            gp_config_get(b, options[k].key, tb, sizeof tb) != GP_OK || strcmp(ta, tb) != 0)
            return 0;
    }
    return a->reserve.fraction == b->reserve.fraction && a->limit.fraction == b->limit.fraction &&
           a->host_limit.fraction == b->host_limit.fraction && a->host_reserve.fraction == b->host_reserve.fraction &&
           a->device_limit.fraction == b->device_limit.fraction && a->cache_slack == b->cache_slack &&
           a->tenant_share == b->tenant_share;
}

static void same_config(const gp_config *a, const gp_config *b, const char *what)
{
    EXPECT(config_equal(a, b), "%s: the configurations differ", what);
}

/* gp_config_set(cfg, name, value) and everything it promises. */
static gp_status set_checked(gp_config *cfg, const char *name, const char *value)
{
    gp_config before = *cfg;
    gp_status st = gp_config_set(cfg, name, value);
    EXPECT(st == GP_OK || st == GP_ERR_INVALID, "gp_config_set(%s, '%s') gave %s", name, value, gp_status_str(st));
    if (st != GP_OK) {
        const char *msg = gp_last_error();
        EXPECT(msg[0], "gp_config_set(%s, '%s') failed with no message", name, value);
        EXPECT(strstr(msg, "expected") || strstr(msg, "the options are"),
               "gp_config_set(%s, '%s'): the message does not say what is accepted: %s", name, value, msg);
        same_config(cfg, &before, "a refused gp_config_set");
        return st;
    }
    /* The value prints back to text that gives the same configuration. */
    char text[256], again[256];
    st = gp_config_get(cfg, name, text, sizeof text);
    EXPECT(st == GP_OK, "gp_config_get(%s) after setting '%s': %s", name, value, gp_last_error());
    gp_config round = before;
    st = gp_config_set(&round, name, text);
    EXPECT(st == GP_OK, "%s='%s' is accepted and prints as '%s', which is refused: %s", name, value, text,
           gp_last_error());
    char what[400];
    snprintf(what, sizeof what, "%s='%s' printed as '%s' and set again", name, value, text);
    same_config(&round, cfg, what);
    EXPECT(gp_config_get(&round, name, again, sizeof again) == GP_OK && strcmp(text, again) == 0,
           "%s prints as '%s', then as '%s'", name, text, again);
    /* A buffer one byte short is refused, never overrun. */
    size_t need = strlen(text) + 1;
    char small[256];
    memset(small, 'x', sizeof small);
    EXPECT(gp_config_get(cfg, name, small, need - 1 ? need - 1 : 1) == GP_ERR_INVALID || need - 1 == 0,
           "gp_config_get(%s) into %zu bytes for '%s' did not refuse", name, need - 1, text);
    EXPECT(small[need - 1] == 'x' || need - 1 == 0, "gp_config_get(%s) wrote past its buffer", name);
    return GP_OK;
}

static void check_size(const char *text, int allow_fraction)
{
    gp_size_spec s = {12345, 0.5};
    gp_status st = gp_parse_size(text, allow_fraction, &s);
    ref_answer ref = ref_size(text, allow_fraction);
    EXPECT(st == GP_OK || st == GP_ERR_INVALID, "gp_parse_size('%s') gave %s", text, gp_status_str(st));
    if (st != GP_OK) {
        EXPECT(ref.verdict != REF_YES, "gp_parse_size('%s', %d) refused a size (%.0Lf bytes, fraction %g): %s", text,
               allow_fraction, ref.lo, ref.fraction, gp_last_error());
        EXPECT(strstr(gp_last_error(), "is not a valid size") && strstr(gp_last_error(), "expected"),
               "gp_parse_size('%s'): the message does not say what is wrong and accepted: %s", text, gp_last_error());
        return;
    }
    EXPECT(ref.verdict != REF_NO, "gp_parse_size('%s', %d) accepted what is no size: %llu bytes, fraction %g", text,
           allow_fraction, (unsigned long long)s.bytes, s.fraction);
    EXPECT(!(s.bytes && s.fraction) && s.fraction >= 0 && s.fraction <= 1 && (allow_fraction || s.fraction == 0) &&
               s.bytes <= 0x7fffffffffffffffull,
           "gp_parse_size('%s') gave %llu bytes and fraction %g", text, (unsigned long long)s.bytes, s.fraction);
    EXPECT((long double)s.bytes >= ref.lo && (long double)s.bytes <= ref.hi,
           "gp_parse_size('%s') = %llu bytes, independently %.0Lf..%.0Lf", text, (unsigned long long)s.bytes, ref.lo,
           ref.hi);
    EXPECT(fabs(s.fraction - ref.fraction) <= 1e-15 * ref.fraction,
           "gp_parse_size('%s') = fraction %.17g, independently %.17g", text, s.fraction, ref.fraction);
    /* Case does not matter. */
    static char upper[4096];
    size_t n = strlen(text);
    for (size_t i = 0; i <= n; i++) upper[i] = text[i] >= 'a' && text[i] <= 'z' ? (char)(text[i] - 32) : text[i];
    gp_size_spec u;
    EXPECT(gp_parse_size(upper, allow_fraction, &u) == GP_OK && u.bytes == s.bytes && u.fraction == s.fraction,
           "gp_parse_size('%s') and ('%s') differ", text, upper);
}

static void check_priority(const char *text)
{
    int v = -7;
    gp_status st = gp_parse_priority(text, &v);
    int ref = ref_priority(text);
    if (st != GP_OK) {
        EXPECT(st == GP_ERR_INVALID && ref < 0, "gp_parse_priority('%s') gave %s, independently %d", text,
               gp_status_str(st), ref);
        EXPECT(strstr(gp_last_error(), "expected"), "gp_parse_priority('%s'): %s", text, gp_last_error());
        return;
    }
    EXPECT(v == ref && v >= 0 && v <= 255, "gp_parse_priority('%s') = %d, independently %d", text, v, ref);
}

/* Lines "NAME=VALUE" of `text` into the environment; from_env then answers
 * as gp_config_set of each known variable in table order would. */
static void check_env(char *text, int prefix)
{
    char *names[16];
    int n = 0;
    for (char *line = strtok(text, "\n"); line && n < 16; line = strtok(NULL, "\n")) {
        char *eq = strchr(line, '=');
        if (!eq || eq == line) continue;
        *eq = '\0';
        char name[160];
        snprintf(name, sizeof name, "%s%s", prefix ? "GPUPOOL_" : "", line);
        if (setenv(name, eq + 1, 1) != 0) continue;
        names[n++] = strdup(name);
    }
    gp_config cfg, want;
    gp_config_default(&cfg);
    gp_config_default(&want);
    gp_config before = cfg;
    gp_status st = gp_config_from_env(&cfg);
    /* The answer by hand: an unknown GPUPOOL_ variable (any case) is an
     * error; else each known one is set, in table order. */
    gp_status expect = GP_OK;
    for (int i = 0; i < n && expect == GP_OK; i++) {
        if (strncasecmp(names[i], "GPUPOOL_", 8) != 0) continue;
        int known = 0;
        for (size_t k = 0; k < n_options; k++) known |= strcmp(names[i], options[k].env) == 0;
        if (!known) expect = GP_ERR_INVALID;
    }
    for (size_t k = 0; k < n_options && expect == GP_OK; k++) {
        const char *v = getenv(options[k].env);
        if (v && gp_config_set(&want, options[k].env, v) != GP_OK) expect = GP_ERR_INVALID;
    }
    EXPECT(st == expect, "gp_config_from_env gave %s, expected %s", gp_status_str(st), gp_status_str(expect));
    if (st == GP_OK) same_config(&cfg, &want, "gp_config_from_env");
    else {
        same_config(&cfg, &before, "a refused gp_config_from_env");
        EXPECT(strstr(gp_last_error(), "GPUPOOL_"), "gp_config_from_env: the message names no variable: %s",
               gp_last_error());
    }
    for (int i = 0; i < n; i++) {
        unsetenv(names[i]);
        free(names[i]);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    options = gp_config_options(&n_options);
    /* Only the variables an input sets may be in the environment. */
    extern char **environ;
    for (char **e = environ; e && *e;) {
        if (strncasecmp(*e, "GPUPOOL_", 8) == 0) {
            char name[256];
            snprintf(name, sizeof name, "%.*s", (int)(strchr(*e, '=') ? strchr(*e, '=') - *e : 255), *e);
            unsetenv(name);
        } else {
            e++;
        }
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || size > 4096) return 0;
    uint8_t what = data[0], arg = data[1];
    char text[4096];
    memcpy(text, data + 2, size - 2);
    text[size - 2] = '\0'; /* (an inner NUL ends the text early) */
    gp_config cfg;
    gp_config_default(&cfg);
    switch (what % 6) {
    case 0: {
        const gp_option_info *o = &options[arg % n_options];
        set_checked(&cfg, arg & 0x80 ? o->env : o->key, text);
        break;
    }
    case 1: {
        char *eq = strchr(text, '=');
        if (eq) *eq = '\0';
        set_checked(&cfg, text, eq ? eq + 1 : "1");
        break;
    }
    case 2:
        check_size(text, arg & 1);
        break;
    case 3:
        check_priority(text);
        break;
    case 4:
        check_env(text, arg & 1);
        break;
    case 5:
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
            char *eq = strchr(line, '=');
            if (!eq) continue;
            *eq = '\0';
            set_checked(&cfg, line, eq + 1);
        }
        for (size_t k = 0; k < n_options; k++) {
            char buf[256];
            EXPECT(gp_config_get(&cfg, options[k].key, buf, sizeof buf) == GP_OK, "gp_config_get(%s): %s",
                   options[k].key, gp_last_error());
            gp_status st = set_checked(&cfg, options[k].env, buf);
            EXPECT(st == GP_OK,
                   "%s prints as '%s', which is refused: %s", options[k].env, buf, gp_last_error());
        }
        break;
    }
    return 0;
}
