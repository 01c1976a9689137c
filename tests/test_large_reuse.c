/* test_large_reuse: large blocks served from cached mappings of other sizes
 * (src/large.c). A freed mapping serves a smaller request whole, keeping its
 * tail beyond the block; a request no cached mapping holds grows one with
 * mremap. Either way the block must behave as a fresh one: its usable size
 * is its own (not the mapping's), realloc keeps its bytes, calloc reads as
 * zeros although the mapping held data, free takes it back; a burst of
 * more frees than the option's entries (HAKMEM_LARGE_CACHE_ENTRIES) is
 * cached whole when as many blocks were live; freed blocks stay resident
 * up to twice the live large bytes, and a shrunk block's tail up to once
 * them, for the purge delay; and a program that replaces
 * large blocks of varied sizes and then stops gets its memory back within
 * the purge delay.
 */
#include "api.h"

#include <sys/resource.h>
#include <time.h>

#define MiB ((size_t)1 << 20)
#define KiB ((size_t)1 << 10)

static int cache_on; /* the large cache may serve these blocks */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void check_usable(void *p, size_t n, const char *what) {
  size_t u = API(malloc_usable_size)(p);
  /* (pages larger than 4 KiB: the mapping's data is in whole ones) */
  size_t slack = 64 * KiB + (hkt_page() > 4 * KiB ? 2 * hkt_page() : 0);
  CHECK(u >= n && u <= n + slack, "%s: malloc(%zu): usable size %zu, not its own", what, n, u);
}

/* malloc(n) after a block of `first` bytes, written with `byte`, was freed */
static unsigned char *alloc_after(size_t first, int byte, size_t n) {
  unsigned char *a = (unsigned char *)API(malloc)(first);
  CHECK(a != NULL, "malloc(%zu) failed", first);
  memset(a, byte, first);
  API(free)(a);
  unsigned char *p = (unsigned char *)API(malloc)(n);
  CHECK(p != NULL, "malloc(%zu) failed", n);
  return p;
}

/* A block of 2 MiB from the mapping of a freed 16 MiB one: usable size of
 * its own; realloc grows it into the kept tail without moving, and past the
 * mapping (a move), its bytes intact throughout. */
static void test_smaller_from_bigger(void) {
  long hits = hkt_stat("large cache hits");
  size_t n = 2 * MiB + 5;
  unsigned char *p = alloc_after(16 * MiB, 0x77, n);
  if (cache_on) CHECK(hkt_stat("large cache hits") == hits + 1, "the cached 16 MiB mapping did not serve 2 MiB");
  check_usable(p, n, "from a bigger mapping");
  size_t u = API(malloc_usable_size)(p);
  hkt_fill(p, u, 1);
  unsigned char *q = (unsigned char *)API(realloc)(p, 12 * MiB);
  CHECK(q != NULL, "realloc(12 MiB) failed");
  if (cache_on) CHECK(q == p, "realloc into the mapping's kept tail moved the block");
  CHECK(hkt_verify(q, u, 1) == HKT_OK, "realloc to 12 MiB lost the block's bytes");
  check_usable(q, 12 * MiB, "grown in place");
  hkt_fill(q, 12 * MiB, 2);
  unsigned char *r = (unsigned char *)API(realloc)(q, 20 * MiB);
  CHECK(r != NULL, "realloc(20 MiB) failed");
  CHECK(hkt_verify(r, 12 * MiB, 2) == HKT_OK, "realloc to 20 MiB lost the block's bytes");
  check_usable(r, 20 * MiB, "grown past its mapping");
  API(free)(r);
  API(malloc_trim)(0);
}

/* A request larger than every cached mapping: one is grown (mremap), and
 * the block is whole, writable and of its own size. */
static void test_grown(void) {
  long remaps = hkt_stat("large mremap calls");
  size_t n = 9 * MiB + 123;
  unsigned char *b = alloc_after(2 * MiB, 0x55, n);
  if (cache_on) CHECK(hkt_stat("large mremap calls") == remaps + 1, "the cached 2 MiB mapping was not grown for 9 MiB");
  check_usable(b, n, "grown mapping");
  hkt_fill(b, n, 3);
  CHECK(hkt_verify(b, n, 3) == HKT_OK, "a grown mapping's block does not keep its bytes");
  API(free)(b);
  API(malloc_trim)(0);
}

static void check_zero(const unsigned char *p, size_t n, const char *what) {
  for (size_t i = 0; i < n; i += 512)
    CHECK(p[i] == 0 && p[i + 511] == 0, "%s: byte %zu is not zero", what, i);
}

/* calloc from a mapping that held data, smaller (reused whole) or larger
 * (grown): zeros. */
static void test_calloc(void) {
  unsigned char *big = (unsigned char *)API(malloc)(16 * MiB);
  CHECK(big != NULL, "malloc(16 MiB) failed");
  memset(big, 0xff, 16 * MiB);
  API(free)(big);
  unsigned char *z = (unsigned char *)API(calloc)(1, 3 * MiB);
  CHECK(z != NULL, "calloc(3 MiB) failed");
  check_zero(z, 3 * MiB, "calloc from a bigger dirty mapping");
  API(free)(z);
  API(malloc_trim)(0);
  unsigned char *small = (unsigned char *)API(malloc)(2 * MiB);
  CHECK(small != NULL, "malloc(2 MiB) failed");
  memset(small, 0xff, 2 * MiB);
  API(free)(small);
  z = (unsigned char *)API(calloc)(1, 10 * MiB);
  CHECK(z != NULL, "calloc(10 MiB) failed");
  check_zero(z, 10 * MiB, "calloc from a grown dirty mapping");
  API(free)(z);
  API(malloc_trim)(0);
}

/* 1,000 live blocks of 2 MiB (twice the option's default entries), all
 * freed, then allocated again: every one comes from the cache, which holds
 * twice as many entries as blocks were recently live, and none is unmapped.
 * Checked when the cache is on with its default entries and the frees and
 * mallocs take under half the purge delay (an entry older than it may be
 * unmapped). */
static void test_burst(void) {
  enum { N = 1000 };
  static unsigned char *p[N];
  size_t n = 2 * MiB;
  for (int i = 0; i < N; i++) {
    p[i] = (unsigned char *)API(malloc)(n);
    CHECK(p[i] != NULL, "malloc(2 MiB) number %d failed", i);
    p[i][0] = (unsigned char)i;
    p[i][n - 1] = (unsigned char)(i >> 8);
  }
  long hits = hkt_stat("large cache hits"), unmaps = hkt_stat("large unmaps");
  double t0 = now_s();
  for (int i = 0; i < N; i++) {
    CHECK(p[i][0] == (unsigned char)i && p[i][n - 1] == (unsigned char)(i >> 8), "block %d changed", i);
    API(free)(p[i]);
  }
  for (int i = 0; i < N; i++) {
    p[i] = (unsigned char *)API(malloc)(n);
    CHECK(p[i] != NULL, "malloc(2 MiB) number %d failed (again)", i);
    p[i][n - 1] = 1;
  }
  double took = now_s() - t0;
  long got = hkt_stat("large cache hits") - hits, gone = hkt_stat("large unmaps") - unmaps;
  const char *d = getenv("HAKMEM_PURGE_DELAY_MS"), *e = getenv("HAKMEM_LARGE_CACHE_ENTRIES");
  double delay = (d ? atof(d) : 100.0) / 1000.0;
  int checked = cache_on && e == NULL && took < delay / 2;
  printf(" [%ld of %d from the cache, %ld unmapped, in %.0f ms%s]", got, N, gone, took * 1000,
         checked ? "" : "; not checked");
  if (checked) CHECK(got == N && gone == 0, "a burst of %d frees: %ld reused, %ld unmapped", N, got, gone);
  for (int i = 0; i < N; i++) API(free)(p[i]);
  API(malloc_trim)(0);
}

/* 8 live blocks of 2 MiB, and 12 more written whole and freed: the cache
 * keeps all 12 resident (twice the live large bytes, src/large.c
 * cache_enforce_budget_locked), also past CACHE_HOT_MS and the next free,
 * so allocated again and written whole they fault in (almost) no page (a
 * bound of the live bytes would purge a third of them). Checked with the
 * cache on and taking under half the purge delay. */
static void test_resident_budget(void) {
  enum { LIVE = 8, FREED = 12 };
  size_t n = 2 * MiB;
  unsigned char *live[LIVE], *p[FREED];
  for (int i = 0; i < LIVE; i++) {
    live[i] = (unsigned char *)API(malloc)(n);
    CHECK(live[i] != NULL, "malloc(2 MiB) failed");
    memset(live[i], i + 1, n);
  }
  double t0 = now_s();
  for (int i = 0; i < FREED; i++) {
    p[i] = (unsigned char *)API(malloc)(n);
    CHECK(p[i] != NULL, "malloc(2 MiB) failed");
    memset(p[i], 0x5a, n);
  }
  for (int i = 0; i < FREED; i++) API(free)(p[i]);
  usleep(20000); /* past CACHE_HOT_MS */
  unsigned char *q = (unsigned char *)API(malloc)(n + 4096); /* a larger one, served from the cache or mapped */
  CHECK(q != NULL, "malloc failed");
  API(free)(q); /* enforces the budget */
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  long before = ru.ru_minflt;
  for (int i = 0; i < FREED; i++) {
    p[i] = (unsigned char *)API(malloc)(n);
    CHECK(p[i] != NULL, "malloc(2 MiB) failed (again)");
    memset(p[i], 0xa5, n);
  }
  getrusage(RUSAGE_SELF, &ru);
  long faults = ru.ru_minflt - before;
  double took = now_s() - t0;
  const char *d = getenv("HAKMEM_PURGE_DELAY_MS");
  double delay = (d ? atof(d) : 100.0) / 1000.0;
  int checked = hkt_large_cache(32 * MiB) && took < delay / 2;
  printf(" [%ld page faults writing %d reused blocks of 2 MiB, %.0f ms%s]", faults, FREED, took * 1000,
         checked ? "" : "; not checked");
  if (checked) CHECK(faults < 1024, "%ld page faults in %d blocks of 2 MiB reused from the cache", faults, FREED);
  for (int i = 0; i < FREED; i++) API(free)(p[i]);
  for (int i = 0; i < LIVE; i++) {
    CHECK(live[i][0] == i + 1 && live[i][n - 1] == i + 1, "live block %d changed", i);
    API(free)(live[i]);
  }
  API(malloc_trim)(0);
}

/* Two live blocks of 1-16 MiB, one replaced at random, every page written
 * (bench/large_varied); then all freed: RSS is back near where it started
 * within the purge delay (twice it, and scheduling slack). */
static void test_varied_then_stop(void) {
  size_t base = hkt_rss_bytes();
  uint64_t s = 7;
  unsigned char *p[2] = {NULL, NULL};
  size_t n[2] = {0, 0};
  for (int i = 0; i < 400; i++) {
    int k = (int)(hkt_rand(&s) % 2);
    if (p[k]) {
      CHECK(p[k][0] == (unsigned char)n[k] && p[k][n[k] - 1] == (unsigned char)(n[k] >> 8),
            "block %p of %zu bytes changed", (void *)p[k], n[k]);
      API(free)(p[k]);
    }
    n[k] = MiB + hkt_rand(&s) % (15 * MiB);
    p[k] = (unsigned char *)API(malloc)(n[k]);
    CHECK(p[k] != NULL, "malloc(%zu) failed", n[k]);
    check_usable(p[k], n[k], "varied");
    for (size_t o = 0; o < n[k]; o += 4096) p[k][o] = 1;
    p[k][0] = (unsigned char)n[k];
    p[k][n[k] - 1] = (unsigned char)(n[k] >> 8);
  }
  size_t peak = hkt_rss_bytes();
  API(free)(p[0]);
  API(free)(p[1]);
  const char *d = getenv("HAKMEM_PURGE_DELAY_MS");
  double delay = (d ? atof(d) : 100.0) / 1000.0, t0 = now_s(), waited = 0;
  size_t after = hkt_rss_bytes();
  while (hkt_timed_purges() && after > base + 2 * MiB && (waited = now_s() - t0) < 2 * delay + 0.25) {
    usleep(5000);
    after = hkt_rss_bytes();
  }
  printf(" [RSS %.1f MiB at the start, %.1f with 2 blocks live, %.1f %.0f ms after freeing them%s]",
         (double)base / (double)MiB, (double)peak / (double)MiB, (double)after / (double)MiB, waited * 1000,
         hkt_timed_purges() ? "" : "; no timed purges: not checked");
  CHECK(!hkt_timed_purges() || after <= base + 2 * MiB, "freed large blocks still resident %.0f ms later: %.1f MiB",
        waited * 1000, (double)after / (double)MiB);
}

/* A block of 3 MiB written whole and shrunk by realloc to 600 KiB keeps
 * its mapping's tail while the large tier holds less than its budget
 * (the bytes recently live, at least 8 MiB): freed, its mapping
 * serves a block of 3 MiB again with no mremap and (almost) no page fault.
 * Checked with the cache on and within the purge delay. */
static void test_shrunk_keeps_tail(void) {
  size_t n = 3 * MiB;
  double t0 = now_s();
  unsigned char *p = (unsigned char *)API(malloc)(n);
  CHECK(p != NULL, "malloc(3 MiB) failed");
  memset(p, 0x3c, n);
  unsigned char *q = (unsigned char *)API(realloc)(p, 600 * KiB);
  CHECK(q == p, "realloc(3 MiB -> 600 KiB) moved the block");
  CHECK(q[0] == 0x3c && q[600 * KiB - 1] == 0x3c, "realloc(3 MiB -> 600 KiB) lost data");
  API(free)(q);
  long remaps = hkt_stat("large mremap calls");
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  long before = ru.ru_minflt;
  unsigned char *r = (unsigned char *)API(malloc)(n);
  CHECK(r != NULL, "malloc(3 MiB) failed");
  memset(r, 0xc3, n);
  getrusage(RUSAGE_SELF, &ru);
  long faults = ru.ru_minflt - before;
  double took = now_s() - t0;
  const char *d = getenv("HAKMEM_PURGE_DELAY_MS");
  double delay = (d ? atof(d) : 100.0) / 1000.0;
  int checked = cache_on && took < delay / 2;
  printf(" [%ld page faults writing 3 MiB after the shrunk block was freed, %.0f ms%s]", faults, took * 1000,
         checked ? "" : "; not checked");
  if (checked) {
    CHECK(hkt_stat("large mremap calls") == remaps, "the shrunk block's mapping was grown again (mremap)");
    CHECK(faults < 64, "%ld page faults writing a block of 3 MiB in the shrunk block's mapping", faults);
  }
  API(free)(r);
}

/* A block of 16 MiB written whole and shrunk to 1 MiB keeps its tail for
 * a while (test_shrunk_keeps_tail), but not for good: within the purge
 * delay (twice it, and scheduling slack) the tail's 15 MiB are no longer
 * resident although the block lives on. The same for a block of 2 MiB
 * given a cached mapping of 16 MiB whole. */
static void test_shrunk_tail_goes_back(void) {
  /* (hardened mode's realloc leaves a shrunk block's guard page where it
   * was, and the mapping whole, until the block is freed: not listed) */
  if (hkt_hardened()) return;
  size_t n = 16 * MiB, keep = 1 * MiB;
  unsigned char *p = (unsigned char *)API(malloc)(n);
  CHECK(p != NULL, "malloc(16 MiB) failed");
  memset(p, 0x4d, n);
  size_t full = hkt_rss_bytes();
  unsigned char *q = (unsigned char *)API(realloc)(p, keep);
  CHECK(q == p, "realloc(16 MiB -> 1 MiB) moved the block");
  const char *d = getenv("HAKMEM_PURGE_DELAY_MS");
  double delay = (d ? atof(d) : 100.0) / 1000.0, t0 = now_s(), waited = 0;
  size_t after = hkt_rss_bytes();
  while (hkt_timed_purges() && after + 12 * MiB > full && (waited = now_s() - t0) < 2 * delay + 0.25) {
    usleep(5000);
    after = hkt_rss_bytes();
  }
  printf(" [RSS %.1f MiB with the 16 MiB block, %.1f %.0f ms after it shrank to 1 MiB%s]", (double)full / (double)MiB,
         (double)after / (double)MiB, waited * 1000, hkt_timed_purges() ? "" : "; no timed purges: not checked");
  CHECK(!hkt_timed_purges() || after + 12 * MiB <= full, "a shrunk block's tail still resident %.0f ms later",
        waited * 1000);
  CHECK(q[0] == 0x4d && q[keep - 1] == 0x4d, "the shrunk block lost its bytes");
  API(free)(q);
  /* the same for a cached mapping of 16 MiB reused whole for 2 MiB */
  keep = 2 * MiB;
  p = (unsigned char *)API(malloc)(n);
  CHECK(p != NULL, "malloc(16 MiB) failed");
  memset(p, 0x4e, n);
  API(free)(p);
  q = (unsigned char *)API(malloc)(keep);
  CHECK(q != NULL, "malloc(2 MiB) failed");
  memset(q, 0x4f, keep);
  t0 = now_s();
  waited = 0;
  after = hkt_rss_bytes();
  printf(" [reused whole: %.1f MiB at once,", (double)after / (double)MiB);
  while (hkt_timed_purges() && after + 11 * MiB > full && (waited = now_s() - t0) < 2 * delay + 0.25) {
    usleep(5000);
    after = hkt_rss_bytes();
  }
  printf(" %.1f MiB %.0f ms later]", (double)after / (double)MiB, waited * 1000);
  CHECK(!hkt_timed_purges() || after + 11 * MiB <= full, "a reused mapping's tail still resident %.0f ms later",
        waited * 1000);
  API(free)(q);
}

#define RUN(t)                     \
  do {                             \
    printf("test_large_reuse: %s ...", #t); \
    fflush(stdout);                \
    t();                           \
    printf(" ok\n");               \
  } while (0)

int main(void) {
  cache_on = hkt_large_cache(16 * MiB);
  RUN(test_smaller_from_bigger);
  RUN(test_grown);
  RUN(test_calloc);
  RUN(test_burst);
  RUN(test_resident_budget);
  RUN(test_varied_then_stop);
  RUN(test_shrunk_keeps_tail);
  RUN(test_shrunk_tail_goes_back);
  printf("test_large_reuse: all passed\n");
  return 0;
}
