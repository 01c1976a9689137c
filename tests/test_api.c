/* test_api: semantics of every allocation entry point as a program sees
 * them, for every size class and tier (small <= 128 B, size classes up to
 * 1 MiB, large mapped blocks above), checked against the C library
 * contract. What hakmem does inside (block placement, resizing in place,
 * purging, statistics) is checked by test_internals.c.
 *
 * Built twice: with -DHAK_API_PREFIX against hakmem-api (hak_malloc, ...) and
 * with plain names against the override library (malloc, ... resolve to
 * hakmem). See api.h.
 */
#define _GNU_SOURCE
#define TEST_NAME "test_api"
#include "block_pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* Every size up to 1 KiB at the alignments that malloc's own classes give
 * (32 and 64: hakmem serves them through malloc's fast path), 64 of them
 * live at a time, written whole. */
static void test_aligned_small(void) {
  for (int kind = 0; kind < 3; kind++) {
    for (size_t align = 32; align <= 64; align *= 2) {
      for (size_t size = 1; size <= 1024; size++) {
        void *p = aligned_call(kind, align, size);
        char what[64];
        snprintf(what, sizeof what, "%s(align %zu)", aln_name[kind], align);
        pool_add(check_new(p, size, align, what));
        if (pool_n == 64) {
          check_pool_disjoint("small aligned blocks");
          verify_pool("small aligned blocks");
          for (size_t i = 0; i < pool_n; i++) API(free)(pool[i].p);
          pool_n = 0;
        }
      }
    }
  }
  for (size_t i = 0; i < pool_n; i++) API(free)(pool[i].p);
  pool_n = 0;
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
                    (size_t)3 << 62,
                    (size_t)1 << 48};
  /* a block's usable size says the mode (hardened mode: the size asked
   * for): huge requests leave it as it was */
  void *probe = API(malloc)(100);
  size_t usable = API(malloc_usable_size)(probe);
  API(free)(probe);
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = hkt_opaque(sizes[i]);
    errno = 0;
    void *p = API(malloc)(n);
    int e = errno;
    CHECK(p == NULL, "malloc(0x%zx) = %p, expected NULL", n, p);
    CHECK(e == ENOMEM, "malloc(0x%zx): errno %d, expected ENOMEM", n, e);
  }
  /* still works afterwards, in the same mode */
  probe = API(malloc)(100);
  CHECK(API(malloc_usable_size)(probe) == usable, "after huge mallocs, malloc(100) has %zu usable bytes, %zu before",
        API(malloc_usable_size)(probe), usable);
  API(free)(probe);
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
/* Extras only the override library provides: mallopt, malloc_stats and
 * cfree (mallinfo2's counters are test_internals.c's). */
static void test_libc_extras(void) {
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

int main(void) {
  compute_classes();
  pool_reserve(16384);
  RUN(test_version_and_null);
  RUN(test_malloc_zero);
  RUN(test_sizes_linear);
  RUN(test_sizes_geometric);
  RUN(test_class_pages);
  RUN(test_aligned_valid);
  RUN(test_aligned_small);
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
  RUN(test_realloc_huge);
  RUN(test_free_errno);
  RUN(test_trim);
  RUN(test_free_sized);
#ifndef HAK_API_PREFIX
  RUN(test_libc_extras);
#endif
  API(free)(pool);
  printf("test_api [%s]: all passed\n", API_MODE);
  return 0;
}
