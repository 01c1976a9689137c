/* test_stress: many threads allocating and freeing through a shared array of
 * slots, so most blocks are freed by a thread other than the one that
 * allocated them (remote frees). Every block carries a stamp that is checked
 * before it is freed or reallocated.
 *
 * usage: test_stress [threads [iterations-per-thread]]   (default 8 300000)
 */
#define _GNU_SOURCE
#include "api.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NSLOTS 4096
#define MAX_THREADS 256
#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* Block layout: word 0 = size | flags << 40 | (allocating thread id << 48);
 * then a stamp derived from (key, index) with key = f(address, size). */
#define SIZE_MASK (((uint64_t)1 << 40) - 1)
#define FLAG_ALIGNED ((uint64_t)1 << 40) /* from aligned_alloc: no free_sized */

#ifdef HAK_API_PREFIX
#define HAVE_FREE_SIZED 1
#else
#define HAVE_FREE_SIZED (free_sized != NULL) /* weak: checked by test_api */
#endif

static _Atomic(uintptr_t) slots[NSLOTS];
static pthread_barrier_t start_barrier;
static long iterations = 300000;
static int nthreads = 8;

typedef struct counters {
  uint64_t allocs, frees, cross_frees, reallocs, large;
} counters;
static counters thread_counts[MAX_THREADS];

static inline uint64_t block_key(uintptr_t addr, size_t size) {
  uint64_t x = (uint64_t)addr * 0x9E3779B97F4A7C15ull ^ (uint64_t)size * 0xC2B2AE3D27D4EB4Full;
  x ^= x >> 31;
  return x | 1;
}

static inline uint64_t stamp_word(uint64_t key, size_t i) { return key ^ ((uint64_t)i * 0xD6E8FEB86659FD93ull); }
static inline unsigned char stamp_byte(uint64_t key, size_t i) { return (unsigned char)((key >> ((i & 7) * 8)) ^ i); }

static void stamp(unsigned char *p, size_t size, unsigned tid, uint64_t flags) {
  uint64_t hdr = (uint64_t)size | flags | ((uint64_t)tid << 48);
  memcpy(p, &hdr, 8);
  uint64_t key = block_key((uintptr_t)p, size);
  size_t words = size / 8;
  uint64_t *w = (uint64_t *)(void *)p; /* blocks are 8-aligned */
  for (size_t i = 1; i < words; i++) w[i] = stamp_word(key, i);
  for (size_t i = words * 8; i < size; i++) p[i] = stamp_byte(key, i);
}

/* Checks the stamp of the first `upto` bytes of a block stamped at address
 * `orig` (differs from p after a realloc moved it). Returns the size. */
static size_t verify_stamp(const unsigned char *p, uintptr_t orig, size_t upto_or_all, unsigned *tid_out,
                           uint64_t *flags_out) {
  uint64_t hdr;
  memcpy(&hdr, p, 8);
  size_t size = (size_t)(hdr & SIZE_MASK);
  unsigned tid = (unsigned)(hdr >> 48);
  CHECK(size >= 8 && size <= 4 * MiB && tid <= MAX_THREADS,
        "block %p: corrupted header 0x%016llx (size %zu, thread %u)", (const void *)p, (unsigned long long)hdr, size,
        tid);
  size_t upto = upto_or_all < size ? upto_or_all : size;
  uint64_t key = block_key(orig, size);
  const uint64_t *w = (const uint64_t *)(const void *)p;
  size_t words = upto / 8;
  for (size_t i = 1; i < words; i++)
    CHECK(w[i] == stamp_word(key, i), "block %p (size %zu, from thread %u): word %zu corrupted: 0x%016llx", (const void *)p,
          size, tid, i, (unsigned long long)w[i]);
  for (size_t i = words * 8 < 8 ? 8 : words * 8; i < upto; i++) {
    /* bytes past the last whole word of the *original* size */
    unsigned char want = (i < size / 8 * 8) ? (unsigned char)(stamp_word(key, i / 8) >> ((i & 7) * 8))
                                              : stamp_byte(key, i);
    CHECK(p[i] == want, "block %p (size %zu, from thread %u): byte %zu corrupted", (const void *)p, size, tid, i);
  }
  if (tid_out) *tid_out = tid;
  if (flags_out) *flags_out = hdr & ~SIZE_MASK & (((uint64_t)1 << 48) - 1);
  return size;
}

static size_t random_size(uint64_t *rng) {
  uint64_t r = hkt_rand(rng);
  unsigned pick = (unsigned)(r % 10000);
  r >>= 16;
  if (pick < 9400) return 8 + (size_t)(r % 1017);                   /* 8 .. 1024 */
  if (pick < 9985) return KiB + (size_t)(r % (63 * KiB + 1));         /* 1 .. 64 KiB */
  return 100 * KiB + (size_t)(r % (2 * MiB - 100 * KiB + 1));          /* 100 KiB .. 2 MiB */
}

static void release(unsigned char *p, unsigned me, counters *c) {
  unsigned tid;
  uint64_t flags;
  size_t size = verify_stamp(p, (uintptr_t)p, SIZE_MAX, &tid, &flags);
  c->frees++;
  if (tid != me) c->cross_frees++;
  errno = 4242; /* free must not change errno, remote frees included */
  if ((c->frees & 7) == 0 && !(flags & FLAG_ALIGNED) && HAVE_FREE_SIZED) {
    API(free_sized)(p, size);
  } else {
    API(free)(p);
  }
  CHECK(errno == 4242, "free() of a %zu-byte block (allocated by thread %u, freed by %u) changed errno to %d", size,
        tid, me, errno);
}

static unsigned char *fresh_block(uint64_t *rng, unsigned me, counters *c) {
  size_t size = random_size(rng);
  unsigned char *p;
  uint64_t flags = 0;
  unsigned kind = (unsigned)(hkt_rand(rng) % 64);
  if (kind == 0) {
    p = (unsigned char *)API(calloc)(1, size);
    CHECK(p != NULL, "calloc(1, %zu) failed", size);
    for (size_t i = 0; i < size; i++) CHECK(p[i] == 0, "calloc(1, %zu) = %p: byte %zu not zero", size, (void *)p, i);
  } else if (kind == 1) {
    size_t align = (size_t)16 << (hkt_rand(rng) % 9); /* 16 .. 4096 */
    p = (unsigned char *)API(aligned_alloc)(align, size);
    CHECK(p != NULL, "aligned_alloc(%zu, %zu) failed", align, size);
    CHECK((uintptr_t)p % align == 0, "aligned_alloc(%zu, %zu) = %p misaligned", align, size, (void *)p);
    flags = FLAG_ALIGNED;
  } else {
    p = (unsigned char *)API(malloc)(size);
    CHECK(p != NULL, "malloc(%zu) failed", size);
  }
  CHECK((uintptr_t)p % 8 == 0, "block %p not 8-aligned", (void *)p);
  CHECK(API(malloc_usable_size)(p) >= size, "usable size %zu < %zu", API(malloc_usable_size)(p), size);
  stamp(p, size, me, flags);
  c->allocs++;
  if (size >= 100 * KiB) c->large++;
  return p;
}

static void *worker(void *arg) {
  unsigned me = (unsigned)(uintptr_t)arg; /* 1..nthreads */
  counters *c = &thread_counts[me];
  uint64_t rng = 0x1234567ull * me + (uint64_t)time(NULL);
  if (rng == 0) rng = 1;
  pthread_barrier_wait(&start_barrier);
  for (long it = 0; it < iterations; it++) {
    size_t s = (size_t)(hkt_rand(&rng) % NSLOTS);
    unsigned char *p = (unsigned char *)atomic_exchange(&slots[s], (uintptr_t)0);
    if (p != NULL) {
      if (hkt_rand(&rng) % 16 == 0) {
        /* realloc a block (usually someone else's) and put it back */
        uint64_t hdr;
        memcpy(&hdr, p, 8);
        size_t old = verify_stamp(p, (uintptr_t)p, SIZE_MAX, NULL, NULL);
        size_t nsize = random_size(&rng);
        unsigned char *q = (unsigned char *)API(realloc)(p, nsize);
        CHECK(q != NULL, "realloc(%p, %zu -> %zu) failed", (void *)p, old, nsize);
        CHECK(API(malloc_usable_size)(q) >= nsize, "realloc: usable %zu < %zu", API(malloc_usable_size)(q), nsize);
        uint64_t hdr2;
        memcpy(&hdr2, q, 8);
        CHECK(hdr2 == hdr, "realloc(%zu -> %zu) did not preserve the first word", old, nsize);
        verify_stamp(q, (uintptr_t)p, nsize, NULL, NULL); /* the kept prefix */
        stamp(q, nsize, me, 0);
        c->reallocs++;
        p = q;
      } else {
        release(p, me, c);
        continue;
      }
    } else {
      p = fresh_block(&rng, me, c);
    }
    unsigned char *old = (unsigned char *)atomic_exchange(&slots[s], (uintptr_t)p);
    if (old != NULL) release(old, me, c);
  }
  return NULL;
}

/* Idle owners: each producer fills pages with stamped blocks, hands them to
 * two consumers and waits (idle, so the consumers' frees give its emptied
 * pages back: src/remote.c), then allocates again into those pages. Two
 * consumers per producer push onto the same pages at once. */
#define IDLE_PRODUCERS 3
#define IDLE_BLOCKS 3000
#define IDLE_ROUNDS 4
typedef struct {
  unsigned char *blocks[IDLE_BLOCKS];
  size_t sizes[IDLE_BLOCKS];
  pthread_barrier_t filled, freed;
} idle_batch;
static idle_batch idle_batches[IDLE_PRODUCERS];

static size_t idle_size(int i, int round) { return 16 + (size_t)((i * 37 + round * 101) % 1000); }

static void idle_fill(idle_batch *b, int round) {
  for (int i = 0; i < IDLE_BLOCKS; i++) {
    size_t n = idle_size(i, round);
    unsigned char *p = (unsigned char *)API(malloc)(n);
    CHECK(p != NULL, "idle producer: malloc(%zu) failed", n);
    for (size_t k = 0; k < n; k++) p[k] = (unsigned char)(i + k + (size_t)round);
    b->blocks[i] = p;
    b->sizes[i] = n;
  }
}

static void idle_check_free(idle_batch *b, int round, int from, int step) {
  for (int i = from; i < IDLE_BLOCKS; i += step) {
    unsigned char *p = b->blocks[i];
    for (size_t k = 0; k < b->sizes[i]; k++)
      CHECK(p[k] == (unsigned char)(i + k + (size_t)round), "idle round %d: block %d corrupted at byte %zu", round, i, k);
    API(free)(p);
  }
}

static void *idle_producer(void *arg) {
  idle_batch *b = &idle_batches[(uintptr_t)arg];
  for (int round = 0; round < IDLE_ROUNDS; round++) {
    idle_fill(b, round);
    pthread_barrier_wait(&b->filled);
    struct timespec d = {0, 20 * 1000 * 1000}; /* idle while the consumers free */
    nanosleep(&d, NULL);
    pthread_barrier_wait(&b->freed);
  }
  /* the pages work after all that: one more round, freed here */
  idle_fill(b, IDLE_ROUNDS);
  idle_check_free(b, IDLE_ROUNDS, 0, 1);
  return NULL;
}

static void *idle_consumer(void *arg) {
  uintptr_t id = (uintptr_t)arg;
  idle_batch *b = &idle_batches[id / 2];
  for (int round = 0; round < IDLE_ROUNDS; round++) {
    pthread_barrier_wait(&b->filled);
    struct timespec d = {0, 12 * 1000 * 1000}; /* past the producer's idle limit */
    nanosleep(&d, NULL);
    idle_check_free(b, round, (int)(id % 2), 2);
    API(malloc_trim)(0); /* this consumer's cache of the producer's blocks goes back too */
    pthread_barrier_wait(&b->freed);
  }
  return NULL;
}

static void test_idle_owners(void) {
  pthread_t th[IDLE_PRODUCERS * 3];
  int n = 0;
  for (int i = 0; i < IDLE_PRODUCERS; i++) {
    CHECK(pthread_barrier_init(&idle_batches[i].filled, NULL, 3) == 0, "pthread_barrier_init failed");
    CHECK(pthread_barrier_init(&idle_batches[i].freed, NULL, 3) == 0, "pthread_barrier_init failed");
  }
  for (int i = 0; i < IDLE_PRODUCERS; i++) {
    CHECK(pthread_create(&th[n++], NULL, idle_producer, (void *)(uintptr_t)i) == 0, "pthread_create failed");
    CHECK(pthread_create(&th[n++], NULL, idle_consumer, (void *)(uintptr_t)(2 * i)) == 0, "pthread_create failed");
    CHECK(pthread_create(&th[n++], NULL, idle_consumer, (void *)(uintptr_t)(2 * i + 1)) == 0, "pthread_create failed");
  }
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
  printf("idle owners: %d producers x %d rounds of %d blocks freed by two consumers each: contents intact\n",
         IDLE_PRODUCERS, IDLE_ROUNDS, IDLE_BLOCKS);
}

/* Once a thread's remote frees have filled a class's list (cache mode,
 * src/remote.c), the blocks of another thread's page freed here are this
 * thread's next blocks of the class, before the free blocks of its own
 * current page: last freed, first reused, while they are hot in this
 * core's cache. Not in hardened mode or with HAKMEM_THREAD_STATS, which
 * keep no such cache; nor for
 * the blocks of an owner idle by the freer's clock (next test), so the
 * owner here is a thread whose heap is younger than the freer's: with the
 * main thread as the owner, whose heap's clock had last moved during
 * earlier tests, the check failed about one run in ten under `ctest -j2`.
 * The class's list holds 78 blocks of 208 bytes: the freer frees 100. */
#define REUSE_BLOCKS 100
#define REUSE_FIRST 32 /* the mallocs that must reuse the last blocks freed */
#define REUSE_SIZE 200
static unsigned char *reuse_blocks[REUSE_BLOCKS];
static pthread_barrier_t reuse_ready, reuse_done;
static void *reuse_freer(void *arg) {
  (void)arg;
  /* (with the heap profiler on, a sampled malloc takes its block elsewhere) */
  const char *profile = getenv("HAKMEM_PROFILE");
  bool profiling = profile != NULL && strcmp(profile, "0") != 0;
  unsigned char *own = (unsigned char *)API(malloc)(REUSE_SIZE); /* a current page with free blocks */
  CHECK(own != NULL, "freer: malloc failed");
  pthread_barrier_wait(&reuse_ready); /* the owner's heap is made after this one's */
  pthread_barrier_wait(&reuse_ready); /* the owner's blocks are there */
  for (int i = 0; i < REUSE_BLOCKS; i++) API(free)(reuse_blocks[i]);
  for (int i = REUSE_BLOCKS - 1; i >= 0; i--) {
    unsigned char *p = (unsigned char *)API(malloc)(REUSE_SIZE);
    CHECK(p != NULL, "freer: malloc failed");
    CHECK(i < REUSE_BLOCKS - REUSE_FIRST || p == reuse_blocks[i] || profiling,
          "remote-freed block %d not reused first: got %p, freed %p", i, (void *)p, (void *)reuse_blocks[i]);
    memset(p, 0x3c, REUSE_SIZE);
    reuse_blocks[i] = p;
  }
  API(free)(own);
  pthread_barrier_wait(&reuse_done);
  return NULL;
}

static void *reuse_owner(void *arg) {
  (void)arg;
  for (int i = 0; i < REUSE_BLOCKS; i++) {
    reuse_blocks[i] = (unsigned char *)API(malloc)(REUSE_SIZE);
    CHECK(reuse_blocks[i] != NULL, "malloc failed");
    memset(reuse_blocks[i], 0x5a, REUSE_SIZE);
  }
  pthread_barrier_wait(&reuse_ready);
  pthread_barrier_wait(&reuse_done); /* alive while the freer works */
  for (int i = 0; i < REUSE_BLOCKS; i++) {
    for (int k = 0; k < REUSE_SIZE; k++)
      CHECK(reuse_blocks[i][k] == 0x3c, "block %d byte %d: %#x", i, k, reuse_blocks[i][k]);
    API(free)(reuse_blocks[i]); /* blocks of its own pages, freed at home */
  }
  return NULL;
}

static bool test_remote_reuse(void) {
  unsigned char *probe = (unsigned char *)API(malloc)(REUSE_SIZE + 1);
  CHECK(probe != NULL, "malloc failed");
  bool hardened = API(malloc_usable_size)(probe) == REUSE_SIZE + 1; /* docs/SAFETY.md */
  API(free)(probe);
  if (hardened) {
    printf("remote reuse: hardened mode, no cache of remote-freed blocks\n");
    return true;
  }
  const char *exact = getenv("HAKMEM_THREAD_STATS"); /* (docs/STATS.md: no such cache either) */
  if (exact != NULL && strcmp(exact, "0") != 0) {
    printf("remote reuse: HAKMEM_THREAD_STATS, no cache of remote-freed blocks\n");
    return false;
  }
  CHECK(pthread_barrier_init(&reuse_ready, NULL, 2) == 0 && pthread_barrier_init(&reuse_done, NULL, 2) == 0,
        "pthread_barrier_init failed");
  pthread_t freer, owner;
  CHECK(pthread_create(&freer, NULL, reuse_freer, NULL) == 0, "pthread_create failed");
  pthread_barrier_wait(&reuse_ready); /* the freer has its heap */
  CHECK(pthread_create(&owner, NULL, reuse_owner, NULL) == 0, "pthread_create failed");
  pthread_join(owner, NULL);
  pthread_join(freer, NULL);
  pthread_barrier_destroy(&reuse_ready);
  pthread_barrier_destroy(&reuse_done);
  printf("remote reuse: of %d blocks freed by another thread, the last %d were its next %d mallocs, last freed "
         "first\n",
         REUSE_BLOCKS, REUSE_FIRST, REUSE_FIRST);
  return false;
}

/* ...but not the blocks of an owner that has stopped allocating (here the
 * main thread, waiting in pthread_join): reused by the freer, they would go
 * round its cache forever, every free of them a remote free. Once the owner
 * has been idle for a while (src/remote.c, owner_idle), they go back to its
 * pages, so after that a loop that replaces them ends up with none. */
#define IDLE_SLOTS 256
static unsigned char *idle_owner_blocks[IDLE_SLOTS];
static size_t idle_owner_left;
static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}
static void *replacer(void *arg) {
  (void)arg;
  unsigned char *slot[IDLE_SLOTS];
  memcpy(slot, idle_owner_blocks, sizeof slot);
  double t0 = now_s();
  for (long sweep = 0; sweep < 2 || now_s() - t0 < 0.06; sweep++)
    for (int i = 0; i < IDLE_SLOTS; i++) {
      API(free)(slot[i]);
      slot[i] = (unsigned char *)API(malloc)(REUSE_SIZE);
      CHECK(slot[i] != NULL, "replacer: malloc failed");
      slot[i][0] = (unsigned char)i;
    }
  for (int sweep = 0; sweep < 2; sweep++) /* all after the owner counts as idle */
    for (int i = 0; i < IDLE_SLOTS; i++) {
      API(free)(slot[i]);
      slot[i] = (unsigned char *)API(malloc)(REUSE_SIZE);
      CHECK(slot[i] != NULL, "replacer: malloc failed");
    }
  for (int i = 0; i < IDLE_SLOTS; i++)
    for (int k = 0; k < IDLE_SLOTS; k++)
      if (slot[i] == idle_owner_blocks[k]) idle_owner_left++;
  for (int i = 0; i < IDLE_SLOTS; i++) API(free)(slot[i]);
  return NULL;
}

static void test_idle_owner_blocks_go_back(bool hardened) {
  if (hardened) return;
  for (int i = 0; i < IDLE_SLOTS; i++) {
    idle_owner_blocks[i] = (unsigned char *)API(malloc)(REUSE_SIZE);
    CHECK(idle_owner_blocks[i] != NULL, "malloc failed");
  }
  pthread_t t;
  CHECK(pthread_create(&t, NULL, replacer, NULL) == 0, "pthread_create failed");
  pthread_join(t, NULL);
  printf("idle owner: %zu of its %d blocks still in use by the replacing thread after 60 ms\n", idle_owner_left,
         IDLE_SLOTS);
  CHECK(idle_owner_left == 0, "%zu blocks of an idle owner still go round another thread's cache", idle_owner_left);
}

/* The statistics read while the workers run: the walks read other threads'
 * pages and heaps without their owners' knowledge (docs/STATS.md), which
 * must be safe whatever figures they get. Not under ThreadSanitizer: the
 * owners write those counts with plain stores on their fast paths, and the
 * walks' atomic loads of them are races by its rules, by design. */
static atomic_bool workers_done;
static char reader_json[64 << 10];
static void *stats_reader(void *arg) {
  (void)arg;
  unsigned long reads = 0;
  while (!atomic_load(&workers_done)) {
    struct hak_thread_stats t;
    CHECK(hak_stats_json(reader_json, sizeof reader_json) < sizeof reader_json, "hak_stats_json");
    CHECK(hak_thread_stats(0, &t, sizeof t) == 0 && t.live_blocks == 0, "hak_thread_stats");
    reads++;
    struct timespec pause = {0, 2000000};
    nanosleep(&pause, NULL);
  }
  return (void *)(uintptr_t)reads;
}

int main(int argc, char **argv) {
  if (argc > 1) nthreads = atoi(argv[1]);
  if (argc > 2) iterations = atol(argv[2]);
  if (nthreads < 2 || nthreads >= MAX_THREADS || iterations < 1) {
    fprintf(stderr, "usage: %s [threads 2..%d [iterations]]\n", argv[0], MAX_THREADS - 1);
    return 2;
  }
  printf("test_stress [%s]: %d threads x %ld iterations\n", API_MODE, nthreads, iterations);
  fflush(stdout);
  bool hardened = test_remote_reuse();
  test_idle_owner_blocks_go_back(hardened);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  CHECK(pthread_barrier_init(&start_barrier, NULL, (unsigned)nthreads) == 0, "pthread_barrier_init failed");
  pthread_t th[MAX_THREADS];
  for (int i = 0; i < nthreads; i++) {
    int rc = pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)(i + 1));
    CHECK(rc == 0, "pthread_create: %s", strerror(rc));
  }
  pthread_t reader;
#if defined(__SANITIZE_THREAD__)
  bool read_stats = false;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
  bool read_stats = false;
#else
  bool read_stats = true;
#endif
#else
  bool read_stats = true;
#endif
  if (read_stats) CHECK(pthread_create(&reader, NULL, stats_reader, NULL) == 0, "pthread_create failed");
  for (int i = 0; i < nthreads; i++) pthread_join(th[i], NULL);
  atomic_store(&workers_done, true);
  void *reads = NULL;
  if (read_stats) pthread_join(reader, &reads);
  printf("statistics read %lu times while the workers ran\n", (unsigned long)(uintptr_t)reads);

  /* drain and verify everything that is left */
  counters total = {0, 0, 0, 0, 0};
  size_t left = 0;
  for (size_t s = 0; s < NSLOTS; s++) {
    unsigned char *p = (unsigned char *)atomic_exchange(&slots[s], (uintptr_t)0);
    if (p == NULL) continue;
    verify_stamp(p, (uintptr_t)p, SIZE_MAX, NULL, NULL);
    API(free)(p);
    left++;
  }
  for (int i = 1; i <= nthreads; i++) {
    total.allocs += thread_counts[i].allocs;
    total.frees += thread_counts[i].frees;
    total.cross_frees += thread_counts[i].cross_frees;
    total.reallocs += thread_counts[i].reallocs;
    total.large += thread_counts[i].large;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  printf("allocs %llu (large %llu), frees %llu (cross-thread %llu = %.1f%%), reallocs %llu, drained %zu, %.2f s\n",
         (unsigned long long)total.allocs, (unsigned long long)total.large, (unsigned long long)total.frees,
         (unsigned long long)total.cross_frees, total.frees ? 100.0 * (double)total.cross_frees / (double)total.frees : 0.0,
         (unsigned long long)total.reallocs, left, secs);
  CHECK(total.allocs == total.frees + left, "block accounting: %llu allocs != %llu frees + %zu drained",
        (unsigned long long)total.allocs, (unsigned long long)total.frees, left);
  CHECK(total.frees > 0 && total.cross_frees * 10 > total.frees * 3,
        "only %llu of %llu frees were cross-thread (need > 30%%)", (unsigned long long)total.cross_frees,
        (unsigned long long)total.frees);

  test_idle_owners();

  /* the allocator still works normally afterwards */
  for (int i = 0; i < 10000; i++) {
    void *p = API(malloc)((size_t)(i % 2000) + 1);
    CHECK(p != NULL, "malloc after stress failed");
    memset(p, 0x5a, (size_t)(i % 2000) + 1);
    API(free)(p);
  }
  printf("test_stress: all passed\n");
  return 0;
}
