/* test_api: semantics of every allocation entry point, for every size class
 * and tier (small <= 128 B, size classes up to 1 MiB, large mapped blocks
 * above), checked against the C library contract.
 *
 * Built twice: with -DHAK_API_PREFIX against hakmem-api (hak_malloc, ...) and
 * with plain names against the override library (malloc, ... resolve to
 * hakmem). See api.h.
 */
#define _GNU_SOURCE
#include "api.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

static blk *pool;
static size_t pool_n, pool_cap;
static uint64_t seed_counter = 1;

static void pool_reserve(size_t n) {
  /* bookkeeping uses the libc allocator through API() too; that is fine:
   * it is just one more (large) block */
  if (n <= pool_cap) return;
  blk *np = (blk *)API(realloc)(pool, n * sizeof(blk));
  CHECK(np != NULL, "realloc of the test's bookkeeping array (%zu entries) failed", n);
  pool = np;
  pool_cap = n;
}

static size_t usable_of(const void *p) { return API(malloc_usable_size)((void *)p); }

/* Basic checks for a freshly allocated block of `req` bytes, then stamps the
 * whole usable size. `align` is the alignment the call promised. */
static blk check_new(void *vp, size_t req, size_t align, const char *what) {
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

static void verify_blk(const blk *b, const char *when) {
  size_t bad = hkt_verify(b->p, b->usable, b->seed);
  CHECK(bad == HKT_OK, "%s: block %p (requested %zu, usable %zu): byte %zu was overwritten (0x%02x, expected 0x%02x)",
        when, (void *)b->p, b->req, b->usable, bad, b->p[bad], hkt_pat(bad, b->seed));
}

static void verify_pool(const char *when) {
  for (size_t i = 0; i < pool_n; i++) verify_blk(&pool[i], when);
}

static int cmp_blk(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const blk *)a)->p, y = (uintptr_t)((const blk *)b)->p;
  return x < y ? -1 : x > y;
}

/* Sorts the pool by address and checks that no two live blocks overlap
 * (neither their usable ranges nor their start addresses). */
static void check_pool_disjoint(const char *when) {
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

static void pool_add(blk b) {
  if (pool_n == pool_cap) pool_reserve(pool_cap ? pool_cap * 2 : 1024);
  pool[pool_n++] = b;
}

static void pool_free_all(void) {
  /* free in an interleaved order: odd entries first, then even */
  for (size_t i = 1; i < pool_n; i += 2) API(free)(pool[i].p);
  for (size_t i = 0; i < pool_n; i += 2) API(free)(pool[i].p);
  pool_n = 0;
}

static size_t malloc_align_for(size_t n) {
  /* glibc's guarantee, which C++ compilers assume of operator new: 16 bytes
   * for every size above 8 */
  return n > 8 ? 16 : 8;
}

static blk do_malloc(size_t n) { return check_new(API(malloc)(n), n, malloc_align_for(n), "malloc"); }

/* free_sized / free_aligned_sized: in plain-name mode they are weak
 * references; a missing export falls back to free() here and is reported as
 * a failure by test_free_sized. */
static int missing_sized_free;
static void do_free_sized(void *p, size_t n) {
#ifndef HAK_API_PREFIX
  if (free_sized == NULL) {
    missing_sized_free = 1;
    free(p);
    return;
  }
#endif
  API(free_sized)(p, n);
}
static void do_free_aligned_sized(void *p, size_t align, size_t n) {
#ifndef HAK_API_PREFIX
  if (free_aligned_sized == NULL) {
    missing_sized_free = 1;
    free(p);
    return;
  }
#endif
  API(free_aligned_sized)(p, align, n);
}

/* ------------------------------------------------------------------ */

static void test_version_and_null(void) {
  const char *v = hak_version();
  CHECK(v != NULL, "hak_version() returned NULL");
  char want[32];
  snprintf(want, sizeof want, "%d.%d.%d", HAKMEM_VERSION_MAJOR, HAKMEM_VERSION_MINOR, HAKMEM_VERSION_PATCH);
  CHECK(strcmp(v, want) == 0, "hak_version() = \"%s\", expected \"%s\"", v, want);
  CHECK(API(malloc_usable_size)(NULL) == 0, "malloc_usable_size(NULL) = %zu, expected 0",
        API(malloc_usable_size)(NULL));
  API(free)(NULL);
  API(free)(hkt_opaque_ptr(NULL));
}

/* Every size 0..4096, all live at once; then the same again (reuse). */
static void test_sizes_linear(void) {
  for (int round = 0; round < 2; round++) {
    for (size_t n = 0; n <= 4096; n++) pool_add(do_malloc(n));
    check_pool_disjoint("sizes 0..4096");
    verify_pool("sizes 0..4096");
    pool_free_all();
  }
}

/* Geometric sizes from 4 KiB to 16 MiB plus every interesting boundary. */
static void test_sizes_geometric(void) {
  size_t sizes[512];
  size_t ns = 0;
  for (double s = 4097; s <= 16.0 * MiB; s *= 1.13) sizes[ns++] = (size_t)s;
  static const size_t edges[] = {
      127, 128, 129, 1023, 1024, 1025, 8191, 8192, 8193, 32767, 32768, 32769, 65535, 65536, 65537,
      131072, 131073, 262144, 262145, 524288, 524289, 917504, 917505,
      1048575, 1048576, 1048577, 2 * MiB - 1, 2 * MiB, 2 * MiB + 1, 2 * MiB + 4096,
      4 * MiB - 4096 - 1, 4 * MiB - 4096, 4 * MiB, 8 * MiB + 1, 16 * MiB};
  for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) sizes[ns++] = edges[i];
  /* exact class boundaries of every power of two up to 1 MiB */
  for (size_t p2 = 256; p2 <= MiB; p2 *= 2) {
    for (size_t k = 9; k <= 16; k++) {
      size_t c = p2 / 16 * k; /* class sizes 9/16 .. 16/16 of p2 */
      sizes[ns++] = c;
      sizes[ns++] = c + 1;
    }
  }
  CHECK(ns <= sizeof sizes / sizeof sizes[0], "internal: too many sizes");

  /* all blocks up to 4 MiB live at once; bigger ones one at a time, each
   * checked against everything that is live */
  for (int round = 0; round < 2; round++) {
    for (size_t i = 0; i < ns; i++)
      if (sizes[i] <= 4 * MiB) pool_add(do_malloc(sizes[i]));
    check_pool_disjoint("geometric sizes");
    verify_pool("geometric sizes");
    for (size_t i = 0; i < ns; i++) {
      if (sizes[i] <= 4 * MiB) continue;
      pool_add(do_malloc(sizes[i]));
      check_pool_disjoint("geometric sizes > 4 MiB");
      verify_blk(&pool[pool_n - 1], "geometric sizes > 4 MiB");
      /* remove it again (it is somewhere in the sorted pool) */
      for (size_t j = 0; j < pool_n; j++) {
        if (pool[j].req == sizes[i] && pool[j].req > 4 * MiB) {
          verify_blk(&pool[j], "geometric sizes > 4 MiB");
          API(free)(pool[j].p);
          pool[j] = pool[--pool_n];
          break;
        }
      }
    }
    verify_pool("geometric sizes, after the large ones");
    pool_free_all();
  }
}

/* Class sizes per the documented scheme. */
static size_t n_classes;
static size_t class_sizes[200];
static void compute_classes(void) {
  class_sizes[n_classes++] = 8;
  for (size_t s = 16; s <= 128; s += 16) class_sizes[n_classes++] = s;
  for (size_t p2 = 128; p2 < MiB; p2 *= 2)
    for (size_t k = 9; k <= 16; k++) class_sizes[n_classes++] = p2 / 8 * k;
  CHECK(n_classes == 113, "internal: %zu classes", n_classes);
}

/* For every class: enough blocks to fill several pages, all live, checked
 * for overlap and pattern, freed, then allocated again. */
static void test_class_pages(void) {
  for (size_t c = 0; c < n_classes; c++) {
    size_t cs = class_sizes[c];
    size_t count = (3 * 64 * KiB) / cs + 2;
    if (cs > 64 * KiB) count = 5;
    if (count > 8192) count = 8192;
    for (int round = 0; round < 2; round++) {
      for (size_t i = 0; i < count; i++) {
        size_t n = (i % 3 == 0) ? cs : cs - (i % 7); /* sizes within the class */
        if (c > 0 && n <= class_sizes[c - 1]) n = cs;
        pool_add(do_malloc(n));
      }
      check_pool_disjoint("class pages");
      verify_pool("class pages");
      pool_free_all();
    }
  }
}

static void test_malloc_zero(void) {
  void *ps[256];
  for (int i = 0; i < 256; i++) {
    ps[i] = API(malloc)(hkt_opaque(0));
    CHECK(ps[i] != NULL, "malloc(0) returned NULL (call %d)", i);
    CHECK((uintptr_t)ps[i] % 8 == 0, "malloc(0) = %p not 8-aligned", ps[i]);
    for (int j = 0; j < i; j++) CHECK(ps[i] != ps[j], "malloc(0) returned %p twice while both are live", ps[i]);
  }
  /* mixed with other small sizes: still unique */
  void *q = API(malloc)(8);
  CHECK(q != NULL, "malloc(8) failed");
  for (int i = 0; i < 256; i++) CHECK(ps[i] != q, "malloc(8) returned a live malloc(0) block %p", q);
  API(free)(q);
  for (int i = 0; i < 256; i++) API(free)(ps[i]);
}

/* ------------------------------------------------------------------ */
/* aligned allocation */

enum { ALN_POSIX, ALN_ALIGNED_ALLOC, ALN_MEMALIGN };
static const char *aln_name[] = {"posix_memalign", "aligned_alloc", "memalign"};

static void *aligned_call(int kind, size_t align, size_t size) {
  void *p = NULL;
  switch (kind) {
    case ALN_POSIX: {
      void *out = (void *)(uintptr_t)0x5a5a5a5a;
      int rc = API(posix_memalign)(&out, align, size);
      CHECK(rc == 0, "posix_memalign(align %zu, size %zu) returned %d", align, size, rc);
      p = out;
      break;
    }
    case ALN_ALIGNED_ALLOC: p = API(aligned_alloc)(align, size); break;
    case ALN_MEMALIGN: p = API(memalign)(align, size); break;
  }
  return p;
}

static void test_aligned_valid(void) {
  for (int kind = 0; kind < 3; kind++) {
    size_t min_align = kind == ALN_POSIX ? sizeof(void *) : 1;
    for (size_t align = min_align; align <= MiB; align *= 2) {
      size_t sizes[] = {1, align - 1, align, align + 1, 3 * align, 100000};
      for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t size = sizes[s];
        if (size == 0) continue; /* align 1: align-1 == 0 */
        void *p = aligned_call(kind, align, size);
        char what[64];
        snprintf(what, sizeof what, "%s(align %zu)", aln_name[kind], align);
        pool_add(check_new(p, size, align, what));
      }
    }
    check_pool_disjoint("aligned blocks");
    verify_pool("aligned blocks");
    /* aligned_alloc blocks: some freed with free_aligned_sized (C23); the
     * rest, and all other kinds, with free */
    for (size_t i = 0; i < pool_n; i++) {
      if (kind == ALN_ALIGNED_ALLOC && i % 3 == 0) {
        do_free_aligned_sized(pool[i].p, pool[i].align, pool[i].req);
      } else {
        API(free)(pool[i].p);
      }
    }
    pool_n = 0;
  }
  /* free_aligned_sized with the exact alignment used */
  for (size_t align = 8; align <= MiB; align *= 4) {
    size_t sizes[] = {align, 3 * align, 100000};
    for (size_t s = 0; s < 3; s++) {
      void *p = API(aligned_alloc)(align, sizes[s]);
      blk b = check_new(p, sizes[s], align, "aligned_alloc");
      verify_blk(&b, "aligned_alloc before free_aligned_sized");
      do_free_aligned_sized(p, align, sizes[s]);
    }
  }
  /* many small aligned blocks of one alignment: distinct, aligned */
  for (size_t align = 16; align <= 4096; align *= 4) {
    for (int i = 0; i < 300; i++) pool_add(check_new(aligned_call(i % 3, align, 24), 24, align, "aligned small"));
    check_pool_disjoint("many aligned small blocks");
    verify_pool("many aligned small blocks");
    pool_free_all();
  }
}

/* Alignments at and above the 2 MiB region size (beyond the 1 MiB of
 * test_aligned_valid): the block must be usable like any other. Each call is
 * followed by malloc_usable_size, realloc and free of the result. */
static void test_aligned_region_size(void) {
  for (size_t align = 2 * MiB; align <= 8 * MiB; align *= 2) {
    size_t sizes[] = {1, 100000, align + 1};
    for (int kind = 0; kind < 3; kind++) {
      for (size_t s = 0; s < 3; s++) {
        char what[64];
        snprintf(what, sizeof what, "%s(align %zu MiB)", aln_name[kind], align / MiB);
        blk b = check_new(aligned_call(kind, align, sizes[s]), sizes[s], align, what);
        verify_blk(&b, what);
        unsigned char *q = (unsigned char *)API(realloc)(b.p, sizes[s] + 5000);
        CHECK(q != NULL, "realloc of a %s block failed", what);
        size_t bad = hkt_verify(q, sizes[s], b.seed);
        CHECK(bad == HKT_OK, "realloc of a %s block lost byte %zu", what, bad);
        API(free)(q);
        b = check_new(aligned_call(kind, align, sizes[s]), sizes[s], align, what);
        API(free)(b.p);
      }
    }
  }
}

static void test_aligned_invalid(void) {
  static const size_t bad[] = {0, 1, 2, 3, 4, 5, 6, 12, 24, 40, 48, 100, 4097, 65535};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    void *sentinel = (void *)(uintptr_t)0x1234560;
    void *out = sentinel;
    int rc = API(posix_memalign)(&out, hkt_opaque(bad[i]), 64);
    CHECK(rc == EINVAL, "posix_memalign(alignment %zu) returned %d, expected EINVAL (%d)", bad[i], rc, EINVAL);
    CHECK(out == sentinel, "posix_memalign(alignment %zu) failed but modified *out (%p)", bad[i], out);
  }
  static const size_t bad_aa[] = {0, 3, 5, 6, 12, 24, 48, 100, 4097, 65535};
  for (size_t i = 0; i < sizeof bad_aa / sizeof bad_aa[0]; i++) {
    errno = 0;
    void *p = API(aligned_alloc)(hkt_opaque(bad_aa[i]), 64);
    int e = errno;
    CHECK(p == NULL, "aligned_alloc(alignment %zu) = %p, expected NULL (not a power of two)", bad_aa[i], p);
    CHECK(e == EINVAL, "aligned_alloc(alignment %zu): errno %d, expected EINVAL", bad_aa[i], e);
  }
  /* memalign, as glibc: any alignment works, rounded up to a power of two */
  static const size_t odd[] = {0, 1, 3, 5, 12, 24, 100, 4097};
  for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
    size_t a = hkt_opaque(odd[i]), want = 1;
    while (want < a) want <<= 1;
    void *p = API(memalign)(a, 64);
    CHECK(p != NULL, "memalign(alignment %zu, 64) failed (glibc rounds the alignment up)", a);
    CHECK((uintptr_t)p % want == 0, "memalign(alignment %zu) = %p is not %zu-aligned", a, p, want);
    memset(p, 0x5a, 64);
    API(free)(p);
  }
  errno = 0;
  CHECK(API(memalign)(hkt_opaque(SIZE_MAX / 2 + 2), 16) == NULL && errno == EINVAL,
        "memalign(alignment 2^63 + 1): expected NULL/EINVAL");
  /* absurd alignments */
  size_t absurd[] = {(size_t)1 << 62, (size_t)1 << 63, (size_t)1 << 47};
  for (size_t i = 0; i < 3; i++) {
    size_t a = hkt_opaque(absurd[i]);
    void *sentinel = (void *)(uintptr_t)0x7777000;
    void *out = sentinel;
    int rc = API(posix_memalign)(&out, a, 16);
    CHECK(rc == ENOMEM || rc == EINVAL, "posix_memalign(alignment 0x%zx) returned %d", a, rc);
    CHECK(out == sentinel, "posix_memalign(alignment 0x%zx) failed but modified *out", a);
    errno = 0;
    void *p = API(aligned_alloc)(a, 16);
    CHECK(p == NULL, "aligned_alloc(alignment 0x%zx) = %p, expected NULL", a, p);
    CHECK(errno == ENOMEM || errno == EINVAL, "aligned_alloc(alignment 0x%zx): errno %d", a, errno);
    errno = 0;
    p = API(memalign)(a, 16);
    CHECK(p == NULL, "memalign(alignment 0x%zx) = %p, expected NULL", a, p);
    CHECK(errno == ENOMEM || errno == EINVAL, "memalign(alignment 0x%zx): errno %d", a, errno);
  }
  /* valid alignment, absurd size: must not wrap around */
  size_t huge_sizes[] = {SIZE_MAX, SIZE_MAX - 100, SIZE_MAX - MiB, (size_t)PTRDIFF_MAX};
  for (size_t i = 0; i < 4; i++) {
    size_t s = hkt_opaque(huge_sizes[i]);
    void *out = NULL;
    int rc = API(posix_memalign)(&out, 4096, s);
    CHECK(rc == ENOMEM, "posix_memalign(4096, 0x%zx) returned %d (ptr %p), expected ENOMEM", s, rc, out);
    errno = 0;
    void *p = API(aligned_alloc)(64, s);
    CHECK(p == NULL && errno == ENOMEM, "aligned_alloc(64, 0x%zx) = %p errno %d, expected NULL/ENOMEM", s, p, errno);
    errno = 0;
    p = API(memalign)(MiB, s);
    CHECK(p == NULL && errno == ENOMEM, "memalign(1 MiB, 0x%zx) = %p errno %d, expected NULL/ENOMEM", s, p, errno);
    errno = 0;
    p = API(valloc)(s);
    CHECK(p == NULL && errno == ENOMEM, "valloc(0x%zx) = %p errno %d, expected NULL/ENOMEM", s, p, errno);
    errno = 0;
    p = API(pvalloc)(s); /* rounding up to a page must not wrap to 0 */
    CHECK(p == NULL && errno == ENOMEM, "pvalloc(0x%zx) = %p errno %d, expected NULL/ENOMEM", s, p, errno);
  }
}

/* Size 0 with an alignment: NULL, or a unique freeable pointer that still
 * has the requested alignment (C: "as if the size were some nonzero value"). */
static void *aligned_size_zero_thread(void *arg) {
  (void)arg;
  enum { K = 16 };
  for (size_t align = 8; align <= MiB; align *= 2) {
    void *ps[3 * K];
    for (int k = 0; k < K; k++) {
      ps[k] = (void *)(uintptr_t)0x1000;
      int rc = API(posix_memalign)(&ps[k], align, hkt_opaque(0));
      CHECK(rc == 0, "posix_memalign(%zu, 0) returned %d", align, rc);
      CHECK((uintptr_t)ps[k] % align == 0, "posix_memalign(%zu, 0) = %p is not %zu-aligned", align, ps[k], align);
    }
    for (int k = K; k < 2 * K; k++) {
      ps[k] = API(aligned_alloc)(align, hkt_opaque(0));
      CHECK((uintptr_t)ps[k] % align == 0, "aligned_alloc(%zu, 0) = %p is not %zu-aligned", align, ps[k], align);
    }
    for (int k = 2 * K; k < 3 * K; k++) {
      ps[k] = API(memalign)(align, hkt_opaque(0));
      CHECK((uintptr_t)ps[k] % align == 0, "memalign(%zu, 0) = %p is not %zu-aligned", align, ps[k], align);
    }
    for (int k = 0; k < 3 * K; k++)
      for (int j = 0; j < k; j++)
        CHECK(ps[k] == NULL || ps[k] != ps[j], "aligned allocation of size 0 (align %zu) returned %p twice", align,
              ps[k]);
    for (int k = 0; k < 3 * K; k++) API(free)(ps[k]);
  }
  return NULL;
}

/* Size 0 with an alignment: NULL, or a unique freeable pointer that still
 * has the requested alignment (C: "as if the size were some nonzero value").
 * Run in a new thread: its fresh heap hands out tiny blocks in address order,
 * so a result that is only 8-aligned shows up (a long-used free list might
 * happen to yield 16-aligned slots only). */
static void test_aligned_size_zero(void) {
  pthread_t t;
  int rc = pthread_create(&t, NULL, aligned_size_zero_thread, NULL);
  CHECK(rc == 0, "pthread_create: %s", strerror(rc));
  pthread_join(t, NULL);
  aligned_size_zero_thread(NULL); /* and in this thread */
}

static void test_valloc_pvalloc(void) {
  long pg = sysconf(_SC_PAGESIZE);
  CHECK(pg > 0, "sysconf(_SC_PAGESIZE) failed");
  size_t page = (size_t)pg;
  size_t sizes[] = {1, 100, page - 1, page, page + 1, 3 * page + 5, 100000, MiB, 3 * MiB + 7};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = sizes[i];
    pool_add(check_new(API(valloc)(n), n, page, "valloc"));
    size_t rounded = (n + page - 1) / page * page;
    blk b = check_new(API(pvalloc)(n), n, page, "pvalloc");
    CHECK(b.usable >= rounded, "pvalloc(%zu): usable size %zu < %zu (size rounded up to the page size)", n,
          b.usable, rounded);
    pool_add(b);
  }
  check_pool_disjoint("valloc/pvalloc");
  verify_pool("valloc/pvalloc");
  pool_free_all();
}

/* ------------------------------------------------------------------ */
/* calloc */

static void check_zero(const void *p, size_t n, const char *what) {
  const unsigned char *c = (const unsigned char *)p;
  for (size_t i = 0; i < n; i++)
    CHECK(c[i] == 0, "%s: byte %zu of %zu is 0x%02x, expected 0 (reused memory not cleared)", what, i, n, c[i]);
}

static void test_calloc_reuse(void) {
  static const size_t sizes[] = {1,     8,     24,    100,   128,     129,     1000,    4000, 16 * KiB,
                                 65536, 100 * KiB, 300 * KiB, MiB, MiB + 1, 3 * MiB, 5 * MiB + 3};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    size_t n = sizes[s];
    int rounds = n >= MiB ? 24 : 60;
    for (int r = 0; r < rounds; r++) {
      unsigned char *p = (unsigned char *)API(malloc)(n);
      CHECK(p != NULL, "malloc(%zu) failed", n);
      memset(p, 0xAA, usable_of(p));
      API(free)(p);
      char what[64];
      unsigned char *z;
      switch (r % 3) {
        case 0: z = (unsigned char *)API(calloc)(1, n); break;
        case 1: z = (unsigned char *)API(calloc)(n, 1); break;
        default: z = (n % 8 == 0) ? (unsigned char *)API(calloc)(n / 8, 8) : (unsigned char *)API(calloc)(1, n);
      }
      snprintf(what, sizeof what, "calloc(%zu) round %d", n, r);
      CHECK(z != NULL, "%s returned NULL", what);
      CHECK(usable_of(z) >= n, "%s: usable %zu < %zu", what, usable_of(z), n);
      check_zero(z, n, what);
      memset(z, 0xAA, n);
      API(free)(z);
    }
    /* many dirty blocks of the class freed, then calloc'ed back */
    if (n <= 300 * KiB) {
      enum { NB = 40 };
      unsigned char *ps[NB];
      for (int i = 0; i < NB; i++) {
        ps[i] = (unsigned char *)API(malloc)(n);
        CHECK(ps[i] != NULL, "malloc(%zu) failed", n);
        memset(ps[i], 0xAA, usable_of(ps[i]));
      }
      for (int i = 0; i < NB; i++) API(free)(ps[i]);
      for (int i = 0; i < NB; i++) {
        ps[i] = (unsigned char *)API(calloc)(n, 1);
        char what[64];
        snprintf(what, sizeof what, "calloc(%zu, 1) batch %d", n, i);
        CHECK(ps[i] != NULL, "%s returned NULL", what);
        check_zero(ps[i], n, what);
      }
      for (int i = 0; i < NB; i++) API(free)(ps[i]);
    }
  }
  /* calloc(0, x), calloc(x, 0): unique freeable pointers (or NULL) */
  void *a = API(calloc)(0, 16), *b = API(calloc)(16, 0);
  CHECK(a == NULL || a != b, "calloc(0,16) and calloc(16,0) returned the same pointer %p", a);
  API(free)(a);
  API(free)(b);
}

static void test_calloc_overflow(void) {
  struct { size_t n, m; } cases[] = {
      {SIZE_MAX / 2 + 1, 4}, {4, SIZE_MAX / 2 + 1}, {SIZE_MAX, SIZE_MAX}, {(size_t)1 << 32, (size_t)1 << 32},
      {SIZE_MAX / 8 + 1, 8}, {(size_t)1 << 33, (size_t)1 << 31}, {SIZE_MAX, 1}, {1, SIZE_MAX},
      {(size_t)PTRDIFF_MAX, 1}, {(size_t)PTRDIFF_MAX / 2 + 1, 2}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    errno = 0;
    void *p = API(calloc)(hkt_opaque(cases[i].n), hkt_opaque(cases[i].m));
    int e = errno;
    CHECK(p == NULL, "calloc(0x%zx, 0x%zx) = %p, expected NULL", cases[i].n, cases[i].m, p);
    CHECK(e == ENOMEM, "calloc(0x%zx, 0x%zx): errno %d, expected ENOMEM", cases[i].n, cases[i].m, e);
  }
}

static void test_malloc_huge(void) {
  size_t sizes[] = {SIZE_MAX,
                    SIZE_MAX - 1,
                    SIZE_MAX - 7,
                    SIZE_MAX - 4095,
                    SIZE_MAX - 4096,
                    SIZE_MAX - 2 * MiB,
                    SIZE_MAX - 2 * MiB - 4096,
                    SIZE_MAX - 4 * MiB,
                    (size_t)PTRDIFF_MAX,
                    (size_t)PTRDIFF_MAX + 1,
                    (size_t)PTRDIFF_MAX - 4096,
                    (size_t)1 << 62,
                    (size_t)1 << 48};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = hkt_opaque(sizes[i]);
    errno = 0;
    void *p = API(malloc)(n);
    int e = errno;
    CHECK(p == NULL, "malloc(0x%zx) = %p, expected NULL", n, p);
    CHECK(e == ENOMEM, "malloc(0x%zx): errno %d, expected ENOMEM", n, e);
  }
  /* still works afterwards */
  blk b = do_malloc(1000);
  verify_blk(&b, "malloc after failed huge mallocs");
  API(free)(b.p);
}

/* ------------------------------------------------------------------ */
/* realloc */

static void test_realloc_basic(void) {
  /* realloc(NULL, n) == malloc(n) */
  size_t sizes[] = {0, 1, 100, 5000, 300000, 3 * MiB};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    void *p = API(realloc)(NULL, hkt_opaque(sizes[i]));
    blk b = check_new(p, sizes[i], 8, "realloc(NULL, n)");
    verify_blk(&b, "realloc(NULL, n)");
    API(free)(p);
  }
  /* realloc(p, 0) frees p and returns NULL (glibc behaviour) */
  size_t zs[] = {16, 5000, 300000, 3 * MiB};
  for (size_t i = 0; i < sizeof zs / sizeof zs[0]; i++) {
    void *p = API(malloc)(zs[i]);
    CHECK(p != NULL, "malloc(%zu) failed", zs[i]);
    void *q = API(realloc)(p, hkt_opaque(0));
    CHECK(q == NULL, "realloc(%p [%zu bytes], 0) = %p, expected NULL (the block is freed)", p, zs[i], q);
  }
  /* realloc(p, 0) in a loop must not leak: the freed block comes back */
  for (int i = 0; i < 100000; i++) {
    void *p = API(malloc)(48);
    CHECK(p != NULL, "malloc(48) failed in realloc(p,0) loop");
    CHECK(API(realloc)(p, hkt_opaque(0)) == NULL, "realloc(p, 0) != NULL");
  }
}

/* Grow/shrink through every tier with contents checked each step. */
static void realloc_chain(const size_t *chain, size_t n, size_t first_align) {
  unsigned char *p;
  if (first_align > 8) {
    p = (unsigned char *)API(aligned_alloc)(first_align, chain[0]);
  } else {
    p = (unsigned char *)API(malloc)(chain[0]);
  }
  CHECK(p != NULL, "allocation of %zu failed", chain[0]);
  uint64_t seed = seed_counter++;
  hkt_fill(p, chain[0], seed);
  size_t cur = chain[0];
  for (size_t i = 1; i < n; i++) {
    size_t next = chain[i];
    unsigned char *q = (unsigned char *)API(realloc)(p, next);
    CHECK(q != NULL, "realloc(%p, %zu -> %zu) returned NULL", (void *)p, cur, next);
    CHECK((uintptr_t)q % 8 == 0, "realloc(%zu -> %zu) = %p not 8-aligned", cur, next, (void *)q);
    CHECK(usable_of(q) >= next, "realloc(%zu -> %zu): usable %zu < %zu", cur, next, usable_of(q), next);
    size_t keep = cur < next ? cur : next;
    size_t bad = hkt_verify(q, keep, seed);
    CHECK(bad == HKT_OK, "realloc(%zu -> %zu) (%p -> %p): byte %zu of the kept %zu not preserved", cur, next,
          (void *)p, (void *)q, bad, keep);
    seed = seed_counter++;
    hkt_fill(q, usable_of(q), seed);
    p = q;
    cur = next;
  }
  API(free)(p);
}

static void test_realloc_tiers(void) {
  static const size_t chain1[] = {16,      200,     5000,    40000,   300000, 1536 * KiB,
                                  5 * MiB, 100 * KiB, 24,   8};
  realloc_chain(chain1, sizeof chain1 / sizeof chain1[0], 8);
  static const size_t chain2[] = {8,       128,     129,     1024,    1025,    32768,  32769, 1048576, 1048577,
                                  2 * MiB - 1, 2 * MiB + 1, 7 * MiB, 20 * MiB, 2 * MiB + 1, 1048577,
                                  1048576, 32769, 1025, 129, 1};
  realloc_chain(chain2, sizeof chain2 / sizeof chain2[0], 8);
  /* large -> large growth/shrink (mremap paths) */
  static const size_t chain3[] = {3 * MiB, 7 * MiB, 7 * MiB + 1, 20 * MiB, 2 * MiB + 17, 12 * MiB, 3 * MiB - 5};
  realloc_chain(chain3, sizeof chain3 / sizeof chain3[0], 8);
  /* blocks from aligned allocations (incl. the large tier for align > 64 KiB) */
  static const size_t chain4[] = {100, 5000, 200000, 3 * MiB, 64, 9 * MiB, 10};
  for (size_t a = 64; a <= 2 * MiB; a *= 8) realloc_chain(chain4, sizeof chain4 / sizeof chain4[0], a);
  /* small steps through every size <= 5000 and back */
  for (size_t s = 1; s < 5000; s += 37) {
    size_t ch[] = {s, s + 1, s * 3 + 1, s / 2 + 1, s + 8, s};
    realloc_chain(ch, 6, 8);
  }
}

static void test_realloc_shrink_keeps(void) {
  static const size_t sizes[] = {64, 1000, 4096, 50000, 700 * KiB, MiB, 3 * MiB, 17 * MiB};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = sizes[i];
    unsigned char *p = (unsigned char *)API(malloc)(n);
    CHECK(p != NULL, "malloc(%zu) failed", n);
    uint64_t seed = seed_counter++;
    hkt_fill(p, n, seed);
    size_t targets[] = {n - 1, n * 3 / 4, n / 2, n / 8 + 1, 9, 1};
    for (size_t t = 0; t < sizeof targets / sizeof targets[0]; t++) {
      unsigned char *q = (unsigned char *)API(realloc)(p, targets[t]);
      CHECK(q != NULL, "realloc shrink %zu -> %zu returned NULL", n, targets[t]);
      size_t bad = hkt_verify(q, targets[t], seed);
      CHECK(bad == HKT_OK, "realloc shrink (from %zu) to %zu: byte %zu not preserved", n, targets[t], bad);
      p = q;
    }
    API(free)(p);
  }
}

/* A large block (over 1 MiB) shrunk to 64 KiB or more stays where it is
 * (its mapping's tail goes back to the OS) instead of being copied into a
 * size class, and can grow back; below 64 KiB it moves. Contents survive
 * every step. */
static void test_realloc_large_shrinks_in_place(void) {
  size_t n = 3 * MiB;
  unsigned char *p = (unsigned char *)API(malloc)(n);
  CHECK(p != NULL, "malloc(%zu) failed", n);
  uint64_t seed = seed_counter++;
  hkt_fill(p, n, seed);
  static const size_t steps[] = {900 * KiB, 100 * KiB, 64 * KiB, 2 * MiB};
  size_t len = n;
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    unsigned char *q = (unsigned char *)API(realloc)(p, steps[i]);
    CHECK(q != NULL, "realloc(%zu -> %zu) returned NULL", len, steps[i]);
    size_t keep = steps[i] < len ? steps[i] : len;
    size_t bad = hkt_verify(q, keep, seed);
    CHECK(bad == HKT_OK, "realloc %zu -> %zu: byte %zu not preserved", len, steps[i], bad);
    if (steps[i] < len) CHECK(q == p, "realloc shrink of a large block %zu -> %zu moved it", len, steps[i]);
    if (steps[i] > len) hkt_fill(q, steps[i], seed); /* the grown part too, for the next step */
    CHECK(API(malloc_usable_size)(q) >= steps[i], "usable size %zu below %zu", API(malloc_usable_size)(q), steps[i]);
    p = q;
    len = steps[i];
  }
  unsigned char *q = (unsigned char *)API(realloc)(p, 1000); /* below a slab: into the size classes */
  CHECK(q != NULL, "realloc(%zu -> 1000) returned NULL", len);
  CHECK(hkt_verify(q, 1000, seed) == HKT_OK, "realloc to 1000 B lost the contents");
  API(free)(q);
}

/* A block alone in its span (64 KiB multiples up to 1 MiB) grows into the
 * free slabs after it and shrinks by giving back its tail, without moving.
 * A buffer that realloc grows again past 64 KiB gets such a span, placed
 * with free slabs after it, so its next steps stay in place (a block's
 * first growth stays in the size classes: a block resized to random sizes
 * is not a growing buffer); hardened mode keeps its own realloc (canary and
 * trailer), where none of this applies. */
static void test_realloc_in_place(void) {
  const char *sec = getenv("HAKMEM_SECURE");
  bool secure = sec != NULL && atoi(sec) > 0;
  unsigned char *p = (unsigned char *)API(malloc)(40 * KiB);
  CHECK(p != NULL, "malloc(40 KiB) failed");
  uint64_t seed = seed_counter++;
  size_t len = 40 * KiB;
  hkt_fill(p, len, seed);
  /* a block's first growth past 64 KiB is not given a span: 40 -> 70 KiB
   * takes the class of 70 + 70/4 KiB (before 2026-11-25: a 128 KiB span) */
  unsigned char *once = (unsigned char *)API(malloc)(40 * KiB);
  CHECK(once != NULL, "malloc(40 KiB) failed");
  once = (unsigned char *)API(realloc)(once, 70 * KiB);
  CHECK(once != NULL, "realloc(40 KiB -> 70 KiB) failed");
  if (!secure) CHECK(usable_of(once) < 128 * KiB, "a first growth to 70 KiB: usable %zu, a span of its own", usable_of(once));
  API(free)(once);
  /* a first growth, 40 -> 48 KiB, stays in the size classes (room: 60 KiB) */
  p = (unsigned char *)API(realloc)(p, 48 * KiB);
  CHECK(p != NULL, "realloc(40 KiB -> 48 KiB) failed");
  CHECK(hkt_verify(p, len, seed) == HKT_OK, "realloc(40 KiB -> 48 KiB) lost data");
  if (!secure) CHECK(usable_of(p) < 64 * KiB, "a first growth to 48 KiB: usable %zu, expected a size class", usable_of(p));
  /* growing again, 48 -> 70 KiB, moves into a span of its own (room: 70 + 70/4 KiB -> two slabs) */
  unsigned char *q = (unsigned char *)API(realloc)(p, 70 * KiB);
  CHECK(q != NULL, "realloc(40 KiB -> 70 KiB) failed");
  CHECK(hkt_verify(q, len, seed) == HKT_OK, "realloc(40 KiB -> 70 KiB) lost data");
  if (!secure) CHECK(usable_of(q) == 128 * KiB, "a growing 70 KiB block: usable %zu, expected a 128 KiB span", usable_of(q));
  seed = seed_counter++;
  len = 70 * KiB;
  hkt_fill(q, len, seed);
  /* then it grows in place, a slab at a time, up to twice its first span */
  static const size_t grow[] = {130 * KiB, 190 * KiB, 256 * KiB};
  for (size_t i = 0; i < sizeof grow / sizeof grow[0]; i++) {
    unsigned char *r = (unsigned char *)API(realloc)(q, grow[i]);
    CHECK(r != NULL, "realloc(-> %zu) failed", grow[i]);
    if (!secure) {
      CHECK(r == q, "realloc(%zu -> %zu) moved the block (%p -> %p): the slabs after it were free", len, grow[i],
            (void *)q, (void *)r);
      CHECK(usable_of(r) == (grow[i] + 64 * KiB - 1) / (64 * KiB) * (64 * KiB), "realloc(-> %zu): usable %zu",
            grow[i], usable_of(r));
    }
    CHECK(hkt_verify(r, len, seed) == HKT_OK, "realloc(%zu -> %zu) lost data", len, grow[i]);
    seed = seed_counter++;
    len = grow[i];
    hkt_fill(r, len, seed);
    q = r;
  }
  /* shrinking gives back the tail in place */
  static const size_t shrink[] = {200 * KiB, 100 * KiB, 60 * KiB};
  for (size_t i = 0; i < sizeof shrink / sizeof shrink[0]; i++) {
    unsigned char *r = (unsigned char *)API(realloc)(q, shrink[i]);
    CHECK(r != NULL, "realloc(-> %zu) failed", shrink[i]);
    if (!secure) {
      CHECK(r == q, "realloc(%zu -> %zu) moved the block", len, shrink[i]);
      CHECK(usable_of(r) == (shrink[i] + 64 * KiB - 1) / (64 * KiB) * (64 * KiB), "realloc(-> %zu): usable %zu",
            shrink[i], usable_of(r));
    }
    CHECK(hkt_verify(r, shrink[i], seed) == HKT_OK, "realloc(%zu -> %zu) lost data", len, shrink[i]);
    len = shrink[i];
    q = r;
  }
  /* the slabs given back serve new blocks, which must not overlap it */
  unsigned char *others[8];
  for (int i = 0; i < 8; i++) {
    others[i] = (unsigned char *)API(malloc)(64 * KiB);
    CHECK(others[i] != NULL, "malloc(64 KiB) failed");
    memset(others[i], 0xa5, 64 * KiB);
  }
  CHECK(hkt_verify(q, len, seed) == HKT_OK, "a shrunk block was overwritten by later blocks");
  for (int i = 0; i < 8; i++) API(free)(others[i]);
  API(free)(q);

  /* a span block from plain malloc (a class of one block per page, the
   * class's current page) resizes too, and its class keeps working */
  for (int round = 0; round < 3; round++) {
    unsigned char *a = (unsigned char *)API(malloc)(128 * KiB);
    CHECK(a != NULL, "malloc(128 KiB) failed");
    seed = seed_counter++;
    hkt_fill(a, 128 * KiB, seed);
    unsigned char *b = (unsigned char *)API(realloc)(a, 300 * KiB);
    CHECK(b != NULL, "realloc(128 KiB -> 300 KiB) failed");
    CHECK(hkt_verify(b, 128 * KiB, seed) == HKT_OK, "realloc(128 KiB -> 300 KiB) lost data");
    unsigned char *c = (unsigned char *)API(malloc)(128 * KiB);
    CHECK(c != NULL && (c + 128 * KiB <= b || c >= b + 300 * KiB), "malloc(128 KiB) after a resize overlaps it");
    API(free)(c);
    API(free)(b);
  }
}

/* Blocks alone in their page (64 KiB and 256 KiB, whose span gets a slab
 * for the colour; 240 KiB and 112 KiB, whose span has room to spare) start
 * at cache-line offsets that vary from page to page (cache colouring,
 * src/page.c): of 16 live blocks, not all at one offset into their 4 KiB
 * page. A coloured block still grows and shrinks in place, and aligned
 * requests of those sizes are aligned. (Hardened mode keeps blocks on their
 * span's start.) */
static void test_colored_blocks(void) {
  const char *sec = getenv("HAKMEM_SECURE");
  bool secure = sec != NULL && atoi(sec) > 0;
  static const size_t sizes[] = {64 * KiB, 256 * KiB, 240 * KiB, 112 * KiB};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    uintptr_t seen = 0; /* bit i: some block at cache line i of its 4 KiB page */
    for (int i = 0; i < 16; i++) {
      blk b = do_malloc(sizes[s]);
      seen |= (uintptr_t)1 << (((uintptr_t)b.p & 4095) / 64);
      pool_add(b);
    }
    check_pool_disjoint("coloured blocks");
    verify_pool("coloured blocks");
    int offsets = __builtin_popcountll(seen);
    if (!secure) CHECK(offsets >= 8, "16 blocks of %zu bytes at only %d cache-line offsets", sizes[s], offsets);
    pool_free_all();
  }
  /* a coloured 128 KiB block shrinks to 40 KiB in place (a 64 KiB coloured
   * span: a block that did not resize in place would move to the 40 KiB
   * class), then grows back into the slab it just gave up */
  unsigned char *p = (unsigned char *)API(malloc)(128 * KiB);
  CHECK(p != NULL, "malloc(128 KiB) failed");
  uint64_t seed = seed_counter++;
  hkt_fill(p, 128 * KiB, seed);
  unsigned char *q = (unsigned char *)API(realloc)(p, 40 * KiB);
  CHECK(q != NULL && hkt_verify(q, 40 * KiB, seed) == HKT_OK, "realloc(128 KiB -> 40 KiB) lost data");
  if (!secure) {
    CHECK(q == p, "realloc(coloured 128 KiB -> 40 KiB) moved the block (%p -> %p)", (void *)p, (void *)q);
    CHECK(usable_of(q) == 64 * KiB, "realloc(coloured 128 KiB -> 40 KiB): usable %zu", usable_of(q));
  }
  seed = seed_counter++;
  hkt_fill(q, 40 * KiB, seed);
  unsigned char *r = (unsigned char *)API(realloc)(q, 128 * KiB);
  CHECK(r != NULL && hkt_verify(r, 40 * KiB, seed) == HKT_OK, "realloc(40 KiB -> 128 KiB) lost data");
  if (!secure) CHECK(r == q, "realloc(coloured 40 KiB -> 128 KiB) moved the block (%p -> %p)", (void *)q, (void *)r);
  API(free)(r);
  for (size_t align = 128; align <= 64 * KiB; align *= 4) {
    pool_add(check_new(API(aligned_alloc)(align, 64 * KiB), 64 * KiB, align, "aligned_alloc(64 KiB)"));
    pool_add(check_new(API(aligned_alloc)(align, 256 * KiB), 256 * KiB, align, "aligned_alloc(256 KiB)"));
    pool_add(check_new(API(aligned_alloc)(align, 240 * KiB), 240 * KiB, align, "aligned_alloc(240 KiB)"));
  }
  check_pool_disjoint("aligned coloured sizes");
  verify_pool("aligned coloured sizes");
  pool_free_all();
  /* a large block freed and allocated again comes back from the cache with
   * its colour: the same address, so the lines a program reuses stay put.
   * The cache is emptied first: a mapping an earlier test left there (and
   * the purger has not given back yet) may be a better fit for the second
   * malloc than the block just freed. */
  if (!secure && hkt_large_cache(2 * MiB)) {
    API(malloc_trim)(0);
    void *a = API(malloc)(2 * MiB);
    CHECK(a != NULL, "malloc(2 MiB) failed");
    API(free)(a);
    void *b = API(malloc)(2 * MiB);
    CHECK(b == a, "malloc(2 MiB) after free: %p, expected the cached block at %p", b, a);
    API(free)(b);
  }
}

static void test_realloc_huge(void) {
  size_t starts[] = {100, 200000, 3 * MiB};
  size_t huge[] = {SIZE_MAX, SIZE_MAX - 4096, SIZE_MAX - 2 * MiB, (size_t)PTRDIFF_MAX, (size_t)1 << 48};
  for (size_t i = 0; i < 3; i++) {
    blk b = do_malloc(starts[i]);
    for (size_t h = 0; h < sizeof huge / sizeof huge[0]; h++) {
      errno = 0;
      void *q = API(realloc)(b.p, hkt_opaque(huge[h]));
      int e = errno;
      CHECK(q == NULL, "realloc(%zu-byte block, 0x%zx) = %p, expected NULL", starts[i], huge[h], q);
      CHECK(e == ENOMEM, "realloc(%zu-byte block, 0x%zx): errno %d, expected ENOMEM", starts[i], huge[h], e);
      verify_blk(&b, "block after failed realloc");
      CHECK(usable_of(b.p) == b.usable, "usable size changed after a failed realloc");
    }
    /* reallocarray overflow: NULL/ENOMEM, old block still valid */
    errno = 0;
    void *q = API(reallocarray)(b.p, hkt_opaque(SIZE_MAX / 2 + 1), 4);
    CHECK(q == NULL && errno == ENOMEM, "reallocarray(p, SIZE_MAX/2+1, 4) = %p errno %d, expected NULL/ENOMEM", q,
          errno);
    errno = 0;
    q = API(reallocarray)(b.p, hkt_opaque((size_t)1 << 32), (size_t)1 << 32);
    CHECK(q == NULL && errno == ENOMEM, "reallocarray(p, 2^32, 2^32) = %p errno %d, expected NULL/ENOMEM", q, errno);
    verify_blk(&b, "block after failed reallocarray");
    /* a valid reallocarray still works and keeps the contents */
    size_t newn = starts[i] / 10 + 1;
    unsigned char *r = (unsigned char *)API(reallocarray)(b.p, newn, 20);
    CHECK(r != NULL, "reallocarray(p, %zu, 20) failed", newn);
    size_t keep = b.usable < newn * 20 ? b.usable : newn * 20;
    size_t bad = hkt_verify(r, keep, b.seed);
    CHECK(bad == HKT_OK, "reallocarray(%zu -> %zu): byte %zu not preserved", b.usable, newn * 20, bad);
    API(free)(r);
  }
  /* reallocarray(NULL, n, m) is malloc(n*m) */
  void *p = API(reallocarray)(NULL, 10, 10);
  blk b = check_new(p, 100, 8, "reallocarray(NULL, 10, 10)");
  verify_blk(&b, "reallocarray(NULL)");
  API(free)(p);
}

/* ------------------------------------------------------------------ */

static void test_free_errno(void) {
  size_t sizes[] = {0, 8, 100, 4096, 200 * KiB, MiB, MiB + 1, 3 * MiB, 40 * MiB};
  for (int round = 0; round < 3; round++) {
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
      void *p = API(malloc)(sizes[i]);
      CHECK(p != NULL, "malloc(%zu) failed", sizes[i]);
      errno = 12345;
      API(free)(p);
      CHECK(errno == 12345, "free() of a %zu-byte block changed errno to %d", sizes[i], errno);
    }
    errno = 12345;
    API(free)(NULL);
    CHECK(errno == 12345, "free(NULL) changed errno to %d", errno);
    /* overflow the large-block cache so frees unmap */
    void *big[40];
    for (int i = 0; i < 40; i++) {
      big[i] = API(malloc)(2 * MiB + (size_t)i * 4096);
      CHECK(big[i] != NULL, "malloc(2 MiB + %d pages) failed", i);
    }
    for (int i = 0; i < 40; i++) {
      errno = 12345;
      API(free)(big[i]);
      CHECK(errno == 12345, "free() of large block %d changed errno to %d", i, errno);
    }
    void *al = API(aligned_alloc)(MiB, 100);
    CHECK(al != NULL, "aligned_alloc(1 MiB, 100) failed");
    errno = 12345;
    API(free)(al);
    CHECK(errno == 12345, "free() of a 1 MiB-aligned block changed errno to %d", errno);
  }
}

static void test_trim(void) {
  /* lots of memory freed, a few blocks live: trim must keep the live ones */
  enum { N = 20000 };
  void **ps = (void **)API(malloc)(N * sizeof(void *));
  CHECK(ps != NULL, "malloc of pointer array failed");
  for (int i = 0; i < N; i++) {
    ps[i] = API(malloc)((size_t)(i % 64) * 64 + 8);
    CHECK(ps[i] != NULL, "malloc failed");
    memset(ps[i], 0x55, 8);
  }
  void *large[8];
  for (int i = 0; i < 8; i++) {
    large[i] = API(malloc)(3 * MiB);
    CHECK(large[i] != NULL, "malloc(3 MiB) failed");
  }
  for (int i = 0; i < 8; i++) API(free)(large[i]);
  for (int i = 0; i < 20; i++) pool_add(do_malloc((size_t)i * 5000 + 1));
  for (int i = 0; i < N; i++) API(free)(ps[i]);
  API(free)(ps);
  for (int t = 0; t < 3; t++) {
    int r = API(malloc_trim)(0);
    CHECK(r == 0 || r == 1, "malloc_trim(0) returned %d, expected 0 or 1", r);
    verify_pool("live blocks after malloc_trim");
    int r2 = API(malloc_trim)(hkt_opaque(1 * MiB));
    CHECK(r2 == 0 || r2 == 1, "malloc_trim(1 MiB) returned %d, expected 0 or 1", r2);
  }
  /* allocation after trim works; memory handed out again is writable */
  for (int i = 0; i < 2000; i++) pool_add(do_malloc((size_t)(i * 97) % 70000));
  pool_add(do_malloc(3 * MiB));
  check_pool_disjoint("after malloc_trim");
  verify_pool("after malloc_trim");
  pool_free_all();
  int r = API(malloc_trim)(0);
  CHECK(r == 0 || r == 1, "malloc_trim(0) returned %d", r);
  /* calloc after trim still zeroes */
  for (int i = 0; i < 50; i++) {
    size_t n = (size_t)i * 3000 + 1;
    unsigned char *z = (unsigned char *)API(calloc)(1, n);
    CHECK(z != NULL, "calloc after trim failed");
    check_zero(z, n, "calloc after malloc_trim");
    API(free)(z);
  }
}

/* hakmem.h: malloc_trim returns free memory to the OS now and returns 1 if
 * it released any. 64 MiB of small and medium blocks, all freed: trim must
 * report a release and RSS must drop by most of it. */
static void test_trim_releases(void) {
  enum { N = 16384 };
  void **ps = (void **)API(malloc)(N * sizeof(void *));
  CHECK(ps != NULL, "malloc failed");
  size_t total = 0;
  for (int i = 0; i < N; i++) {
    size_t n = (i % 4 == 0) ? 12000 : 2000 + (size_t)(i % 7) * 8;
    ps[i] = API(malloc)(n);
    CHECK(ps[i] != NULL, "malloc(%zu) failed", n);
    memset(ps[i], 0x77, n);
    total += n;
  }
  size_t before = hkt_rss_bytes();
  for (int i = 0; i < N; i++) API(free)(ps[i]);
  API(free)(ps);
  int r = API(malloc_trim)(0);
  size_t after = hkt_rss_bytes();
  printf(" [%zu MiB live: RSS %.1f MiB -> %.1f MiB after free + malloc_trim, returned %d]", total / MiB,
         (double)before / (double)MiB, (double)after / (double)MiB, r);
  CHECK(r == 1, "malloc_trim(0) returned %d after %zu MiB were freed, expected 1 (memory released)", r, total / MiB);
  CHECK(after + total / 2 < before,
        "RSS only dropped from %.1f MiB to %.1f MiB after freeing %.1f MiB and malloc_trim(0)",
        (double)before / (double)MiB, (double)after / (double)MiB, (double)total / (double)MiB);
}

/* Freed large blocks may be kept mapped for reuse, but not resident beyond
 * a small budget: freeing 32 MiB of touched 4 MiB blocks must lower RSS by
 * most of it within a few purger passes (30 ms here), with no malloc_trim. */
static void test_large_cache_resident(void) {
  enum { N = 8 };
  void *ps[N];
  for (int i = 0; i < N; i++) {
    ps[i] = API(malloc)(4 * MiB);
    CHECK(ps[i] != NULL, "malloc(4 MiB) failed");
    memset(ps[i], 0x3c, 4 * MiB);
  }
  size_t before = hkt_rss_bytes();
  for (int i = 0; i < N; i++) API(free)(ps[i]);
  /* the cache may keep them resident for a few ms (a thread may be about
   * to reuse them: src/large.c), then the purger gives them back */
  size_t after = hkt_rss_bytes();
  int waited = 0;
  for (; hkt_timed_purges() && waited < 1000 && after + 16 * MiB >= before; waited += 10) {
    usleep(10 * 1000);
    after = hkt_rss_bytes();
  }
  printf(" [RSS %.1f -> %.1f MiB %d ms after freeing %d x 4 MiB%s]", (double)before / (double)MiB,
         (double)after / (double)MiB, waited, N, hkt_timed_purges() ? "" : "; no timed purges: not checked");
  CHECK(!hkt_timed_purges() || after + 16 * MiB < before, "freed large blocks stay resident for 1 s: RSS %.1f -> %.1f MiB",
        (double)before / (double)MiB, (double)after / (double)MiB);
  /* and they are still reusable: calloc from the cache is zero */
  char *z = (char *)API(calloc)(1, 4 * MiB);
  CHECK(z != NULL, "calloc(4 MiB) failed");
  check_zero(z, 4 * MiB, "calloc of a cached large block");
  API(free)(z);
  API(malloc_trim)(0); /* leave no cached mapping to the tests after this one */
}

/* Large blocks freed into the cache and purged there (more than the cache
 * keeps resident, older than its grace period) read as zeros when calloc
 * takes them back: all of them, including the part of the header's page
 * that holds data (src/large.c), which the purge does not give back. */
static void test_large_cache_purged_calloc(void) {
  enum { N = 5 };
  size_t n = 4 * MiB;
  void *ps[N];
  for (int i = 0; i < N; i++) {
    ps[i] = API(malloc)(n);
    CHECK(ps[i] != NULL, "malloc(4 MiB) failed");
    memset(ps[i], 0x5a, n);
  }
  for (int i = 0; i < N - 1; i++) API(free)(ps[i]);
  usleep(30 * 1000); /* past the cache's grace period, well within the purge delay */
  API(free)(ps[N - 1]); /* the cache, over its resident budget, purges the oldest */
  for (int i = 0; i < N; i++) {
    unsigned char *z = (unsigned char *)API(calloc)(1, n);
    CHECK(z != NULL, "calloc(4 MiB) failed");
    check_zero(z, n, "calloc of a large block purged in the cache");
    ps[i] = z;
  }
  for (int i = 0; i < N; i++) API(free)(ps[i]);
  API(malloc_trim)(0);
}

/* Most medium blocks freed, but one in every span kept live, so no span is
 * empty: malloc_trim must still give back the inside of the free blocks,
 * keep the live ones intact, and blocks handed out again must work (calloc
 * zero, contents kept). */
static void test_trim_inside_spans(void) {
  enum { N = 2048 };
  static blk bs[N];
  size_t total = 0;
  for (int i = 0; i < N; i++) {
    bs[i] = do_malloc(48 * KiB); /* 4 blocks per 3-slab span, filled in order */
    total += bs[i].req;
  }
  size_t before = hkt_rss_bytes();
  size_t freed = 0;
  for (int i = 0; i < N; i++)
    if (i % 4 != 0) {
      verify_blk(&bs[i], "before free");
      freed += bs[i].req;
      API(free)(bs[i].p);
      bs[i].p = NULL;
    }
  int r = API(malloc_trim)(0);
  size_t after = hkt_rss_bytes();
  printf(" [%zu of %zu MiB freed, one block per span live: RSS %.1f -> %.1f MiB, trim returned %d]", freed / MiB,
         total / MiB, (double)before / (double)MiB, (double)after / (double)MiB, r);
  CHECK(after + freed / 2 < before, "RSS only dropped from %.1f to %.1f MiB after freeing %.1f MiB and malloc_trim(0)",
        (double)before / (double)MiB, (double)after / (double)MiB, (double)freed / (double)MiB);
  for (int i = 0; i < N; i += 4) verify_blk(&bs[i], "live block after malloc_trim");
  for (int i = 0; i < N; i++)
    if (bs[i].p == NULL) {
      size_t n = 48 * KiB;
      if (i % 2) {
        bs[i] = do_malloc(n);
      } else {
        char *z = (char *)API(calloc)(1, n);
        CHECK(z != NULL, "calloc(%zu) failed", n);
        check_zero(z, n, "calloc of a purged block");
        API(free)(z);
        bs[i] = do_malloc(n);
      }
    }
  for (int i = 0; i < N; i++) {
    verify_blk(&bs[i], "after reuse");
    API(free)(bs[i].p);
  }
}

static void test_free_sized(void) {
#ifndef HAK_API_PREFIX
  CHECK(free_sized != NULL, "the library does not export free_sized");
  CHECK(free_aligned_sized != NULL, "the library does not export free_aligned_sized");
#endif
  CHECK(!missing_sized_free, "internal: sized free fallback used");
  size_t sizes[] = {1, 8, 127, 128, 129, 5000, 70000, MiB, MiB + 1, 3 * MiB};
  for (int round = 0; round < 50; round++) {
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
      if (sizes[i] >= MiB && round % 10) continue;
      blk b = do_malloc(sizes[i]);
      verify_blk(&b, "before free_sized");
      do_free_sized(b.p, sizes[i]);
    }
  }
  do_free_sized(NULL, 0);
  do_free_aligned_sized(NULL, 64, 0);
  for (size_t a = 8; a <= 4 * MiB; a *= 2) {
    void *p = API(aligned_alloc)(a, 3 * a);
    blk b = check_new(p, 3 * a, a, "aligned_alloc");
    verify_blk(&b, "before free_aligned_sized");
    do_free_aligned_sized(p, a, 3 * a);
  }
}

#ifndef HAK_API_PREFIX
/* Extras only the override library provides. */
static void test_libc_extras(void) {
  enum { N = 10240 };
  static void *ps[N];
  for (int i = 0; i < N; i++) {
    ps[i] = malloc(1024);
    CHECK(ps[i] != NULL, "malloc(1024) failed");
    memset(ps[i], 1, 1024);
  }
  struct mallinfo2 mi = mallinfo2();
  CHECK(mi.uordblks > 0, "mallinfo2().uordblks is 0 while 10 MiB are live");
  CHECK(mi.uordblks + mi.hblkhd >= 8 * MiB,
        "mallinfo2(): uordblks %zu + hblkhd %zu < 8 MiB while 10 MiB are live", mi.uordblks, mi.hblkhd);
  CHECK(mi.uordblks < ((size_t)1 << 40) && mi.fordblks < ((size_t)1 << 40) && mi.arena < ((size_t)1 << 40),
        "mallinfo2() values look uninitialised: arena %zu uordblks %zu fordblks %zu", mi.arena, mi.uordblks,
        mi.fordblks);
  for (int i = 0; i < N; i++) free(ps[i]);

  /* a freed large block kept for reuse is free memory, not in use */
  struct mallinfo2 before = mallinfo2();
  void *big = malloc(5 * MiB);
  CHECK(big != NULL, "malloc(5 MiB) failed");
  memset(big, 1, 4096);
  struct mallinfo2 live = mallinfo2();
  CHECK(live.hblkhd >= before.hblkhd + 5 * MiB, "mallinfo2(): hblkhd %zu -> %zu with a live 5 MiB block",
        before.hblkhd, live.hblkhd);
  free(big);
  struct mallinfo2 after = mallinfo2();
  CHECK(after.hblkhd + 5 * MiB <= live.hblkhd && after.uordblks + 5 * MiB <= live.uordblks,
        "mallinfo2() still counts a freed 5 MiB block as in use: hblkhd %zu -> %zu, uordblks %zu -> %zu",
        live.hblkhd, after.hblkhd, live.uordblks, after.uordblks);

  int r = mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  CHECK(r == 0 || r == 1, "mallopt(M_MMAP_THRESHOLD) returned %d", r);
  r = mallopt(M_TRIM_THRESHOLD, 1 << 20);
  CHECK(r == 0 || r == 1, "mallopt(M_TRIM_THRESHOLD) returned %d", r);
  r = mallopt(M_ARENA_MAX, 2);
  CHECK(r == 0 || r == 1, "mallopt(M_ARENA_MAX) returned %d", r);
  blk b = do_malloc(300 * KiB); /* still works after mallopt */
  verify_blk(&b, "after mallopt");
  free(b.p);

  fflush(stdout);
  malloc_stats();

  if (cfree != NULL) {
    for (int i = 0; i < 100; i++) {
      void *p = malloc((size_t)i * 100);
      CHECK(p != NULL, "malloc failed");
      cfree(p);
    }
  } else {
    printf("note: cfree is not exported by the library, skipped\n");
  }
}
#endif

/* hakmem-specific: usable sizes follow the documented classes (8-byte steps
 * up to 128 B, then 8 classes per power of two, 12.5 % apart, to 1 MiB), so
 * no block wastes more than its class rounding. */
static size_t class_bound(size_t n) {
  if (n <= 8) return 8;
  if (n <= 128) return (n + 15) & ~(size_t)15;
  unsigned b = 63u - (unsigned)__builtin_clzl(n - 1); /* 2^b < n <= 2^(b+1) */
  size_t step = (size_t)1 << (b - 3);
  return (n + step - 1) & ~(step - 1);
}

static void test_size_class_bounds(void) {
  for (size_t n = 0; n <= 16384; n++) {
    void *p = API(malloc)(n);
    CHECK(p != NULL, "malloc(%zu) failed", n);
    size_t u = usable_of(p);
    CHECK(u >= n && u <= class_bound(n),
          "malloc(%zu): usable size %zu, expected between %zu and the class size %zu", n, u, n, class_bound(n));
    API(free)(p);
  }
  /* (hardened mode adds its canary and size trailer to the request: near
   * 1 MiB that makes a large block, whose mapping may be a bigger cached one) */
  size_t top = hkt_hardened() ? MiB - 64 : MiB;
  for (size_t c = 0; c < n_classes; c++) {
    size_t cs = class_sizes[c];
    size_t probe[] = {cs - 1, cs, cs + 1};
    for (int k = 0; k < 3; k++) {
      size_t n = probe[k];
      if (n > top) continue;
      void *p = API(malloc)(n);
      CHECK(p != NULL, "malloc(%zu) failed", n);
      size_t u = usable_of(p);
      CHECK(u >= n && u <= class_bound(n), "malloc(%zu): usable size %zu, expected between %zu and class size %zu", n,
            u, n, class_bound(n));
      API(free)(p);
    }
  }
  /* large blocks: usable is not wildly bigger than requested (a cached
   * mapping of up to twice the size may serve a request) */
  size_t large[] = {MiB + 1, 2 * MiB - 1, 2 * MiB + 1, 5 * MiB + 3, 33 * MiB};
  for (size_t i = 0; i < sizeof large / sizeof large[0]; i++) {
    void *p = API(malloc)(large[i]);
    CHECK(p != NULL, "malloc(%zu) failed", large[i]);
    size_t u = usable_of(p);
    CHECK(u >= large[i] && u <= 2 * large[i] + 64 * KiB, "malloc(%zu): usable size %zu", large[i], u);
    API(free)(p);
  }
}

/* Blocks of 9 to 60 KiB lie 64 bytes more apart than their class size
 * (docs/DESIGN.md, "Padded classes"): consecutive blocks start in
 * different L1 cache sets, where a multiple of 4 KiB apart they would all
 * share one (and equal offsets into them alias in the store buffer).
 * Aligned requests of those sizes still get aligned blocks from the size
 * classes, not from the large tier. */
static void test_class_padding(void) {
  /* hardened mode carves pages in random order (docs/SAFETY.md), so
   * consecutive blocks are not neighbours there; it reports the requested
   * size as usable */
  void *probe = API(malloc)(1000);
  CHECK(probe != NULL, "malloc(1000) failed");
  bool hardened = usable_of(probe) == 1000;
  API(free)(probe);
  size_t sizes[] = {9000, 12288, 16000, 30000, 40000, 61440};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0] && !hardened; s++) {
    enum { N = 16 };
    uintptr_t a[N];
    for (int i = 0; i < N; i++) {
      void *p = API(malloc)(sizes[s]);
      CHECK(p != NULL, "malloc(%zu) failed", sizes[s]);
      memset(p, 0x3c, sizes[s]);
      a[i] = (uintptr_t)p;
    }
    size_t stride = usable_of((void *)a[0]) + 64;
    for (int i = 1; i < N; i++) /* insertion sort by address */
      for (int j = i; j > 0 && a[j - 1] > a[j]; j--) {
        uintptr_t t = a[j];
        a[j] = a[j - 1];
        a[j - 1] = t;
      }
    unsigned close = 0;
    for (int i = 1; i < N; i++) {
      uintptr_t d = a[i] - a[i - 1];
      if (d >= 64 * KiB || d % stride != 0) continue; /* not blocks of one page */
      close++;
      CHECK(((a[i] >> 6) & 63) != ((a[i - 1] >> 6) & 63), "malloc(%zu): blocks %p and %p start in the same cache set",
            sizes[s], (void *)a[i - 1], (void *)a[i]);
    }
    CHECK(close >= N / 2, "malloc(%zu) x %d: only %u pairs %zu bytes apart (class size + 64)", sizes[s], N, close,
          stride);
    for (int i = 0; i < N; i++) API(free)((void *)a[i]);
  }
  size_t aligns[] = {128, 4096};
  for (size_t a = 0; a < 2; a++) {
    for (size_t size = 9216; size <= 61440; size += size / 2) {
      enum { N = 8 };
      void *p[N];
      for (int i = 0; i < N; i++) {
        CHECK(API(posix_memalign)(&p[i], aligns[a], size) == 0, "posix_memalign(%zu, %zu) failed", aligns[a], size);
        CHECK(((uintptr_t)p[i] & (aligns[a] - 1)) == 0, "posix_memalign(%zu, %zu) = %p", aligns[a], size, p[i]);
        CHECK(usable_of(p[i]) >= size, "posix_memalign(%zu, %zu): usable %zu", aligns[a], size, usable_of(p[i]));
        memset(p[i], 0x3d, size);
      }
      /* large blocks lie 2 MiB apart at least; these share pages */
      unsigned near = 0;
      for (int i = 1; i < N; i++) {
        uintptr_t d = (uintptr_t)p[i] > (uintptr_t)p[i - 1] ? (uintptr_t)p[i] - (uintptr_t)p[i - 1]
                                                            : (uintptr_t)p[i - 1] - (uintptr_t)p[i];
        near += d < MiB;
      }
      CHECK(near >= N / 2, "posix_memalign(%zu, %zu) x %d: only %u neighbours within 1 MiB", aligns[a], size, N, near);
      for (int i = 0; i < N; i++) API(free)(p[i]);
    }
  }
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

#define RUN(fn)                                                  \
  do {                                                           \
    printf("test_api [%s]: %s ...", API_MODE, #fn);              \
    fflush(stdout);                                              \
    double t0_ = now_s();                                        \
    fn();                                                        \
    printf(" ok (%.2f s)\n", now_s() - t0_);                     \
    fflush(stdout);                                              \
  } while (0)

int main(void) {
  compute_classes();
  pool_reserve(16384);
  RUN(test_version_and_null);
  RUN(test_malloc_zero);
  RUN(test_sizes_linear);
  RUN(test_sizes_geometric);
  RUN(test_class_pages);
  RUN(test_aligned_valid);
  RUN(test_aligned_region_size);
  RUN(test_aligned_invalid);
  RUN(test_aligned_size_zero);
  RUN(test_valloc_pvalloc);
  RUN(test_calloc_reuse);
  RUN(test_calloc_overflow);
  RUN(test_malloc_huge);
  RUN(test_realloc_basic);
  RUN(test_realloc_tiers);
  RUN(test_realloc_shrink_keeps);
  RUN(test_realloc_large_shrinks_in_place);
  RUN(test_realloc_in_place);
  RUN(test_colored_blocks);
  RUN(test_realloc_huge);
  RUN(test_free_errno);
  RUN(test_trim);
  RUN(test_trim_releases);
  RUN(test_trim_inside_spans);
  RUN(test_large_cache_resident);
  RUN(test_large_cache_purged_calloc);
  RUN(test_free_sized);
#ifndef HAK_API_PREFIX
  RUN(test_libc_extras);
#endif
  RUN(test_size_class_bounds);
  RUN(test_class_padding);
  API(free)(pool);
  printf("test_api [%s]: all passed\n", API_MODE);
  return 0;
}
