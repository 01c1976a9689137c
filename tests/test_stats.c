/* hak_stats_get, hak_stats_json and mallinfo2: the live figures are exact
 * at every moment no other thread allocates or frees, whoever allocated
 * and freed the blocks (remote frees, thread caches, exited threads' pages,
 * large blocks); the versioned struct fills no more than it is given; the
 * JSON text is cut as snprintf's is. tests/stats_check.sh checks the
 * formats (JSON schema, malloc_info's XML, HAKMEM_STATS_FILE).
 * Usage: test_stats [json-file xml-file]: with the two names, writes
 * hak_stats_json's and malloc_info's texts there too. */
#include "api.h"

#include <pthread.h>


static struct hak_stats base, now;

static void get(struct hak_stats *s) {
  memset(s, 0, sizeof *s);
  CHECK(hak_stats_get(s, sizeof *s) == 0, "hak_stats_get failed: %s", strerror(errno));
  CHECK(s->version == HAK_STATS_VERSION && s->size == sizeof *s, "version %u, size %llu", s->version, s->size);
  CHECK(s->nclasses > 0 && s->nclasses <= HAK_STATS_CLASSES, "nclasses %u", s->nclasses);
}

/* the live blocks beyond the baseline, in all and per class */
static long long delta_blocks(void) {
  get(&now);
  return (long long)now.live_blocks - (long long)base.live_blocks;
}

static void expect_delta(long long want, const char *when) {
  long long d = delta_blocks();
  CHECK(d == want, "%s: %lld live blocks beyond the baseline, want %lld", when, d, want);
  CHECK(now.live_blocks == now.small_live_blocks + now.large_live_blocks &&
            now.live_bytes == now.small_live_bytes + now.large_live_bytes,
        "%s: totals are not the sums of the tiers", when);
  unsigned long long blocks = 0, bytes = 0;
  for (unsigned i = 0; i < now.nclasses; i++) {
    blocks += now.classes[i].live_blocks;
    bytes += now.classes[i].live_bytes;
    CHECK(now.classes[i].live_bytes == now.classes[i].live_blocks * now.classes[i].block_size,
          "%s: class %u's bytes", when, i);
    if (i > 0) CHECK(now.classes[i].block_size > now.classes[i - 1].block_size, "classes out of order");
  }
  CHECK(blocks == now.small_live_blocks && bytes == now.small_live_bytes,
        "%s: classes sum to %llu blocks / %llu B, the totals say %llu / %llu", when, blocks, bytes,
        now.small_live_blocks, now.small_live_bytes);
}

/* One size at a time: exactly one class gains n blocks, of a size that
 * holds the request; freeing them takes it back. */
static void test_classes(void) {
  static const size_t sizes[] = {1, 8, 16, 24, 100, 128, 129, 1000, 1024, 4000, 9000, 40000, 65536, 70000,
                                 200000, 600000, 1000000};
  enum { N = 40 };
  void *p[N];
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    size_t sz = sizes[k];
    get(&base);
    for (int i = 0; i < N; i++) {
      p[i] = API(malloc)(sz);
      CHECK(p[i] != NULL, "malloc(%zu)", sz);
      memset(p[i], 1, sz);
    }
    get(&now);
    int gained = -1;
    for (unsigned i = 0; i < now.nclasses; i++) {
      long long d = (long long)now.classes[i].live_blocks - (long long)base.classes[i].live_blocks;
      if (d == 0) continue;
      CHECK(gained < 0 && d == N, "size %zu: class of %llu B gained %lld blocks (want one class, %d)", sz,
            now.classes[i].block_size, d, N);
      CHECK(now.classes[i].block_size >= sz, "size %zu counted in the class of %llu B", sz,
            now.classes[i].block_size);
      CHECK(now.classes[i].pages >= 1 && now.classes[i].page_bytes >= now.classes[i].block_size,
            "size %zu: class without pages", sz);
      gained = (int)i;
    }
    CHECK(gained >= 0, "size %zu: no class gained the %d blocks", sz, N);
    char when[64];
    snprintf(when, sizeof when, "size %zu, after the mallocs", sz);
    expect_delta(N, when);
    for (int i = 0; i < N; i += 2) API(free)(p[i]); /* the stash and the thread cache take some */
    snprintf(when, sizeof when, "size %zu, after half the frees", sz);
    expect_delta(N / 2, when);
    for (int i = 1; i < N; i += 2) API(free)(p[i]);
    snprintf(when, sizeof when, "size %zu, after the frees", sz);
    expect_delta(0, when);
  }
}

static void test_large(void) {
  get(&base);
  void *a = API(malloc)(2u << 20), *b = API(malloc)(5u << 20 | 123);
  CHECK(a && b, "large malloc");
  get(&now);
  CHECK(now.large_live_blocks == base.large_live_blocks + 2 &&
            now.large_live_bytes == base.large_live_bytes + (2u << 20) + (5u << 20 | 123),
        "large: %llu blocks of %llu B live, %llu / %llu before", now.large_live_blocks, now.large_live_bytes,
        base.large_live_blocks, base.large_live_bytes);
  CHECK(now.large_mapped_bytes >= now.large_live_bytes, "large mapped %llu < live %llu", now.large_mapped_bytes,
        now.large_live_bytes);
  CHECK(now.large_allocs == base.large_allocs + 2, "large_allocs");
  API(free)(a);
  API(free)(b);
  expect_delta(0, "after the large frees");
  CHECK(now.large_live_bytes == base.large_live_bytes && now.large_frees == base.large_frees + 2, "large frees");
}

/* ---- threads: each round, every thread frees random blocks of the
 * shared pool (any thread's) and allocates new ones; between rounds all
 * wait while the main thread compares the live count with the pool's. */
enum { THREADS = 4, POOL = 4096, ROUNDS = 12 };
static void *pool[POOL];
static pthread_barrier_t barrier;

static size_t random_size(uint64_t *rng) {
  uint64_t r = hkt_rand(rng);
  switch (r % 8) {
  case 0: return 1 + (r >> 8) % 64;
  case 1: case 2: case 3: return 1 + (r >> 8) % 1024;
  case 4: case 5: return 1 + (r >> 8) % 16384;
  case 6: return 1 + (r >> 8) % 300000;
  default: return (r >> 8) % 64 == 0 ? (1u << 20) + (r >> 16) % (3u << 20) : 1 + (r >> 8) % 2048;
  }
}

static void *worker(void *arg) {
  uintptr_t id = (uintptr_t)arg;
  uint64_t rng = 0x9e3779b97f4a7c15ull * (id + 1);
  pthread_barrier_wait(&barrier); /* the baseline */
  for (int r = 0; r < ROUNDS; r++) {
    /* a slice of the pool of its own this round, different every round:
     * blocks other threads allocated get freed here */
    size_t from = ((id + (unsigned)r) % THREADS) * (POOL / THREADS), to = from + POOL / THREADS;
    for (size_t i = from; i < to; i++) {
      uint64_t x = hkt_rand(&rng);
      if (pool[i] != NULL && x % 3 != 0) {
        API(free)(pool[i]);
        pool[i] = NULL;
      }
      if (pool[i] == NULL && x % 5 < 3) {
        size_t sz = random_size(&rng);
        pool[i] = API(malloc)(sz);
        CHECK(pool[i] != NULL, "malloc(%zu)", sz);
        *(volatile char *)pool[i] = 1;
      }
    }
    pthread_barrier_wait(&barrier); /* main counts */
    pthread_barrier_wait(&barrier); /* next round */
  }
  return NULL;
}

static void test_threads(void) {
  pthread_t t[THREADS];
  pthread_barrier_init(&barrier, NULL, THREADS + 1);
  for (uintptr_t i = 0; i < THREADS; i++) CHECK(pthread_create(&t[i], NULL, worker, (void *)i) == 0, "thread");
  get(&base); /* (the threads' own setup allocations are done: they wait) */
  pthread_barrier_wait(&barrier);
  for (int r = 0; r < ROUNDS; r++) {
    pthread_barrier_wait(&barrier);
    long long live = 0;
    for (int i = 0; i < POOL; i++) live += pool[i] != NULL;
    char when[64];
    snprintf(when, sizeof when, "threads, round %d", r);
    expect_delta(live, when);
    pthread_barrier_wait(&barrier);
  }
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  pthread_barrier_destroy(&barrier);
  /* the threads exited with blocks live: their pages are abandoned, the
   * blocks still count; this thread frees them */
  long long live = 0;
  for (int i = 0; i < POOL; i++) live += pool[i] != NULL;
  get(&now);
  long long d = (long long)now.live_blocks - (long long)base.live_blocks;
  /* (a thread's exit frees what the C library allocated for it: at most
   * its own setup blocks fewer than the baseline counted) */
  CHECK(d <= live && d >= live - 8 * THREADS, "after the threads exited: %lld live beyond the baseline, %lld in the pool",
        d, live);
  long long exit_freed = live - d;
  for (int i = 0; i < POOL; i++) {
    API(free)(pool[i]);
    pool[i] = NULL;
  }
  expect_delta(-exit_freed, "after freeing the exited threads' blocks");
  CHECK(now.threads_exited >= base.threads_exited + THREADS, "threads_exited %llu, was %llu", now.threads_exited,
        base.threads_exited);
}

/* Another thread's blocks freed here while it waits: they sit on its pages'
 * remote stacks (blocks above the thread cache's sizes) or in this
 * thread's cache until someone takes them back, and count as freed at
 * once. */
enum { OWNED = 256 };
static void *owned[OWNED];
static void *owner(void *arg) {
  for (int i = 0; i < OWNED; i++) {
    owned[i] = API(malloc)(i % 2 ? 100000 : 64 + (size_t)i);
    CHECK(owned[i] != NULL, "malloc");
  }
  pthread_barrier_wait(&barrier); /* allocated */
  pthread_barrier_wait(&barrier); /* freed and counted by main */
  return arg;
}

static void test_remote_pending(void) {
  pthread_t t;
  pthread_barrier_init(&barrier, NULL, 2);
  get(&base);
  CHECK(pthread_create(&t, NULL, owner, NULL) == 0, "thread");
  pthread_barrier_wait(&barrier);
  long long before = delta_blocks();
  CHECK(before >= OWNED && before <= OWNED + 8, "%lld live beyond the baseline with the owner's %d", before, OWNED);
  for (int i = 0; i < OWNED; i++) API(free)(owned[i]);
  expect_delta(before - OWNED, "the owner's blocks freed by another thread, the owner waiting");
  pthread_barrier_wait(&barrier);
  pthread_join(t, NULL);
  pthread_barrier_destroy(&barrier);
}

/* A struct of an older, shorter layout gets its own bytes only. */
static void test_versioning(void) {
  unsigned char buf[sizeof(struct hak_stats) + 64];
  memset(buf, 0xab, sizeof buf);
  CHECK(hak_stats_get((struct hak_stats *)(void *)buf, HAK_STATS_MIN_SIZE) == 0, "the smallest size refused");
  struct hak_stats *s = (struct hak_stats *)(void *)buf;
  CHECK(s->version == HAK_STATS_VERSION && s->size == HAK_STATS_MIN_SIZE && s->nclasses > 0,
        "the header: version %u size %llu nclasses %u", s->version, s->size, s->nclasses);
  for (size_t i = HAK_STATS_MIN_SIZE; i < sizeof buf; i++) CHECK(buf[i] == 0xab, "byte %zu written past the size", i);
  size_t part = offsetof(struct hak_stats, classes);
  memset(buf, 0xab, sizeof buf);
  CHECK(hak_stats_get(s, part) == 0 && s->size == part, "a struct without classes");
  for (size_t i = part; i < sizeof buf; i++) CHECK(buf[i] == 0xab, "byte %zu written past %zu", i, part);
  errno = 0;
  CHECK(hak_stats_get(s, HAK_STATS_MIN_SIZE - 1) == -1 && errno == EINVAL, "a size below the header accepted");
  errno = 0;
  CHECK(hak_stats_get(NULL, sizeof *s) == -1 && errno == EINVAL, "NULL accepted");
}

static void test_json(const char *path) {
  size_t len = hak_stats_json(NULL, 0);
  CHECK(len > 100, "hak_stats_json(NULL, 0) = %zu", len);
  char *buf = API(malloc)(2 * len + 256);
  CHECK(buf != NULL, "malloc");
  /* measured again with the buffer live: its class may have had no block
   * before (HAKMEM_PURGE_DELAY_MS=0 gives empty pages back at once). The
   * length of one text may differ from the next by the digits of the RSS
   * figures; the rest of the heap holds still here */
  len = hak_stats_json(NULL, 0);
  size_t n = hak_stats_json(buf, len + 64);
  CHECK(n < len + 64 && strlen(buf) == n, "a whole text: %zu returned, %zu written", n, strlen(buf));
  CHECK(buf[0] == '{' && buf[n - 1] == '}', "not one object: %.20s...%s", buf, buf + n - 1);
  CHECK(strstr(buf, "\"live_bytes\":") && strstr(buf, "\"classes\":[{\"block_size\":"), "fields missing: %.200s", buf);
  if (path != NULL) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "%s", path);
    fputs(buf, f);
    fclose(f);
  }
  char small[10];
  memset(small, 'x', sizeof small);
  size_t m = hak_stats_json(small, sizeof small);
  CHECK(m >= sizeof small && small[9] == 0 && strncmp(small, buf, 9) == 0, "cut text: %zu returned, '%.10s'", m, small);
  API(free)(buf);
}

#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
static void test_mallinfo(void) {
  get(&base);
  enum { N = 1000 };
  static void *p[N];
  for (int i = 0; i < N; i++) p[i] = API(malloc)(200);
  void *big = API(malloc)(3u << 20);
  struct mallinfo2 mi = API(mallinfo2)();
  get(&now);
  CHECK(mi.uordblks >= now.small_live_bytes + (3u << 20) && mi.uordblks == now.small_live_bytes + mi.hblkhd,
        "mallinfo2: uordblks %zu, small live %llu, hblkhd %zu", mi.uordblks, now.small_live_bytes, mi.hblkhd);
  CHECK(mi.arena == now.region_bytes && mi.hblks == now.large_live_blocks && mi.fordblks + mi.uordblks >= mi.arena,
        "mallinfo2: arena %zu hblks %zu fordblks %zu", mi.arena, mi.hblks, mi.fordblks);
  for (int i = 0; i < N; i++) API(free)(p[i]);
  API(free)(big);
}
#endif

static void *touch(void *arg) {
  void *p = API(malloc)(100);
  API(free)(p);
  return arg;
}

int main(int argc, char **argv) {
  /* hakmem's purge thread starts when a second thread first allocates (or
   * memory is first given back); the C library allocates for it (its
   * thread-local storage), so start it before any count is compared */
  pthread_t t;
  CHECK(pthread_create(&t, NULL, touch, NULL) == 0 && pthread_join(t, NULL) == 0, "thread");
  test_versioning();
  test_classes();
  test_large();
  test_remote_pending();
  test_threads();
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  test_mallinfo();
#endif
  test_json(argc > 2 ? argv[1] : NULL);
  if (argc > 2) {
    FILE *f = fopen(argv[2], "w");
    CHECK(f != NULL, "%s", argv[2]);
    errno = 0;
    CHECK(API(malloc_info)(1, f) == -1 && errno == EINVAL, "malloc_info with options 1");
    CHECK(API(malloc_info)(0, f) == 0, "malloc_info");
    fclose(f);
  }
  printf("test_stats: OK (%s)\n", API_MODE);
  return 0;
}
