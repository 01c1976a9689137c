/* test_internals: what hakmem does behind the API, checked through it:
 * where blocks lie (class rounding of usable sizes, padded classes, cache
 * colouring), resizing in place, the large-block cache, giving memory back
 * to the OS (malloc_trim, the purger; RSS measured) and the statistics of
 * mallinfo2. These checks depend on the allocator's layout and
 * policies (docs/DESIGN.md); the API's contract is checked by test_api.c.
 *
 * Built twice, as test_api: with -DHAK_API_PREFIX against hakmem-api
 * (hak_malloc, ...) and with plain names against the override library.
 * See api.h.
 */
#define _GNU_SOURCE
#define TEST_NAME "test_internals"
#include "block_pool.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Small blocks (below 4 KiB): a growing block gets a quarter more than it
 * asked for (a buffer grown a byte at a time moves at most every quarter,
 * not at every size class), a block that shrinks to half its usable size or
 * more stays, and contents survive every step, also when another thread
 * owns the block (hardened mode gives no room below 4 KiB: its canary
 * follows the room). */
static void *realloc_from_thread(void *arg) {
  void **pp = arg;
  unsigned char *q = (unsigned char *)API(realloc)(*pp, 300);
  CHECK(q != NULL, "realloc(100 -> 300) of another thread's block failed");
  CHECK(hkt_verify(q, 100, 77) == HKT_OK, "realloc of another thread's block lost its contents");
  *pp = q;
  return NULL;
}

static void test_realloc_small(void) {
  bool hardened = hkt_hardened();
  unsigned char *p = (unsigned char *)API(malloc)(16);
  CHECK(p != NULL, "malloc(16) failed");
  uint64_t seed = seed_counter++;
  size_t len = 16, moves = 0;
  hkt_fill(p, len, seed);
  /* a byte at a time to 4000 B, then by steps of 1/128 to 32,000 B (the
   * blocks of realloc's own path for small blocks, alloc.c), and on to
   * 64,000 B (bigger blocks, which that path keeps where they fit) */
  for (size_t next; len < 64000; len = next) {
    next = len < 4000 ? len + 1 : len + len / 128;
    unsigned char *q = (unsigned char *)API(realloc)(p, next);
    CHECK(q != NULL, "realloc(%zu -> %zu) failed", len, next);
    CHECK(hkt_verify(q, len, seed) == HKT_OK, "realloc(%zu -> %zu) lost the contents", len, next);
    if (q != p) {
      moves++;
      if (!hardened)
        CHECK(usable_of(q) >= next + next / 4, "realloc(%zu -> %zu) moved to a block of %zu: no room", len, next,
              usable_of(q));
    }
    hkt_fill(q, next, seed);
    p = q;
    /* 16 -> 4000 with a quarter more at each move: at most 25 moves */
    if (!hardened && len < 4000 && next == 4000)
      CHECK(moves <= 25, "growing 16 -> 4000 B a byte at a time moved %zu times", moves);
    /* and to 32,000: at most 35 */
    if (!hardened && len < 32000 && next >= 32000)
      CHECK(moves <= 35, "growing 16 -> 32,000 B moved %zu times", moves);
  }
  /* and to 64,000: at most 40 */
  if (!hardened) CHECK(moves <= 40, "growing 16 -> 64,000 B moved %zu times", moves);
  size_t u = usable_of(p);
  unsigned char *q = (unsigned char *)API(realloc)(p, u / 2 + 1);
  if (!hardened) CHECK(q == p, "realloc(%zu -> %zu) (half the usable size or more) moved the block", u, u / 2 + 1);
  CHECK(q != NULL && hkt_verify(q, u / 2 + 1, seed) == HKT_OK, "realloc shrink lost the contents");
  p = q;
  q = (unsigned char *)API(realloc)(p, 100);
  CHECK(q != NULL && q != p, "realloc(%zu -> 100) kept a block four times too big", u / 2 + 1);
  CHECK(hkt_verify(q, 100, seed) == HKT_OK, "realloc shrink to 100 lost the contents");
  API(free)(q);
  /* another thread's block */
  void *b = API(malloc)(100);
  CHECK(b != NULL, "malloc(100) failed");
  hkt_fill(b, 100, 77);
  pthread_t t;
  CHECK(pthread_create(&t, NULL, realloc_from_thread, &b) == 0, "pthread_create failed");
  pthread_join(t, NULL);
  CHECK(hkt_verify(b, 100, 77) == HKT_OK, "contents lost after the other thread's realloc");
  API(free)(b);
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

/* Zero mode (HAKMEM_SECURE=2) zeroes every freed block: a large block's
 * mapping is not cached but unmapped, so the next block of its size reads
 * as zero, whatever the last one held. */
static void test_zero_mode_large(void) {
  const char *level = getenv("HAKMEM_SECURE");
  if (level == NULL || atoi(level) < 2) return;
  size_t sizes[] = {1 * MiB, 2 * MiB + 100, 4 * MiB, 8 * MiB, 256 * KiB, 4000};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    for (int round = 0; round < 3; round++) {
      char *p = (char *)API(malloc)(sizes[i]);
      CHECK(p != NULL, "malloc(%zu) failed", sizes[i]);
      check_zero(p, sizes[i], "zero mode: a block after a freed one of its size");
      memset(p, 0x5a, sizes[i]);
      API(free)(p);
    }
  }
}

/* A block alone in its span (64 KiB multiples up to 1 MiB) grows into the
 * free slabs after it and shrinks by giving back its tail, without moving.
 * A buffer that realloc grows again past 64 KiB gets such a span, placed
 * with free slabs after it, so its next steps stay in place (a block's
 * first growth stays in the size classes below 128 KiB: a block resized to
 * random sizes is not a growing buffer), and so does a block's first growth
 * to 128 KiB or more; hardened mode keeps its own realloc (canary and
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
   * takes the class of 70 + 70/4 KiB, not a 128 KiB span */
  unsigned char *once = (unsigned char *)API(malloc)(40 * KiB);
  CHECK(once != NULL, "malloc(40 KiB) failed");
  once = (unsigned char *)API(realloc)(once, 70 * KiB);
  CHECK(once != NULL, "realloc(40 KiB -> 70 KiB) failed");
  if (!secure) CHECK(usable_of(once) < 128 * KiB, "a first growth to 70 KiB: usable %zu, a span of its own", usable_of(once));
  API(free)(once);
  /* a first growth to two slabs or more (with its room) takes a span of its
   * own: 100 -> 170 KiB (room: 212 KiB, a 224 KiB class) a 256 KiB span,
   * and the next step, to 300 KiB, is in place (the thread's ring of grown
   * blocks is filled with small blocks first, so that it cannot name the
   * 100 KiB block) */
  for (int i = 0; i < 32; i++) {
    void *small = API(malloc)(32);
    CHECK(small != NULL, "malloc(32) failed");
    small = API(realloc)(small, 64);
    CHECK(small != NULL, "realloc(32 -> 64) failed");
    API(free)(small);
  }
  once = (unsigned char *)API(malloc)(100 * KiB);
  CHECK(once != NULL, "malloc(100 KiB) failed");
  uint64_t seed_once = seed_counter++;
  hkt_fill(once, 100 * KiB, seed_once);
  once = (unsigned char *)API(realloc)(once, 170 * KiB);
  CHECK(once != NULL, "realloc(100 KiB -> 170 KiB) failed");
  CHECK(hkt_verify(once, 100 * KiB, seed_once) == HKT_OK, "realloc(100 KiB -> 170 KiB) lost data");
  if (!secure) CHECK(usable_of(once) == 256 * KiB, "a first growth to 170 KiB: usable %zu, expected a 256 KiB span", usable_of(once));
  unsigned char *again = (unsigned char *)API(realloc)(once, 300 * KiB);
  CHECK(again != NULL, "realloc(170 KiB -> 300 KiB) failed");
  CHECK(hkt_verify(again, 100 * KiB, seed_once) == HKT_OK, "realloc(170 KiB -> 300 KiB) lost data");
  if (!secure) {
    CHECK(again == once, "realloc(170 KiB -> 300 KiB) moved the block: the slabs after its span were free");
    CHECK(usable_of(again) == 320 * KiB, "realloc(-> 300 KiB): usable %zu", usable_of(again));
  }
  API(free)(again);
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

  /* the block of a class coloured inside its span (288 KiB: 5 slabs, at a
   * colour offset) shrinks in place into a coloured span block: 288 -> 100
   * KiB keeps its address and holds 128 KiB; it grows back, and its class
   * keeps working */
  for (int round = 0; round < 3; round++) {
    unsigned char *a = (unsigned char *)API(malloc)(288 * KiB);
    CHECK(a != NULL, "malloc(288 KiB) failed");
    seed = seed_counter++;
    hkt_fill(a, 288 * KiB, seed);
    unsigned char *b = (unsigned char *)API(realloc)(a, 100 * KiB);
    CHECK(b != NULL, "realloc(288 KiB -> 100 KiB) failed");
    CHECK(hkt_verify(b, 100 * KiB, seed) == HKT_OK, "realloc(288 KiB -> 100 KiB) lost data");
    if (!secure) {
      CHECK(b == a, "realloc(288 KiB -> 100 KiB) moved the block");
      CHECK(usable_of(b) == 128 * KiB, "realloc(288 KiB -> 100 KiB): usable %zu", usable_of(b));
    }
    unsigned char *c = (unsigned char *)API(malloc)(288 * KiB);
    CHECK(c != NULL && (c + 288 * KiB <= b || c >= b + 128 * KiB), "malloc(288 KiB) after a shrink overlaps it");
    memset(c, 0x5a, 288 * KiB);
    CHECK(hkt_verify(b, 100 * KiB, seed) == HKT_OK, "a shrunk block was overwritten by a later block");
    unsigned char *d = (unsigned char *)API(realloc)(b, 300 * KiB);
    CHECK(d != NULL, "realloc(100 KiB -> 300 KiB) failed");
    CHECK(hkt_verify(d, 100 * KiB, seed) == HKT_OK, "realloc(100 KiB -> 300 KiB) lost data");
    CHECK(d + 300 * KiB <= c || d >= c + 288 * KiB, "realloc(100 KiB -> 300 KiB) overlaps another block");
    API(free)(c);
    API(free)(d);
  }
  /* ... but a shrink within its span's last slab takes no slab more:
   * 120 KiB (2 slabs) -> 100 KiB stays a 120 KiB block */
  unsigned char *e = (unsigned char *)API(malloc)(120 * KiB);
  CHECK(e != NULL, "malloc(120 KiB) failed");
  unsigned char *f = (unsigned char *)API(realloc)(e, 100 * KiB);
  CHECK(f != NULL, "realloc(120 KiB -> 100 KiB) failed");
  if (!secure) CHECK(f == e && usable_of(f) == 120 * KiB, "realloc(120 KiB -> 100 KiB): usable %zu", usable_of(f));
  API(free)(f);
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
   * malloc than the block just freed. Not with a purge delay of 0, where
   * the purger may unmap the block between the free and the malloc. */
  const char *delay = getenv("HAKMEM_PURGE_DELAY_MS");
  if (!secure && hkt_large_cache(2 * MiB) && !(delay != NULL && atol(delay) == 0)) {
    API(malloc_trim)(0);
    void *a = API(malloc)(2 * MiB);
    CHECK(a != NULL, "malloc(2 MiB) failed");
    API(free)(a);
    void *b = API(malloc)(2 * MiB);
    CHECK(b == a, "malloc(2 MiB) after free: %p, expected the cached block at %p", b, a);
    API(free)(b);
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

/* A large block aligned beyond a cache line, from a cached mapping that
 * held a larger block: as aligned as asked (hardened mode places a reused
 * mapping's other blocks at a colour, or against the guard after them),
 * and whole. */
static void test_large_aligned_reuse(void) {
  static const size_t aligns[] = {128, 4096, 8192, 65536};
  for (unsigned i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
    void *big = API(malloc)(9 * MiB + 4096); /* (its end an odd number of pages into its mapping) */
    CHECK(big != NULL, "malloc(9 MiB + 4 KiB) failed");
    memset(big, 1, 9 * MiB + 4096);
    API(free)(big);
    char *p = (char *)API(aligned_alloc)(aligns[i], 8 * MiB);
    CHECK(p != NULL, "aligned_alloc(%zu, 8 MiB) failed", aligns[i]);
    CHECK((uintptr_t)p % aligns[i] == 0, "aligned_alloc(%zu, 8 MiB) = %p in a reused mapping", aligns[i], (void *)p);
    memset(p, 2, 8 * MiB);
    API(free)(p);
  }
  API(malloc_trim)(0);
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
  if (hkt_page() >= 64 * KiB) {
    /* (a 48 KiB block holds no whole page of 64 KiB but the one its link
     * is in: nothing of it goes back while its neighbours live) */
    printf(" [skipped: pages of %zu KiB]", hkt_page() / KiB);
    return;
  }
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

#ifndef HAK_API_PREFIX
/* mallinfo2's counters (override library only): bytes in use while blocks
 * are live, and a freed large block kept for reuse counted as free memory,
 * not in use. */
static void test_mallinfo2(void) {
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

/* Hardened mode hands out a page's fresh blocks in a random order, big
 * blocks too (docs/SAFETY.md): of the pairs of blocks that successive
 * mallocs return, about half are in ascending address order, not nearly
 * all as carving in address order gives (84 % here). A step of 16 blocks
 * is mostly ascending only for the few smallest of its 15 strides, so 80 %
 * over the 48 or so steps here is out of reach by chance. */
static void test_hardened_carving(void) {
  if (!hkt_hardened()) return;
  size_t sizes[] = {100, 3000, 5000, 12000, 20000, 40000};
  enum { N = 128 };
  static void *p[N];
  unsigned pairs = 0, ascending = 0;
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    for (int i = 0; i < N; i++) {
      p[i] = API(malloc)(sizes[s]);
      CHECK(p[i] != NULL, "malloc(%zu) failed", sizes[s]);
      if (i > 0) {
        pairs++;
        ascending += (uintptr_t)p[i] > (uintptr_t)p[i - 1];
      }
    }
    for (int i = 0; i < N; i++) API(free)(p[i]);
  }
  CHECK(ascending * 10 < pairs * 8, "%u of %u successive blocks in ascending order: not shuffled", ascending, pairs);
}

/* Hardened mode's quarantine (docs/SAFETY.md): a freed block is not the
 * next one handed out, nor one of the next few, in any size up to its
 * limit; the order in which freed blocks come back is not the order they
 * were freed in. */
static void test_hardened_quarantine(void) {
  if (!hkt_hardened()) return;
  size_t sizes[] = {16, 64, 1000, 4000, 12000}; /* (blocks of 16 KiB at most) */
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    void *p = API(malloc)(sizes[s]);
    CHECK(p != NULL, "malloc(%zu) failed", sizes[s]);
    API(free)(p);
    void *q[4];
    for (int i = 0; i < 4; i++) {
      q[i] = API(malloc)(sizes[s]);
      CHECK(q[i] != p, "malloc(%zu) handed out the block freed just before", sizes[s]);
    }
    for (int i = 0; i < 4; i++) API(free)(q[i]);
  }
  /* 64 blocks freed in order, then taken again: not in the same order */
  enum { N = 64 };
  static void *a[N], *b[N];
  for (int i = 0; i < N; i++) CHECK((a[i] = API(malloc)(48)) != NULL, "malloc failed");
  for (int i = 0; i < N; i++) API(free)(a[i]);
  API(malloc_trim)(0); /* (the quarantine back to the pages) */
  unsigned same = 0;
  for (int i = 0; i < N; i++) {
    CHECK((b[i] = API(malloc)(48)) != NULL, "malloc failed");
    same += b[i] == a[N - 1 - i]; /* (a plain LIFO list gives them back reversed) */
  }
  CHECK(same < N / 2, "%u of %u freed blocks came back in LIFO order", same, N);
  for (int i = 0; i < N; i++) API(free)(b[i]);
}

/* Hardened mode: what a program can read of its own live block (the
 * canary after its 48 bytes, the size trailer in its 64-byte block's last
 * word) must not give away the page key that encodes the page's free list.
 * Were the trailer's code the page key XOR the canary's secret, the two
 * words together would hand over the key's top 56 bits, and with them the
 * address a freed block's link leads to. */
static void test_hardened_canary_key(void) {
  if (!hkt_hardened()) return;
  unsigned decoded = 0;
  for (int round = 0; round < 8; round++) {
    unsigned char *a = API(malloc)(48), *b = API(malloc)(48);
    CHECK(a != NULL && b != NULL, "malloc failed");
    uint64_t canary, trailer, link;
    memcpy(&canary, a + 48, 8);
    memcpy(&trailer, a + 56, 8);
    uint64_t guess = trailer ^ canary ^ 48 ^ 0x5bd1e995u;
    API(free)(b);
    API(malloc_trim)(0); /* (b leaves the quarantine for its page's list) */
    memcpy(&link, b, 8);  /* (a read after free, on purpose: b's page is a's, which is live) */
    decoded += ((link ^ guess) >> 22) == ((uintptr_t)b >> 22); /* (the region's 4 MiB) */
    API(free)(a);
  }
  CHECK(decoded == 0, "%u of 8 freed blocks' links decoded with a key read from a live block", decoded);
}

/* Hardened mode keeps other threads' blocks freed here too (docs/SAFETY.md,
 * "Quarantine"): through the quarantine into the thread cache, from which
 * this thread's mallocs take them again, never the one freed just before. */
enum { CACHED_N = 256 };
static void *cached_blocks[CACHED_N];
static pthread_barrier_t cached_ready, cached_done;
static void *cached_owner(void *unused) {
  (void)unused;
  for (int i = 0; i < CACHED_N; i++) CHECK((cached_blocks[i] = API(malloc)(48)) != NULL, "malloc failed");
  pthread_barrier_wait(&cached_ready);
  pthread_barrier_wait(&cached_done); /* (alive: an exited owner's blocks go straight back) */
  return NULL;
}
static void test_hardened_cache(void) {
  const char *level = getenv("HAKMEM_SECURE");
  if (!hkt_hardened() || (level != NULL && atoi(level) >= 2)) return; /* (zero mode keeps no cache) */
  pthread_barrier_init(&cached_ready, NULL, 2);
  pthread_barrier_init(&cached_done, NULL, 2);
  pthread_t t;
  CHECK(pthread_create(&t, NULL, cached_owner, NULL) == 0, "pthread_create failed");
  pthread_barrier_wait(&cached_ready);
  for (int i = 0; i < CACHED_N; i++) API(free)(cached_blocks[i]);
  void *last = cached_blocks[CACHED_N - 1];
  static void *got[CACHED_N];
  unsigned reused = 0;
  for (int i = 0; i < CACHED_N; i++) {
    CHECK((got[i] = API(malloc)(48)) != NULL, "malloc failed");
    CHECK(i > 0 || got[i] != last, "malloc handed out the block freed just before");
    for (int k = 0; k < CACHED_N; k++) reused += got[i] == cached_blocks[k];
  }
  CHECK(reused >= 16, "only %u of %d blocks freed here were reused here", reused, CACHED_N);
  for (int i = 0; i < CACHED_N; i++) API(free)(got[i]);
  pthread_barrier_wait(&cached_done);
  pthread_join(t, NULL);
}

/* Blocks of the padded classes (9 to 60 KiB, 72 to 104 KiB but 96, 144
 * and 208 KiB) lie 64 bytes more apart than their class size
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
  size_t sizes[] = {9000, 12288, 16000, 30000, 40000, 61440, 70000, 81920, 90112, 106496, 147456, 212992};
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
      if (d > 4 * stride || d % stride != 0) continue; /* not blocks of one page */
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
    for (size_t size = 9216; size <= 212992; size += size / 2) {
      enum { N = 8 };
      void *p[N];
      for (int i = 0; i < N; i++) {
        CHECK(API(posix_memalign)(&p[i], aligns[a], size) == 0, "posix_memalign(%zu, %zu) failed", aligns[a], size);
        CHECK(((uintptr_t)p[i] & (aligns[a] - 1)) == 0, "posix_memalign(%zu, %zu) = %p", aligns[a], size, p[i]);
        CHECK(usable_of(p[i]) >= size, "posix_memalign(%zu, %zu): usable %zu", aligns[a], size, usable_of(p[i]));
        memset(p[i], 0x3d, size);
      }
      /* large blocks lie 2 MiB apart at least; these share pages of two
       * blocks or more, so all but the first and the last block (which may
       * fall into a page partly used before, or half used after) have a
       * page-mate among the eight wherever the pages lie */
      unsigned near = 0;
      for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) {
          uintptr_t d = (uintptr_t)p[i] > (uintptr_t)p[j] ? (uintptr_t)p[i] - (uintptr_t)p[j]
                                                          : (uintptr_t)p[j] - (uintptr_t)p[i];
          if (j != i && d < MiB) {
            near++;
            break;
          }
        }
      CHECK(near >= N - 2, "posix_memalign(%zu, %zu) x %d: only %u blocks with another within 1 MiB", aligns[a], size,
            N, near);
      for (int i = 0; i < N; i++) API(free)(p[i]);
    }
  }
}

/* Slab-aligned requests (64 KiB) that no class serves (the classes of
 * their sizes place blocks at a colour's offset) get blocks at the start of
 * spans in the regions, not a large block's mapping each: the live large
 * blocks (hak_stats_get) do not grow, and blocks freed are taken again,
 * still aligned. Hardened mode gives them large blocks (canaries and guard
 * pages). */
static void test_aligned_slab(void) {
  void *probe = API(malloc)(1000);
  CHECK(probe != NULL, "malloc(1000) failed");
  bool hardened = usable_of(probe) == 1000;
  API(free)(probe);
  const size_t sizes[] = {1000, 64 * KiB, 200000};
  for (size_t s = 0; s < 3; s++) {
    enum { N = 8 };
    for (int round = 0; round < 2; round++) { /* (the second takes the first's blocks again) */
      struct hak_stats before, after;
      CHECK(hak_stats_get(&before, sizeof before) == 0, "hak_stats_get failed");
      for (int i = 0; i < N; i++) {
        void *p = NULL;
        CHECK(API(posix_memalign)(&p, 64 * KiB, sizes[s]) == 0, "posix_memalign(64 KiB, %zu) failed", sizes[s]);
        pool_add(check_new(p, sizes[s], 64 * KiB, "posix_memalign(64 KiB)"));
      }
      CHECK(hak_stats_get(&after, sizeof after) == 0, "hak_stats_get failed");
      check_pool_disjoint("slab-aligned blocks");
      verify_pool("slab-aligned blocks");
      if (!hardened)
        CHECK(after.large_live_blocks == before.large_live_blocks,
              "posix_memalign(64 KiB, %zu) x %d: %llu more live large blocks", sizes[s], N,
              after.large_live_blocks - before.large_live_blocks);
      pool_free_all();
    }
  }
}

/* New pages taken while a thread keeps 64 blocks of the given 8 sizes live
 * and replaces the oldest one at a time by one of a random size, over
 * `ops` replacements. It starts from a trimmed heap: what earlier tests
 * left held or stashed shares the held budget until the next timed purge
 * pass. */
static long pages_taken_replacing(const size_t sizes[8], uint64_t x, int ops) {
  enum { LIVE = 64 };
  API(malloc_trim)(0);
  void *p[LIVE];
  for (int i = 0; i < LIVE; i++) {
    p[i] = API(malloc)(sizes[i % 8]);
    CHECK(p[i] != NULL, "malloc failed");
    *(char *)p[i] = 1;
  }
  long before = hkt_stat("pages acquired (this+exited threads)");
  for (int op = 0; op < ops; op++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    int k = op % LIVE;
    API(free)(p[k]);
    p[k] = API(malloc)(sizes[x % 8]);
    CHECK(p[k] != NULL, "malloc failed");
    *(char *)p[k] = 1;
  }
  long taken = hkt_stat("pages acquired (this+exited threads)") - before;
  for (int i = 0; i < LIVE; i++) API(free)(p[i]);
  return taken;
}

/* Blocks of one a page (64 KiB and up) of several sizes: the stash
 * (queue.c) grows to hold freed blocks of all those classes, so a malloc
 * takes a stashed block instead of a new page (and a free keeps its page).
 * Not in hardened mode (no stash), nor where timed purge passes, which
 * give the stash back, come every few operations. */
static void test_stash_grows(void) {
  const char *delay = getenv("HAKMEM_PURGE_DELAY_MS");
  if (hkt_hardened() || (delay != NULL && atol(delay) < 100)) return;
  static const size_t sizes[] = {65536, 114688, 122880, 131072, 180224, 196608, 229376, 245760};
  enum { OPS = 20000 };
  long taken = pages_taken_replacing(sizes, 0x9E3779B97F4A7C15ull, OPS);
  CHECK(taken < OPS / 20, "%d mallocs of 64-240 KiB (64 live) took %ld new pages", OPS, taken);
}

/* The same with blocks of classes of 2-4 blocks a page (72-208 KiB): the
 * held budget grows as pages emptied while it was full are taken again, so
 * the emptied pages stay in their queues instead of going back and being
 * taken anew (not in hardened mode: there the budget does not grow). */
static void test_held_grows(void) {
  const char *delay = getenv("HAKMEM_PURGE_DELAY_MS");
  if (hkt_hardened() || (delay != NULL && atol(delay) < 100)) return;
  static const size_t sizes[] = {73728, 81920, 90112, 98304, 106496, 147456, 163840, 212992};
  enum { OPS = 20000 };
  long taken = pages_taken_replacing(sizes, 0x2545F4914F6CDD1Dull, OPS);
  CHECK(taken < OPS / 20, "%d mallocs of 72-208 KiB (64 live) took %ld new pages", OPS, taken);
}

/* calloc from a slab (64 KiB) to 1 MiB clears only what may hold data
 * (queue.c, hk_heap_calloc_span_block): on memory never written since it
 * was mapped or purged, a zeroed array that the program touches sparsely
 * takes few pages. Every byte reads as zero, also on memory that held data
 * (hardened mode clears every block: no RSS check there). */
static void test_calloc_untouched(void) {
  enum { N = 64 };
  const size_t size = 512 * KiB;
  unsigned char *p[N];
  for (int i = 0; i < N; i++) { /* memory that held data */
    p[i] = (unsigned char *)API(malloc)(size);
    CHECK(p[i] != NULL, "malloc(%zu) failed", size);
    memset(p[i], 0xa5, size);
  }
  for (int i = 0; i < N; i++) API(free)(p[i]);
  for (int i = 0; i < N; i++) {
    p[i] = (unsigned char *)API(calloc)(1, size - (size_t)i * 4096);
    CHECK(p[i] != NULL, "calloc(%zu) failed", size);
    for (size_t j = 0; j < size - (size_t)i * 4096; j++)
      if (p[i][j] != 0) CHECK(false, "calloc(%zu): byte %zu is 0x%02x", size - (size_t)i * 4096, j, p[i][j]);
    memset(p[i], 0x5a, size - (size_t)i * 4096);
  }
  for (int i = 0; i < N; i++) API(free)(p[i]);
  API(malloc_trim)(0);
  size_t before = hkt_rss_bytes();
  for (int i = 0; i < N; i++) {
    p[i] = (unsigned char *)API(calloc)(1, size);
    CHECK(p[i] != NULL, "calloc(%zu) failed", size);
    p[i][(size_t)i * 8191 % size] = 1;
  }
  size_t after = hkt_rss_bytes();
  if (!hkt_hardened())
    CHECK(after < before + N * size / 4, "%d calloc(%zu), one byte written in each: RSS %.1f -> %.1f MiB", N, size,
          before / (double)MiB, after / (double)MiB);
  for (int i = 0; i < N; i++) {
    for (size_t j = 0; j < size; j += 4093)
      if (j != (size_t)i * 8191 % size && p[i][j] != 0) CHECK(false, "calloc(%zu): byte %zu is 0x%02x", size, j, p[i][j]);
    API(free)(p[i]);
  }
  printf("[RSS %.1f -> %.1f MiB] ", before / (double)MiB, after / (double)MiB);
}

int main(void) {
  compute_classes();
  pool_reserve(16384);
  RUN(test_realloc_large_shrinks_in_place);
  RUN(test_realloc_in_place);
  RUN(test_realloc_small);
  RUN(test_colored_blocks);
  RUN(test_trim_releases);
  RUN(test_trim_inside_spans);
  RUN(test_large_cache_resident);
  RUN(test_zero_mode_large);
  RUN(test_large_cache_purged_calloc);
  RUN(test_large_aligned_reuse);
  RUN(test_calloc_untouched);
#ifndef HAK_API_PREFIX
  RUN(test_mallinfo2);
#endif
  RUN(test_size_class_bounds);
  RUN(test_class_padding);
  RUN(test_aligned_slab);
  RUN(test_held_grows);
  RUN(test_stash_grows);
  RUN(test_hardened_carving);
  RUN(test_hardened_quarantine);
  RUN(test_hardened_cache);
  RUN(test_hardened_canary_key);
  API(free)(pool);
  printf("test_internals [%s]: all passed\n", API_MODE);
  return 0;
}
