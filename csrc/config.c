/*
 * config.c -- every GPUPOOL_* option, read in one place: the table
 * GP_OPTIONS below gives each option its variable, keyword, default,
 * accepted values, meaning and the functions that parse and print it, so
 * that the documentation (gp_config_options), the parser and the report
 * cannot drift apart.
 *
 * Values are parsed by hand in ASCII rather than with strtod/strtoull or
 * tolower: those follow the C locale of the host program (a decimal comma,
 * a Turkish dotless i) and accept spaces, signs, hex and "inf" that no size
 * should be.  A malformed value is always an error that names the option,
 * the value and what is accepted -- never a silent default.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codec.h"
#include "error.h"
#include "util.h"

/* POSIX leaves this declaration to the program. */
extern char **environ;

#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define GiB (1ull << 30)

/* The largest size: sizes must fit an int64 (off_t, Py_ssize_t) as well. */
#define GP_SIZE_MAX 0x7fffffffffffffffull

#define GP_SIZE_UNITS                                                          \
    " (K, M, G, T, KiB, MiB, GiB, TiB are powers of 1024; KB, MB, GB, TB "     \
    "powers of 1000)"
#define GP_SIZE_TEXT "a size such as 512MiB, 20GB, 4096, 80% or 0.8" GP_SIZE_UNITS
#define GP_ABS_SIZE_TEXT "a size such as 512MiB, 20GB or 4096" GP_SIZE_UNITS
#define GP_BOOL_TEXT "0, 1, true, false, yes, no, on or off"
#define GP_STR(x) #x
#define GP_XSTR(x) GP_STR(x)
#define GP_PRIO_TEXT "low, normal, high, critical or an integer 0..255"

/* A parser writes its option into `cfg` only when `v` is valid; otherwise it
 * returns -1 and may leave a reason more precise than the accepted text in
 * `why`, or GP_CONFLICT with the reason when `v` is well-formed but
 * contradicts another option. */
#define GP_CONFLICT (-2)
typedef int (*gp_parse_fn)(gp_config *cfg, const char *v, char *why, size_t n);
/* A printer returns what snprintf returns. */
typedef int (*gp_print_fn)(const gp_config *cfg, char *buf, size_t len);

/* ------------------------------------------------------------ ASCII text */

static int gp_lower(int c) { return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c; }
static int gp_digit(int c) { return c >= '0' && c <= '9'; }

static int gp_ieq(const char *a, const char *b)
{
    while (*a && gp_lower((unsigned char)*a) == gp_lower((unsigned char)*b)) a++, b++;
    return gp_lower((unsigned char)*a) == gp_lower((unsigned char)*b);
}

/* Index of `v` in the NULL-terminated `names`, case-insensitive; -1 if none. */
static int gp_word(const char *v, const char *const *names)
{
    for (int i = 0; names[i]; i++)
        if (gp_ieq(v, names[i])) return i;
    return -1;
}

/* A decimal integer of digits only, at most `max`. */
static int gp_uint(const char *v, unsigned max, unsigned *out)
{
    unsigned x = 0;
    if (!*v) return -1;
    for (; *v; v++) {
        if (!gp_digit(*v)) return -1;
        x = x * 10 + (unsigned)(*v - '0');
        if (x > max) return -1; /* early, so that x never overflows */
    }
    *out = x;
    return 0;
}

/* --------------------------------------------------------------- sizes */

static const struct {
    const char *name;
    unsigned base, power;
} gp_units[] = {
    {"b", 1, 0},     {"k", 1024, 1},   {"kib", 1024, 1}, {"kb", 1000, 1},
    {"m", 1024, 2},  {"mib", 1024, 2}, {"mb", 1000, 2},  {"g", 1024, 3},
    {"gib", 1024, 3}, {"gb", 1000, 3}, {"t", 1024, 4},   {"tib", 1024, 4},
    {"tb", 1000, 4},
};

/* Digits kept after the point: 10^15 * 1024 still fits a uint64 in the
 * exact multiplication below, and later digits weigh less than a byte even
 * in TiB. */
#define GP_FRAC_DIGITS 15

/* The fraction that whole + num/den percent stands for: the one
 * computation behind every fraction the parser gives, which the printer
 * below inverts. */
static double gp_percent_fraction(uint64_t whole, uint64_t num, uint64_t den)
{
    return ((double)whole + (double)num / (double)den) / 100;
}

static int gp_size_scan(const char *s, int allow_fraction, gp_size_spec *out, char *why,
                        size_t n)
{
    if (!*s) return snprintf(why, n, "it is empty"), -1;
    if (!gp_digit(*s)) return snprintf(why, n, "it must start with a digit"), -1;
    uint64_t whole = 0, num = 0, den = 1;
    for (; gp_digit(*s); s++) {
        unsigned d = (unsigned)(*s - '0');
        if (whole > (UINT64_MAX - d) / 10) return snprintf(why, n, "it is too large"), -1;
        whole = whole * 10 + d;
    }
    int point = *s == '.';
    if (point) {
        if (!gp_digit(*++s)) return snprintf(why, n, "a digit must follow the point"), -1;
        for (int k = 0; gp_digit(*s); s++, k++) {
            if (k < GP_FRAC_DIGITS) {
                num = num * 10 + (uint64_t)(*s - '0');
                den *= 10;
            }
        }
    }
    const char *unit = s;
    while (*s == ' ') s++;
    if (s != unit && !*s) return snprintf(why, n, "it ends in a space"), -1;
    unit = s;
    double value = (double)whole + (double)num / (double)den;

    if (*unit == '%' && !unit[1]) {
        if (!allow_fraction) return snprintf(why, n, "a percentage is not accepted here"), -1;
        if (!(value > 0 && value <= 100))
            return snprintf(why, n, "a percentage must be above 0%% and at most 100%%"), -1;
        *out = (gp_size_spec){.fraction = gp_percent_fraction(whole, num, den)};
        return 0;
    }
    if (!*unit && point) {
        if (!allow_fraction)
            return snprintf(why, n, "a fraction is not accepted here (give a unit)"), -1;
        if (!(value > 0 && value <= 1))
            return snprintf(why, n, "a fraction must be above 0 and at most 1 (give a unit for bytes)"), -1;
        /* Read as the percentage it is, two places along (whole <= 1, num <
         * 10^15), so that every fraction is one a percentage prints back to. */
        *out = (gp_size_spec){.fraction = gp_percent_fraction(whole * 100 + num * 100 / den, num * 100 % den, den)};
        return 0;
    }
    unsigned base = 1, power = 0;
    if (*unit) {
        size_t i = 0, nu = sizeof gp_units / sizeof gp_units[0];
        while (i < nu && !gp_ieq(unit, gp_units[i].name)) i++;
        if (i == nu) return snprintf(why, n, "unknown unit '%.16s'", unit), -1;
        base = gp_units[i].base;
        power = gp_units[i].power;
    }
    /* whole + num/den times base^power, exactly, rounded down: each step
     * carries the whole bytes out of the fractional part. */
    uint64_t bytes = whole;
    for (unsigned k = 0; k < power; k++) {
        if (bytes > GP_SIZE_MAX / base) return snprintf(why, n, "it is larger than 2^63-1 bytes"), -1;
        bytes = bytes * base + num * base / den;
        num = num * base % den;
    }
    if (bytes > GP_SIZE_MAX) return snprintf(why, n, "it is larger than 2^63-1 bytes"), -1;
    if (bytes == 0 && value > 0) return snprintf(why, n, "it is less than one byte"), -1;
    *out = (gp_size_spec){.bytes = bytes};
    return 0;
}

/* The value quoted in messages, cut so that the rest of the message fits. */
#define GP_QUOTE "'%.80s%s'"
#define GP_QUOTE_ARG(v) (v), strlen(v) > 80 ? "..." : ""

gp_status gp_parse_size(const char *text, int allow_fraction, gp_size_spec *out)
{
    char why[96];
    if (!text || !out) return gp_error_set(GP_ERR_INVALID, "gp_parse_size: text or out is NULL");
    if (gp_size_scan(text, allow_fraction, out, why, sizeof why) == 0) return GP_OK;
    return gp_error_set(GP_ERR_INVALID, GP_QUOTE " is not a valid size: %s; expected %s",
                        GP_QUOTE_ARG(text), why, allow_fraction ? GP_SIZE_TEXT : GP_ABS_SIZE_TEXT);
}

uint64_t gp_size_resolve(gp_size_spec s, uint64_t total)
{
    if (s.bytes) return s.bytes;
    if (!(s.fraction > 0)) return 0; /* also NaN */
    double r = s.fraction * (double)total;
    /* (double)total may round up past UINT64_MAX, where the cast is undefined. */
    return r >= (double)total ? total : (uint64_t)r;
}

/* The shortest exact text for `b` bytes (> 0), so that reports read
 * "2MiB" and "20GB" and parse back to the same size. */
static int gp_size_print(uint64_t b, char *buf, size_t len)
{
    static const char *const bin[] = {"KiB", "MiB", "GiB", "TiB"}, *const dec[] = {"KB", "MB", "GB", "TB"};
    uint64_t best = b, p2 = 1, p10 = 1;
    const char *unit = "";
    for (int i = 0; i < 4; i++) {
        p2 *= 1024;
        p10 *= 1000;
        if (b % p2 == 0 && b / p2 < best) best = b / p2, unit = bin[i];
        if (b % p10 == 0 && b / p10 < best) best = b / p10, unit = dec[i];
    }
    return snprintf(buf, len, "%llu%s", (unsigned long long)best, unit);
}

/* Whether `text` parses to exactly `fraction`. */
static int gp_reads_as(const char *text, double fraction)
{
    gp_size_spec s;
    char why[96];
    return gp_size_scan(text, 1, &s, why, sizeof why) == 0 && !s.bytes && s.fraction == fraction;
}

/* Units of the last of GP_FRAC_DIGITS decimals of a percentage that the
 * printer steps away from fraction * 100: the parser's fraction is within a
 * rounding or two of its decimal, and fraction * 100 within a rounding or two
 * of that; near 100%, 64 units are 4 roundings. */
#define GP_PERCENT_STEPS 64
#define GP_PERCENT_UNIT 1000000000000000ull /* 10^GP_FRAC_DIGITS */

/* A fraction (> 0, at most 1) as the shortest percentage in plain decimals
 * ("80%", "0.0000001%") that the parser reads back to the same double: what
 * the parser gave prints back to itself.  %g would write "1e-07%", which no
 * size parser accepts, and round to 6 digits. */
static int gp_percent_print(double fraction, char *buf, size_t len)
{
    char num[64], near[64];
    double pct = fraction * 100;
    for (int d = 0; d <= GP_FRAC_DIGITS; d++) {
        snprintf(num, sizeof num, "%.*f%%", d, pct);
        if (gp_reads_as(num, fraction)) return snprintf(buf, len, "%s", num);
    }
    /* num holds GP_FRAC_DIGITS decimals: step them as one integer of units
     * of the last place (at most 100 * 10^15). */
    uint64_t u = 0;
    memcpy(near, num, sizeof near);
    for (const char *c = num; *c != '%'; c++)
        if (gp_digit(*c)) u = u * 10 + (uint64_t)(*c - '0');
    for (uint64_t k = 1; k <= GP_PERCENT_STEPS; k++) {
        for (int side = 0; side < 2; side++) {
            uint64_t v = side ? u + k : u - k;
            if (!side && k > u) continue;
            int w = snprintf(num, sizeof num, "%llu.%015llu", (unsigned long long)(v / GP_PERCENT_UNIT),
                             (unsigned long long)(v % GP_PERCENT_UNIT));
            while (num[w - 1] == '0') w--;
            if (num[w - 1] == '.') w--;
            snprintf(num + w, sizeof num - (size_t)w, "%%");
            if (gp_reads_as(num, fraction)) return snprintf(buf, len, "%s", num);
        }
    }
    return snprintf(buf, len, "%s", near); /* a fraction no text gives */
}

static int gp_spec_print(gp_size_spec s, char *buf, size_t len)
{
    if (s.bytes) return gp_size_print(s.bytes, buf, len);
    if (s.fraction > 0) return gp_percent_print(s.fraction, buf, len);
    return snprintf(buf, len, "none");
}

/* "none" and "0" give the unset spec, which means "the default" or "no
 * limit" depending on the option. */
static int gp_spec_parse(gp_size_spec *dst, const char *v, char *why, size_t n)
{
    gp_size_spec s = {0, 0};
    if (!gp_ieq(v, "none") && gp_size_scan(v, 1, &s, why, n) != 0) return -1;
    *dst = s;
    return 0;
}

/* An absolute size in [lo, hi], a power of two when `pow2`. */
static int gp_abs_parse(uint64_t *dst, const char *v, uint64_t lo, uint64_t hi, int pow2,
                        char *why, size_t n)
{
    gp_size_spec s;
    if (gp_size_scan(v, 0, &s, why, n) != 0) return -1;
    if (s.bytes < lo || s.bytes > hi) return snprintf(why, n, "it is out of range"), -1;
    if (pow2 && (s.bytes & (s.bytes - 1))) return snprintf(why, n, "it is not a power of two"), -1;
    *dst = s.bytes;
    return 0;
}

/* ---------------------------------------------------------- priorities */

static const char *const gp_prio_names[] = {
#define GP_PRIO_NAME(NAME, name) #name,
    GP_PRIORITIES(GP_PRIO_NAME)
#undef GP_PRIO_NAME
    NULL};

static int gp_prio_scan(const char *text, int *out)
{
    int w = gp_word(text, gp_prio_names);
    unsigned u;
    if (w >= 0) *out = w;
    else if (gp_uint(text, GP_PRIO_MAX, &u) == 0) *out = (int)u;
    else return -1;
    return 0;
}

gp_status gp_parse_priority(const char *text, int *out)
{
    if (!text || !out) return gp_error_set(GP_ERR_INVALID, "gp_parse_priority: text or out is NULL");
    if (gp_prio_scan(text, out) == 0) return GP_OK;
    return gp_error_set(GP_ERR_INVALID, GP_QUOTE " is not a valid priority: expected " GP_PRIO_TEXT,
                        GP_QUOTE_ARG(text));
}

const char *gp_priority_name(int prio)
{
    return prio >= 0 && prio < GP_PRIO_NAMED ? gp_prio_names[prio] : NULL;
}

/* ------------------------------------------------- the options, one each */

static const char *const gp_mode_names[] = {"expandable", "reserve", NULL};
static const char *const gp_log_names[] = {"off", "oom", "all", NULL};
/* Even entries are false, odd entries true. */
static const char *const gp_bool_names[] = {"0", "1", "false", "true", "no", "yes", "off", "on", NULL};

/* A reserve is the size of the reserve-mode pool: given alone it implies
 * reserve mode (a LoRA run set up with GPUPOOL_RESERVE=85% alone once stayed
 * expandable unnoticed); given with an explicit GPUPOOL_MODE=expandable it
 * is a contradiction, refused whichever of the two comes last. */
static int gp_reserve_conflict(const gp_config *c, char *why, size_t n)
{
    int set = c->reserve.bytes || c->reserve.fraction > 0;
    if (!set || !c->mode_given || c->mode != GP_MODE_EXPANDABLE) return 0;
    snprintf(why, n, "GPUPOOL_RESERVE sizes the reserve-mode pool, and GPUPOOL_MODE=expandable "
                     "is given too; unset GPUPOOL_RESERVE, or the mode (a reserve implies reserve mode)");
    return GP_CONFLICT;
}

static int gp_parse_mode(gp_config *c, const char *v, char *why, size_t n)
{
    int w = gp_word(v, gp_mode_names);
    if (w < 0) return -1;
    c->mode = (gp_mode)w;
    c->mode_given = 1;
    return gp_reserve_conflict(c, why, n);
}

static int gp_print_mode(const gp_config *c, char *buf, size_t len)
{
    return snprintf(buf, len, "%s", gp_mode_names[c->mode == GP_MODE_RESERVE]);
}

static int gp_parse_reserve(gp_config *c, const char *v, char *why, size_t n)
{
    if (gp_spec_parse(&c->reserve, v, why, n) != 0) return -1;
    if (!c->mode_given)
        c->mode = c->reserve.bytes || c->reserve.fraction > 0 ? GP_MODE_RESERVE : GP_MODE_EXPANDABLE;
    return gp_reserve_conflict(c, why, n);
}

static int gp_print_reserve(const gp_config *c, char *buf, size_t len)
{
    return gp_spec_print(c->reserve, buf, len);
}



static int gp_parse_prio(gp_config *c, const char *v, char *why, size_t n)
{
    (void)why, (void)n;
    return gp_prio_scan(v, &c->priority);
}

static int gp_print_prio(const gp_config *c, char *buf, size_t len)
{
    const char *name = gp_priority_name(c->priority);
    return name ? snprintf(buf, len, "%s", name) : snprintf(buf, len, "%d", c->priority);
}

static int gp_parse_codec(gp_config *c, const char *v, char *why, size_t n)
{
    (void)why, (void)n;
    gp_codec_id id = GP_CODEC_RAW;
    if (gp_codec_parse(v, &id) != GP_OK) return gp_error_clear(), -1; /* the caller's message says more */
    /* The canonical spelling, so that consumers compare with strcmp. */
    snprintf(c->codec, sizeof c->codec, "%s", gp_codec_id_name(id));
    return 0;
}

static int gp_print_codec(const gp_config *c, char *buf, size_t len)
{
    return snprintf(buf, len, "%s", c->codec);
}

/* A path that must be nvCOMP: a typo is caught at start-up, not at the
 * first offload (codec_nvcomp.c loads it).  A file must be a shared library
 * (an ELF object); a folder must hold libnvcomp.so.6 (what codec_nvcomp.c
 * loads from a folder). */
static int gp_is_elf(const char *path)
{
    unsigned char magic[4] = {0};
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t k = fread(magic, 1, sizeof magic, f);
    fclose(f);
    return k == 4 && magic[0] == 0x7f && magic[1] == 'E' && magic[2] == 'L' && magic[3] == 'F';
}

static int gp_parse_nvcomp(gp_config *c, const char *v, char *why, size_t n)
{
    size_t k = strlen(v);
    struct stat sb;
    if (gp_ieq(v, "none")) return c->nvcomp[0] = '\0', 0;
    if (k >= sizeof c->nvcomp) return snprintf(why, n, "it has %zu characters, at most %zu", k, sizeof c->nvcomp - 1), -1;
    if (stat(v, &sb) != 0) return snprintf(why, n, "%s", strerror(errno)), -1;
    if (S_ISDIR(sb.st_mode)) {
        char lib[GP_PATH_MAX + 32];
        snprintf(lib, sizeof lib, "%s/libnvcomp.so.6", v);
        if (stat(lib, &sb) != 0 || !S_ISREG(sb.st_mode))
            return snprintf(why, n, "the folder holds no libnvcomp.so.6"), -1;
    } else if (!S_ISREG(sb.st_mode)) {
        return snprintf(why, n, "it is neither a file nor a folder"), -1;
    } else if (!gp_is_elf(v)) {
        return snprintf(why, n, "it is not a shared library (no ELF header)"), -1;
    }
    memcpy(c->nvcomp, v, k + 1);
    return 0;
}

static int gp_print_nvcomp(const gp_config *c, char *buf, size_t len)
{
    return snprintf(buf, len, "%s", c->nvcomp[0] ? c->nvcomp : "none");
}

static int gp_parse_threads(gp_config *c, const char *v, char *why, size_t n)
{
    unsigned u;
    if (gp_uint(v, 1000, &u) != 0) return -1;
    if (u < 1 || u > 64) return snprintf(why, n, "it is out of range"), -1;
    c->offload_threads = (int)u;
    return 0;
}

static int gp_print_threads(const gp_config *c, char *buf, size_t len)
{
    return snprintf(buf, len, "%d", c->offload_threads);
}

/* "none" is no tenant (the default), so that what is printed parses back. */
static int gp_parse_tenant(gp_config *c, const char *v, char *why, size_t n)
{
    if (gp_ieq(v, "none")) return c->tenant[0] = '\0', 0;
    size_t k = strlen(v);
    if (k == 0 || k >= GP_TENANT_MAX) return snprintf(why, n, "it has %zu characters", k), -1;
    for (size_t i = 0; i < k; i++) {
        char ch = v[i];
        if (!(gp_digit(ch) || (gp_lower(ch) >= 'a' && gp_lower(ch) <= 'z') || ch == '_' ||
              ch == '.' || ch == '-'))
            return snprintf(why, n, "character %zu is not allowed", i + 1), -1;
    }
    memcpy(c->tenant, v, k + 1);
    return 0;
}

static int gp_print_tenant(const gp_config *c, char *buf, size_t len)
{
    return snprintf(buf, len, "%s", c->tenant[0] ? c->tenant : "none");
}

static int gp_parse_log(gp_config *c, const char *v, char *why, size_t n)
{
    (void)why, (void)n;
    int w = gp_word(v, gp_log_names);
    if (w < 0) return -1;
    c->log = (gp_log)w;
    return 0;
}

static int gp_print_log(const gp_config *c, char *buf, size_t len)
{
    unsigned l = (unsigned)c->log;
    return snprintf(buf, len, "%s", l <= GP_LOG_ALL ? gp_log_names[l] : "?");
}

static int gp_bool(int *dst, const char *v)
{
    int w = gp_word(v, gp_bool_names);
    if (w < 0) return -1;
    *dst = w & 1;
    return 0;
}





static int gp_parse_chunk(gp_config *c, const char *v, char *why, size_t n)
{
    return gp_abs_parse(&c->chunk, v, 64 * KiB, GiB, 1, why, n);
}

static int gp_print_chunk(const gp_config *c, char *buf, size_t len)
{
    return gp_size_print(c->chunk, buf, len);
}

static int gp_parse_small(gp_config *c, const char *v, char *why, size_t n)
{
    return gp_abs_parse(&c->small_size, v, 4 * KiB, 64 * MiB, 0, why, n);
}

static int gp_print_small(const gp_config *c, char *buf, size_t len)
{
    return gp_size_print(c->small_size, buf, len);
}

/* Given, it must be at least GPUPOOL_CHUNK (gp_config_validate); the
 * default is raised to the chunk silently. */
static int gp_parse_large_chunk(gp_config *c, const char *v, char *why, size_t n)
{
    if (gp_abs_parse(&c->large_chunk, v, 64 * KiB, GiB, 1, why, n) != 0) return -1;
    c->large_chunk_given = 1;
    return 0;
}

static int gp_print_large_chunk(const gp_config *c, char *buf, size_t len)
{
    return gp_size_print(c->large_chunk, buf, len);
}

/* A fraction of allocated bytes ("5%", "0.05"), 0, or none. */
static int gp_parse_slack(gp_config *c, const char *v, char *why, size_t n)
{
    gp_size_spec s;
    if (gp_ieq(v, "none")) return c->cache_slack = -1, 0;
    if (gp_ieq(v, "0") || gp_ieq(v, "0%")) return c->cache_slack = 0, 0;
    if (gp_size_scan(v, 1, &s, why, n) != 0) return -1;
    if (s.bytes) return snprintf(why, n, "it is a size, not a fraction"), -1;
    c->cache_slack = s.fraction;
    return 0;
}

static int gp_print_slack(const gp_config *c, char *buf, size_t len)
{
    if (c->cache_slack < 0) return snprintf(buf, len, "none");
    if (c->cache_slack == 0) return snprintf(buf, len, "0");
    return gp_percent_print(c->cache_slack, buf, len);
}



/* Indexed by GP_PLACE_*. */
static const char *const gp_placement_names[] = {"none", "lifetime", NULL};

static int gp_parse_placement(gp_config *c, const char *v, char *why, size_t n)
{
    (void)why, (void)n;
    int w = gp_word(v, gp_placement_names);
    if (w < 0) return -1;
    c->placement = w;
    return 0;
}

static int gp_print_placement(const gp_config *c, char *buf, size_t len)
{
    return snprintf(buf, len, "%s", gp_placement_names[c->placement == GP_PLACE_LIFETIME]);
}

/* The smallest host limit: one pinned slab (offload_impl.h's GP_HOST_SLAB,
 * 32 MiB), below which nothing could ever be offloaded. */
#define GP_HOST_LIMIT_MIN (32 * MiB)

/* A host reserve is pinned within the host limit: one above it could
 * never be pinned whole, refused whichever of the two is given last. */
static int gp_host_reserve_conflict(const gp_config *c, char *why, size_t n)
{
    uint64_t ram = gp_host_ram();
    uint64_t reserve = gp_size_resolve(c->host_reserve, ram), limit = gp_size_resolve(c->host_limit, ram);
    if (!reserve || !limit || reserve <= limit) return 0;
    char r[32], l[32];
    gp_spec_print(c->host_reserve, r, sizeof r);
    gp_spec_print(c->host_limit, l, sizeof l);
    /* (Short: `why` holds 192 bytes.) */
    snprintf(why, n, "GPUPOOL_HOST_RESERVE=%s (%llu bytes) is above GPUPOOL_HOST_LIMIT=%s (%llu bytes); "
                     "expected at most the limit", r, (unsigned long long)reserve, l, (unsigned long long)limit);
    return GP_CONFLICT;
}

static int gp_parse_host_limit(gp_config *c, const char *v, char *why, size_t n)
{
    gp_size_spec s;
    if (gp_spec_parse(&s, v, why, n) != 0) return -1;
    if (s.bytes && s.bytes < GP_HOST_LIMIT_MIN)
        return snprintf(why, n, "it is less than 32MiB, the pinned slab offload allocates: nothing could be "
                                "offloaded; give at least 32MiB, or none"), -1;
    c->host_limit = s;
    return gp_host_reserve_conflict(c, why, n);
}

static int gp_parse_host_reserve(gp_config *c, const char *v, char *why, size_t n)
{
    if (gp_spec_parse(&c->host_reserve, v, why, n) != 0) return -1;
    return gp_host_reserve_conflict(c, why, n);
}

/* (Nothing prints as 0, the default: a reserve is an amount, not a cap.) */
static int gp_print_host_reserve(const gp_config *c, char *buf, size_t len)
{
    gp_size_spec s = c->host_reserve;
    return s.bytes || s.fraction > 0 ? gp_spec_print(s, buf, len) : snprintf(buf, len, "0");
}




/* A duration: digits with an optional fraction, then ms, s (the default
 * unit) or min; at most a day, in milliseconds.  The value must be a whole
 * number of milliseconds: 1.5ms or 0.0001s are refused rather than rounded
 * (a non-zero duration once rounded to 0, which means "do not wait"). */
static int gp_duration_scan(const char *v, uint64_t *out, char *why, size_t n)
{
    static const struct { const char *name; uint64_t ms; } units[] = {{"", 1000}, {"s", 1000},
                                                                      {"ms", 1}, {"min", 60000}};
    uint64_t whole = 0, num = 0, den = 1;
    int fine = 0; /* a non-zero digit past the 6th after the point */
    const char *s = v;
    if (!gp_digit(*s)) return snprintf(why, n, "it must start with a digit"), -1;
    for (; gp_digit(*s); s++) {
        whole = whole * 10 + (uint64_t)(*s - '0');
        if (whole > 86400000) return snprintf(why, n, "it is longer than a day"), -1;
    }
    if (*s == '.') {
        if (!gp_digit(*++s)) return snprintf(why, n, "a digit must follow the point"), -1;
        for (int k = 0; gp_digit(*s); s++, k++) {
            if (k < 6) num = num * 10 + (uint64_t)(*s - '0'), den *= 10;
            else fine |= *s != '0';
        }
    }
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (!gp_ieq(s, units[i].name)) continue;
        /* 6 digits of a fraction of a minute at most: whole ms need fewer. */
        if (fine || num * units[i].ms % den)
            return snprintf(why, n, "it is not a whole number of milliseconds (the precision is 1ms)"), -1;
        uint64_t ms = whole * units[i].ms + num * units[i].ms / den;
        if (ms > 86400000) return snprintf(why, n, "it is longer than a day"), -1;
        *out = ms;
        return 0;
    }
    return snprintf(why, n, "the unit is not ms, s or min"), -1;
}

static int gp_duration_print(uint64_t ms, char *buf, size_t len)
{
    if (ms % 1000) return snprintf(buf, len, "%llums", (unsigned long long)ms);
    return snprintf(buf, len, "%llus", (unsigned long long)(ms / 1000));
}





/* Options that are a plain size spec, boolean or duration: their parser
 * and printer, gp_parse_<field> and gp_print_<field>. */
#define GP_SPEC_PRINTER(field)                                                  \
    static int gp_print_##field(const gp_config *c, char *buf, size_t len)     \
    {                                                                           \
        return gp_spec_print(c->field, buf, len);                               \
    }
#define GP_SPEC_OPTION(field)                                                   \
    static int gp_parse_##field(gp_config *c, const char *v, char *why, size_t n) \
    {                                                                           \
        return gp_spec_parse(&c->field, v, why, n);                             \
    }                                                                           \
    GP_SPEC_PRINTER(field)
#define GP_BOOL_OPTION(field)                                                   \
    static int gp_parse_##field(gp_config *c, const char *v, char *why, size_t n) \
    {                                                                           \
        (void)why, (void)n;                                                     \
        return gp_bool(&c->field, v);                                           \
    }                                                                           \
    static int gp_print_##field(const gp_config *c, char *buf, size_t len)     \
    {                                                                           \
        return snprintf(buf, len, "%d", c->field != 0);                         \
    }
#define GP_DURATION_OPTION(field)                                               \
    static int gp_parse_##field(gp_config *c, const char *v, char *why, size_t n) \
    {                                                                           \
        return gp_duration_scan(v, &c->field, why, n);                          \
    }                                                                           \
    static int gp_print_##field(const gp_config *c, char *buf, size_t len)     \
    {                                                                           \
        return gp_duration_print(c->field, buf, len);                           \
    }

GP_SPEC_OPTION(limit)
GP_SPEC_OPTION(device_limit)
GP_SPEC_PRINTER(host_limit)
GP_BOOL_OPTION(trace)
GP_BOOL_OPTION(debug)
GP_BOOL_OPTION(torch_patch)
GP_BOOL_OPTION(tenant_swap)
GP_DURATION_OPTION(reclaim_timeout_ms)
GP_DURATION_OPTION(tenant_turn_ms)

static int gp_parse_share(gp_config *c, const char *v, char *why, size_t n)
{
    gp_size_spec s;
    if (gp_ieq(v, "1")) return c->tenant_share = 1, 0; /* (a size scan reads 1 byte) */
    if (gp_size_scan(v, 1, &s, why, n) != 0) return -1;
    if (s.bytes) return snprintf(why, n, "it is a size, not a fraction"), -1;
    if (!(s.fraction > 0 && s.fraction <= 1)) return snprintf(why, n, "it is not above 0 and at most 1"), -1;
    c->tenant_share = s.fraction;
    return 0;
}

static int gp_print_share(const gp_config *c, char *buf, size_t len)
{
    return gp_percent_print(c->tenant_share, buf, len);
}

/* The table: variable, keyword, default, accepted values, meaning, parser,
 * printer.  The variable is always GPUPOOL_ and the keyword in upper case.
 * The default is the one list of defaults: gp_config_default parses it (its
 * first word; a note may follow). */
#define GP_OPTIONS(X)                                                                     \
    X("GPUPOOL_MODE", "mode", "expandable", "expandable or reserve",                      \
      "expandable: map chunks as the pool grows and give them back; reserve: map the "    \
      "whole pool at start, never again",                                                 \
      gp_parse_mode, gp_print_mode)                                                       \
    X("GPUPOOL_RESERVE", "reserve", "none (80% in reserve mode)",                         \
      GP_SIZE_TEXT "; none or 0 for the default",                                         \
      "size of the pool in reserve mode; a size implies GPUPOOL_MODE=reserve (with "      \
      "GPUPOOL_MODE=expandable it is an error)",                                          \
      gp_parse_reserve, gp_print_reserve)                                                 \
    X("GPUPOOL_LIMIT", "limit", "none", GP_SIZE_TEXT "; none or 0 for no limit",          \
      "cap on the bytes gpupool reserves on a device", gp_parse_limit, gp_print_limit)    \
    X("GPUPOOL_PRIORITY", "priority", "normal", GP_PRIO_TEXT,                             \
      "default priority of allocations; higher is more important", gp_parse_prio,        \
      gp_print_prio)                                                                      \
    X("GPUPOOL_CODEC", "codec", "auto", GP_CODEC_NAMES_TEXT,                              \
      "compression of memory offloaded to the host: auto is nvCOMP's ANS on a GPU (raw "  \
      "without nvCOMP) and zstd on byte planes on the host backend",                      \
      gp_parse_codec, gp_print_codec)                                                     \
    X("GPUPOOL_NVCOMP", "nvcomp", "none",                                                 \
      "the path of libnvcomp.so.6 (a shared library) or of a folder holding it; none to search",          \
      "where to load nvCOMP 6 from; unset: the nvidia-libnvcomp-cu13 wheel, then the "    \
      "system's libnvcomp.so.6", gp_parse_nvcomp, gp_print_nvcomp)                        \
    X("GPUPOOL_OFFLOAD_THREADS", "offload_threads", "8", "an integer 1..64",              \
      "threads that unmap offloaded memory behind its copies (a restore maps ahead on "  \
      "one thread of its own, in address order)",                                        \
      gp_parse_threads, gp_print_threads)                                                 \
    X("GPUPOOL_TENANT", "tenant", "none",                                                 \
      "1 to 63 characters of A-Z, a-z, 0-9, '_', '.' and '-'; none for no tenant",        \
      "group of processes sharing a GPU: they register in a shared tenant registry and "  \
      "give memory back to higher priorities when asked (no group: no registry)",         \
      gp_parse_tenant, gp_print_tenant)                                                   \
    X("GPUPOOL_LOG", "log", "oom", "off, oom or all",                                     \
      "what to print on stderr: nothing; the report of each allocation PyTorch asked for " \
      "that ran out of memory; or also each pool's creation and every map (growth), unmap " \
      "(trim), device synchronisation and host wait for a stream (a trim's, an offload's), " \
      "with its duration and thread (slow paths only)",                                   \
      gp_parse_log, gp_print_log)                                                         \
    X("GPUPOOL_TRACE", "trace", "0", GP_BOOL_TEXT,                                        \
      "record an alloc/free history for snapshots", gp_parse_trace, gp_print_trace)       \
    X("GPUPOOL_CHUNK", "chunk", "2MiB", "a power of two between 64KiB and 1GiB",          \
      "physical mapping unit: memory is mapped and given back in chunks of this size",    \
      gp_parse_chunk, gp_print_chunk)                                                     \
    X("GPUPOOL_SMALL_SIZE", "small_size", "1MiB", "a size between 4KiB and 64MiB",        \
      "requests below this size come from the small-block arena", gp_parse_small,         \
      gp_print_small)                                                                     \
    X("GPUPOOL_TORCH_PATCH", "torch_patch", "1", GP_BOOL_TEXT,                            \
      "route torch.cuda memory APIs to gpupool", gp_parse_torch_patch,                   \
      gp_print_torch_patch)                                                               \
    X("GPUPOOL_PLACEMENT", "placement", "lifetime", "lifetime or none",                   \
      "lifetime: blocks of long-lived tags (weights, optimizer, kv_cache, ...) come from "\
      "a region of their own, apart from short-lived churn (expandable mode); none: one " \
      "region for all", gp_parse_placement, gp_print_placement)                          \
    X("GPUPOOL_LARGE_CHUNK", "large_chunk", "64MiB",                                      \
      "a power of two between 64KiB and 1GiB, at least GPUPOOL_CHUNK",                    \
      "mapping unit of the large-block arena (at least GPUPOOL_CHUNK, at most 1/32 of "   \
      "the device): a large unit makes growing cheap, a driver call per unit",            \
      gp_parse_large_chunk, gp_print_large_chunk)                                         \
    X("GPUPOOL_CACHE_SLACK", "cache_slack", "5%",                                         \
      "a percentage such as 5% or a fraction such as 0.05; 0 (or 0%); none",             \
      "free memory the pool may keep mapped, as a share of allocated bytes, when it must " \
      "grow: beyond it, cached chunks are given back (one device sync) before new ones "  \
      "are mapped; none keeps every cached chunk",                                        \
      gp_parse_slack, gp_print_slack)                                                     \
    X("GPUPOOL_HOST_LIMIT", "host_limit", "50%",                                          \
      GP_SIZE_TEXT ", at least 32MiB; none or 0 for no limit",                             \
      "cap on the pinned host memory that offloaded memory may take; a percentage or "    \
      "fraction is of the host's physical memory", gp_parse_host_limit,                  \
      gp_print_host_limit)                                                                \
    X("GPUPOOL_HOST_RESERVE", "host_reserve", "0",                                        \
      GP_SIZE_TEXT ", at most GPUPOOL_HOST_LIMIT; 0 or none for nothing",                  \
      "host memory pinned in the background when the offloader is made, so that the "     \
      "first offloads find it ready (pinning is slower than the copies); a percentage or " \
      "fraction is of the host's physical memory", gp_parse_host_reserve,                 \
      gp_print_host_reserve)                                                              \
    X("GPUPOOL_DEBUG", "debug", "0", GP_BOOL_TEXT,                                        \
      "check the pool's integrity every " GP_XSTR(GP_DEBUG_EVERY) " allocations and frees " \
      "(slow); abort with the violation on stderr if it is corrupt",                      \
      gp_parse_debug, gp_print_debug)                                                     \
    X("GPUPOOL_DEVICE_LIMIT", "device_limit", "none",                                     \
      GP_SIZE_TEXT ", at least GPUPOOL_CHUNK; none or 0 for the device",                   \
      "with GPUPOOL_TENANT: the memory the whole group may map on the device, enforced "  \
      "across its processes (e.g. 24GiB: the group sees a 24 GB card)",                   \
      gp_parse_device_limit, gp_print_device_limit)                                       \
    X("GPUPOOL_RECLAIM_TIMEOUT", "reclaim_timeout", "30s",                                \
      "a duration such as 30, 2.5s, 500ms or 2min, in whole milliseconds, at most a day; 0: do not wait",       \
      "with GPUPOOL_TENANT: how long an allocation waits for other tenants to give "      \
      "memory back before it fails", gp_parse_reclaim_timeout_ms,                         \
      gp_print_reclaim_timeout_ms)                                                        \
    X("GPUPOOL_TENANT_TURN", "tenant_turn", "1s",                                        \
      "a duration such as 1s, 250ms or 2min, in whole milliseconds, at most a day; 0: a turn of one step",     \
      "with GPUPOOL_TENANT and yield points: how long a tenant keeps its memory across "  \
      "its steps while one of its own priority waits (each handover unmaps and maps the " \
      "step's memory); a higher priority never waits for it", gp_parse_tenant_turn_ms,    \
      gp_print_tenant_turn_ms)                                                            \
    X("GPUPOOL_TENANT_SHARE", "tenant_share", "25%",                                      \
      "a percentage such as 50% or a fraction such as 0.5, above 0; 100% (or 1): no pause", \
      "with GPUPOOL_TENANT: the share of the time that the tenants below a busy "         \
      "higher-priority one may compute, together: they pause at their yield points (or, " \
      "without any, at an allocation every 100 ms) so that it keeps most of the GPU",     \
      gp_parse_share, gp_print_share)                \
    X("GPUPOOL_TENANT_SWAP", "tenant_swap", "1", GP_BOOL_TEXT,                            \
      "with GPUPOOL_TENANT: while this tenant is parked (in an allocation, a restore or a " \
      "yield point) and a tenant ahead of it in line cannot be served, it may be swapped " \
      "out whole to host memory and back at the same addresses before the call returns " \
      "(the host memory of its swap, as much as it holds, is pinned ahead within "       \
      "GPUPOOL_HOST_LIMIT); 0 for a process whose threads launch GPU work without "      \
      "allocating while another one allocates", gp_parse_tenant_swap, gp_print_tenant_swap)

#define GP_INFO(env, key, def, accepted, help, parse, print) {env, key, def, accepted, help},
static const gp_option_info gp_options[] = {GP_OPTIONS(GP_INFO)};
#undef GP_INFO

#define GP_HANDLERS(env, key, def, accepted, help, parse, print) {parse, print},
static const struct {
    gp_parse_fn parse;
    gp_print_fn print;
} gp_handlers[] = {GP_OPTIONS(GP_HANDLERS)};
#undef GP_HANDLERS

#define GP_N_OPTIONS (sizeof gp_options / sizeof gp_options[0])

const gp_option_info *gp_config_options(size_t *count)
{
    if (count) *count = GP_N_OPTIONS;
    return gp_options;
}

/* The defaults are the table's: each option's default text, parsed by its
 * own parser, up to the first space (what follows is a note: "none (80% in
 * reserve mode)"), so that what is documented is what is set. */
void gp_config_default(gp_config *cfg)
{
    *cfg = (gp_config){0};
    for (size_t i = 0; i < GP_N_OPTIONS; i++) {
        char def[32], why[96] = "";
        snprintf(def, sizeof def, "%.*s", (int)strcspn(gp_options[i].def, " "), gp_options[i].def);
        if (gp_handlers[i].parse(cfg, def, why, sizeof why) != 0) {
            /* A slip in the table, which test_config finds first. */
            fprintf(stderr, "gpupool: the default of %s, '%s', does not parse: %s\n", gp_options[i].env, def, why);
            abort();
        }
    }
    cfg->mode_given = cfg->large_chunk_given = 0; /* defaults, not given */
}

static int gp_option_find(const char *name)
{
    for (size_t i = 0; i < GP_N_OPTIONS; i++)
        if (gp_ieq(name, gp_options[i].env) || gp_ieq(name, gp_options[i].key)) return (int)i;
    return -1;
}

/* "a, b, c" of the keywords (or the variables) for "unknown option". */
static void gp_option_list(int env, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < GP_N_OPTIONS && at < len; i++) {
        int k = snprintf(buf + at, len - at, "%s%s", i ? ", " : "",
                         env ? gp_options[i].env : gp_options[i].key);
        if (k > 0) at += (size_t)k;
    }
}

gp_status gp_config_set(gp_config *cfg, const char *name, const char *value)
{
    char list[512], why[192] = "";
    if (!cfg || !name) return gp_error_set(GP_ERR_INVALID, "gp_config_set: cfg or name is NULL");
    int i = gp_option_find(name);
    if (i < 0) {
        gp_option_list(0, list, sizeof list);
        return gp_error_set(GP_ERR_INVALID, "unknown gpupool option " GP_QUOTE "; the options are %s",
                            GP_QUOTE_ARG(name), list);
    }
    const gp_option_info *o = &gp_options[i];
    if (!value) return gp_error_set(GP_ERR_INVALID, "%s: no value given; expected %s", o->env, o->accepted);
    gp_config next = *cfg;
    int rc = *value ? gp_handlers[i].parse(&next, value, why, sizeof why) : -1;
    if (rc == 0) {
        *cfg = next;
        return GP_OK;
    }
    if (rc == GP_CONFLICT)
        return gp_error_set(GP_ERR_INVALID, "%s=" GP_QUOTE ": %s", o->env, GP_QUOTE_ARG(value), why);
    if (!*value) snprintf(why, sizeof why, "it is empty (unset it for the default)");
    return gp_error_set(GP_ERR_INVALID, "%s=" GP_QUOTE " is not valid: %s%sexpected %s", o->env,
                        GP_QUOTE_ARG(value), why, *why ? "; " : "", o->accepted);
}

gp_status gp_config_from_env(gp_config *cfg)
{
    char list[512];
    if (!cfg) return gp_error_set(GP_ERR_INVALID, "gp_config_from_env: cfg is NULL");
    /* Unknown names first: a typo is the likelier mistake, and in any
     * letter case it must not pass silently. */
    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        size_t k = eq ? (size_t)(eq - *e) : strlen(*e);
        if (k < 8) continue;
        int ours = 1;
        for (size_t j = 0; j < 8; j++) ours &= gp_lower((unsigned char)(*e)[j]) == "gpupool_"[j];
        if (!ours) continue;
        int known = 0;
        for (size_t i = 0; i < GP_N_OPTIONS && !known; i++)
            known = strlen(gp_options[i].env) == k && memcmp(gp_options[i].env, *e, k) == 0;
        if (!known) {
            gp_option_list(1, list, sizeof list);
            return gp_error_set(GP_ERR_INVALID,
                                "unknown gpupool variable %.*s in the environment; the "
                                "variables are %s", (int)(k > 80 ? 80 : k), *e, list);
        }
    }
    /* Table order, not environment order, so that the first error reported
     * does not depend on how the shell listed the variables. */
    gp_config next = *cfg;
    for (size_t i = 0; i < GP_N_OPTIONS; i++) {
        const char *v = getenv(gp_options[i].env);
        if (v && gp_config_set(&next, gp_options[i].env, v) != GP_OK) return GP_ERR_INVALID;
    }
    *cfg = next;
    return GP_OK;
}

gp_status gp_config_validate(const gp_config *cfg, uint64_t device_total)
{
    if (!cfg) return gp_error_set(GP_ERR_INVALID, "gp_config_validate: cfg is NULL");
    char given[64], chunk[32];
    gp_size_print(cfg->chunk, chunk, sizeof chunk);
    if (cfg->large_chunk_given && cfg->large_chunk < cfg->chunk) {
        gp_size_print(cfg->large_chunk, given, sizeof given);
        return gp_error_set(GP_ERR_INVALID,
                            "GPUPOOL_LARGE_CHUNK=%s is less than GPUPOOL_CHUNK=%s: the large-block arena maps "
                            "whole chunks; give at least %s, or unset GPUPOOL_LARGE_CHUNK", given, chunk, chunk);
    }
    gp_size_spec d = cfg->device_limit;
    if (d.bytes || d.fraction > 0) {
        gp_spec_print(d, given, sizeof given);
        if (!cfg->tenant[0])
            return gp_error_set(GP_ERR_INVALID,
                                "GPUPOOL_DEVICE_LIMIT=%s is set without GPUPOOL_TENANT: it is the memory a tenant "
                                "group shares, and there is no group; set GPUPOOL_TENANT to the group's name, or "
                                "use GPUPOOL_LIMIT to cap this process alone", given);
        uint64_t bytes = d.bytes || device_total ? gp_size_resolve(d, device_total) : cfg->chunk;
        if (bytes < cfg->chunk)
            return gp_error_set(GP_ERR_INVALID,
                                "GPUPOOL_DEVICE_LIMIT=%s is %llu bytes, less than one chunk (GPUPOOL_CHUNK=%s): "
                                "the group could map nothing; give at least %s, or none for the device", given,
                                (unsigned long long)bytes, chunk, chunk);
    }
    gp_size_spec l = cfg->limit;
    if (!l.bytes && !(l.fraction > 0)) return GP_OK; /* no limit */
    if (!l.bytes && !device_total) return GP_OK;     /* a fraction of a device not known yet */
    uint64_t bytes = gp_size_resolve(l, device_total);
    if (bytes >= cfg->chunk) return GP_OK;
    /* Below one chunk nothing can be mapped, so every allocation would fail
     * (and a fraction that resolves to 0 would mean no limit at all). */
    char dev[40] = "";
    gp_spec_print(l, given, sizeof given);
    if (!l.bytes) {
        char total[32];
        gp_size_print(device_total, total, sizeof total);
        snprintf(dev, sizeof dev, " of %s", total);
    }
    return gp_error_set(GP_ERR_INVALID,
                        "GPUPOOL_LIMIT=%s is %llu bytes%s%s, less than one chunk (GPUPOOL_CHUNK=%s): no "
                        "allocation could succeed; give at least %s, or none for no limit",
                        given, (unsigned long long)bytes, *dev ? " on a device" : "", dev, chunk, chunk);
}

gp_status gp_config_get(const gp_config *cfg, const char *name, char *buf, size_t len)
{
    if (!cfg || !name || !buf || !len)
        return gp_error_set(GP_ERR_INVALID, "gp_config_get: cfg, name or buf is NULL or empty");
    int i = gp_option_find(name);
    if (i < 0) {
        char list[512];
        gp_option_list(0, list, sizeof list);
        buf[0] = '\0';
        return gp_error_set(GP_ERR_INVALID, "unknown gpupool option " GP_QUOTE "; the options are %s",
                            GP_QUOTE_ARG(name), list);
    }
    int k = gp_handlers[i].print(cfg, buf, len);
    if (k < 0 || (size_t)k >= len)
        return gp_error_set(GP_ERR_INVALID, "gp_config_get: %s needs %d bytes, the buffer has %zu",
                            gp_options[i].env, k + 1, len);
    return GP_OK;
}
