/*
 * test_range_set.c -- range_set.h against a model (an array of what was
 * added): random adds and removes at densities that grow and shrink the
 * table, addresses that collide in the hash (one page apart, and far apart
 * with equal low bits), removes of what is not there, and walks that must
 * see every range once.
 *
 * Run under ASan and UBSan by tests/test_c.py.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "range_set.h"
#include "rng.h"

#define MAXN 5000

static uintptr_t model_addr[MAXN];
static uint64_t model_size[MAXN];
static size_t model_n;

typedef struct walk {
    size_t seen, wrong;
} walk;

static size_t model_find(uintptr_t addr)
{
    size_t i = 0;
    while (i < model_n && model_addr[i] != addr) i++;
    return i;
}

static gp_status visit(const gp_range *r, void *arg)
{
    walk *w = arg;
    size_t i = model_find(r->addr);
    w->seen++;
    w->wrong += i == model_n || model_size[i] != r->size;
    return GP_OK;
}

static gp_status stop_at_third(const gp_range *r, void *arg)
{
    (void)r;
    return ++*(int *)arg == 3 ? GP_ERR_BACKEND : GP_OK;
}

/* Addresses as a backend's mappings have them: page-aligned, a few
 * patterns that put many in one probe chain. */
static uintptr_t some_addr(void)
{
    uint64_t k = rnd() % 3, x = rnd() % 4096;
    if (k == 0) return (uintptr_t)(0x7f0000000000ull + x * 4096);      /* neighbours */
    if (k == 1) return (uintptr_t)(0x7f0000000000ull + (x << 32));     /* equal low bits */
    return (uintptr_t)(0x100000000ull + (rnd() % (1ull << 30)) * 2097152ull);
}

static int model_agrees(const gp_range_set *s)
{
    walk w = {0, 0};
    CHECK(gp_range_set_each(s, visit, &w) == GP_OK);
    return w.seen == model_n && w.wrong == 0 && s->n == model_n;
}

int main(void)
{
    gp_range_set s = {0};
    rng_state = 0x243f6a8885a308d3ull;
    CHECK(gp_range_set_remove(&s, 0x1000) == 0); /* empty, no table */
    int agree = 1;
    for (int round = 0; round < 4; round++) {
        size_t target = round % 2 ? 50 : MAXN; /* grow, then shrink to a few */
        for (int op = 0; op < 40000; op++) {
            int add = model_n < target ? rnd() % 4 != 0 : rnd() % 4 == 0;
            if (add && model_n < MAXN) {
                uintptr_t a = some_addr();
                if (model_find(a) < model_n) continue;
                uint64_t size = 4096 * (1 + rnd() % 512);
                CHECK(gp_range_set_add(&s, a, size) == GP_OK);
                model_addr[model_n] = a;
                model_size[model_n++] = size;
            } else if (rnd() % 8 == 0) {
                uintptr_t a = some_addr();
                CHECK(gp_range_set_remove(&s, a) == (model_find(a) < model_n));
                size_t i = model_find(a);
                if (i < model_n) model_addr[i] = model_addr[--model_n], model_size[i] = model_size[model_n];
            } else if (model_n) {
                size_t i = rnd() % model_n;
                CHECK(gp_range_set_remove(&s, model_addr[i]) == 1);
                CHECK(gp_range_set_remove(&s, model_addr[i]) == 0);
                model_addr[i] = model_addr[--model_n];
                model_size[i] = model_size[model_n];
            }
            if (op % 997 == 0) agree &= model_agrees(&s);
        }
        agree &= model_agrees(&s);
    }
    CHECK(agree);
    CHECK(2 * s.n <= s.cap); /* at most half full */
    /* A walk stops at the first status that is not GP_OK, and says it. */
    int calls = 0;
    CHECK(s.n >= 3 && gp_range_set_each(&s, stop_at_third, &calls) == GP_ERR_BACKEND && calls == 3);
    /* Every range removed leaves the table empty (no tombstones to walk). */
    while (model_n) CHECK(gp_range_set_remove(&s, model_addr[--model_n]) == 1);
    CHECK(s.n == 0 && model_agrees(&s));
    gp_range_set_clear(&s);
    CHECK(s.slot == NULL && s.cap == 0 && s.n == 0);
    CHECK(gp_range_set_add(&s, 0x200000, 4096) == GP_OK && gp_range_set_remove(&s, 0x200000) == 1);
    gp_range_set_clear(&s);
    return check_done();
}
