/* Shared by test_api.c and test_internals.c: a pool of live blocks, each
 * stamped with its own pattern over its whole usable size, for overlap and
 * contents checks; the size classes of the documented scheme; and RUN, which
 * runs one test function and prints its name and time.
 *
 * The including file defines TEST_NAME, the program's name that RUN
 * prints, before it includes this header.
 */
#ifndef HAKMEM_TESTS_BLOCK_POOL_H
#define HAKMEM_TESTS_BLOCK_POOL_H

#include "api.h"

#include <time.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* ------------------------------------------------------------------ */
/* block pool: live blocks with their stamp, for overlap/pattern checks */

typedef struct blk {
  unsigned char *p;
  size_t req;
  size_t usable;
  size_t align; /* alignment requested (8 for malloc) */
  uint64_t seed;
} blk;

static HKT_UNUSED blk *pool;
static HKT_UNUSED size_t pool_n, pool_cap;
static HKT_UNUSED uint64_t seed_counter = 1;

static HKT_UNUSED void pool_reserve(size_t n) {
  /* bookkeeping uses the libc allocator through API() too; that is fine:
   * it is just one more (large) block */
  if (n <= pool_cap) return;
  blk *np = (blk *)API(realloc)(pool, n * sizeof(blk));
  CHECK(np != NULL, "realloc of the test's bookkeeping array (%zu entries) failed", n);
  pool = np;
  pool_cap = n;
}

static HKT_UNUSED size_t usable_of(const void *p) { return API(malloc_usable_size)((void *)p); }

/* Basic checks for a freshly allocated block of `req` bytes, then stamps the
 * whole usable size. `align` is the alignment the call promised. */
static HKT_UNUSED blk check_new(void *vp, size_t req, size_t align, const char *what) {
  CHECK(vp != NULL, "%s(%zu) returned NULL", what, req);
  unsigned char *p = (unsigned char *)vp;
  size_t u = usable_of(p);
  CHECK(u >= req, "%s(%zu) = %p: malloc_usable_size %zu < requested %zu", what, req, vp, u, req);
  CHECK(u < req + 64 * MiB, "%s(%zu) = %p: malloc_usable_size %zu is absurd", what, req, vp, u);
  CHECK((uintptr_t)p % align == 0, "%s(%zu) = %p is not %zu-aligned", what, req, vp, align);
  blk b = {p, req, u, align, seed_counter++};
  hkt_fill(p, u, b.seed);
  return b;
}

static HKT_UNUSED void verify_blk(const blk *b, const char *when) {
  size_t bad = hkt_verify(b->p, b->usable, b->seed);
  CHECK(bad == HKT_OK, "%s: block %p (requested %zu, usable %zu): byte %zu was overwritten (0x%02x, expected 0x%02x)",
        when, (void *)b->p, b->req, b->usable, bad, b->p[bad], hkt_pat(bad, b->seed));
}

static HKT_UNUSED void verify_pool(const char *when) {
  for (size_t i = 0; i < pool_n; i++) verify_blk(&pool[i], when);
}

static HKT_UNUSED int cmp_blk(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const blk *)a)->p, y = (uintptr_t)((const blk *)b)->p;
  return x < y ? -1 : x > y;
}

/* Sorts the pool by address and checks that no two live blocks overlap
 * (neither their usable ranges nor their start addresses). */
static HKT_UNUSED void check_pool_disjoint(const char *when) {
  qsort(pool, pool_n, sizeof(blk), cmp_blk);
  for (size_t i = 1; i < pool_n; i++) {
    const blk *a = &pool[i - 1], *b = &pool[i];
    CHECK(a->p != b->p, "%s: two live blocks at the same address %p (requested %zu and %zu)", when, (void *)a->p,
          a->req, b->req);
    CHECK(a->p + a->usable <= b->p,
          "%s: live blocks overlap: %p+%zu (requested %zu) and %p (requested %zu)", when, (void *)a->p, a->usable,
          a->req, (void *)b->p, b->req);
  }
}

static HKT_UNUSED void pool_add(blk b) {
  if (pool_n == pool_cap) pool_reserve(pool_cap ? pool_cap * 2 : 1024);
  pool[pool_n++] = b;
}

static HKT_UNUSED void pool_free_all(void) {
  /* free in an interleaved order: odd entries first, then even */
  for (size_t i = 1; i < pool_n; i += 2) API(free)(pool[i].p);
  for (size_t i = 0; i < pool_n; i += 2) API(free)(pool[i].p);
  pool_n = 0;
}

static HKT_UNUSED size_t malloc_align_for(size_t n) {
  /* glibc's guarantee, which C++ compilers assume of operator new: 16 bytes
   * for every size above 8 */
  return n > 8 ? 16 : 8;
}

static HKT_UNUSED blk do_malloc(size_t n) { return check_new(API(malloc)(n), n, malloc_align_for(n), "malloc"); }

static HKT_UNUSED void check_zero(const void *p, size_t n, const char *what) {
  const unsigned char *c = (const unsigned char *)p;
  for (size_t i = 0; i < n; i++)
    CHECK(c[i] == 0, "%s: byte %zu of %zu is 0x%02x, expected 0 (reused memory not cleared)", what, i, n, c[i]);
}

/* Class sizes per the documented scheme. */
static HKT_UNUSED size_t n_classes;
static HKT_UNUSED size_t class_sizes[200];
static HKT_UNUSED void compute_classes(void) {
  class_sizes[n_classes++] = 8;
  for (size_t s = 16; s <= 128; s += 16) class_sizes[n_classes++] = s;
  for (size_t p2 = 128; p2 < MiB; p2 *= 2)
    for (size_t k = 9; k <= 16; k++) class_sizes[n_classes++] = p2 / 8 * k;
  CHECK(n_classes == 113, "internal: %zu classes", n_classes);
}

static HKT_UNUSED double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

#define RUN(fn)                                                  \
  do {                                                           \
    printf(TEST_NAME " [%s]: %s ...", API_MODE, #fn);           \
    fflush(stdout);                                              \
    double t0_ = now_s();                                        \
    fn();                                                        \
    printf(" ok (%.2f s)\n", now_s() - t0_);                     \
    fflush(stdout);                                              \
  } while (0)

#endif /* HAKMEM_TESTS_BLOCK_POOL_H */
