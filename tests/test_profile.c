/* The heap profiler's subject (tests/profile_check.sh runs it with
 * HAKMEM_PROFILE=1 and reads what it writes): known live sets allocated at
 * known functions, some freed here and some by another thread, the rest
 * churned.
 *   test_profile dump PATH    the workload, then hak_profile_dump(PATH);
 *                             prints "live BYTES" (the true live bytes of
 *                             the workload) and "churned BYTES"
 *   test_profile signal PATH  the workload, then SIGUSR2 (HAKMEM_PROFILE_FILE
 *                             must name PATH) and allocations until the
 *                             profile appears
 *   test_profile freed PATH   blocks of pages of one block, sampled and
 *                             freed: by their thread, from the page that
 *                             their class keeps as its current one when it
 *                             empties, and
 *                             by another thread while their own one waits;
 *                             then hak_profile_dump(PATH), which must hold
 *                             none of them
 *   test_profile threads      300 short threads, one after another, each
 *                             allocating and freeing blocks of many
 *                             classes: the sample heaps of exited threads
 *                             are taken over, so the mapped bytes stay flat
 *   test_profile realloc      8 buffers grown by realloc to 1 MiB and freed,
 *                             10 times: the pages that sampled blocks leave
 *                             as they move are not kept, so the spans
 *                             serving pages stay few
 *   test_profile modes PATH   this thread frees another thread's blocks
 *                             (which puts it in cache mode: remote.c) and
 *                             then reuses its own (which takes it out),
 *                             200 times each, keeping blocks of its own
 *                             between; then hak_profile_dump(PATH); prints
 *                             "kept BYTES" (the bytes it keeps)
 *   test_profile [off]        hak_profile_dump fails with ENOSYS (the profiler off) */
#include "api.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>

enum { SMALL = 200000, LARGE = 8, ALT = 40000, SPAN = 64 };
static void *small[SMALL], *large[LARGE], *cross[SMALL / 4], *alt[2 * ALT], *span[SPAN], *span_cross[SPAN];

__attribute__((noinline)) void profile_keep_small(void) {
  for (int i = 0; i < SMALL; i++) {
    small[i] = malloc(100);
    CHECK(small[i] != NULL, "malloc");
  }
}

__attribute__((noinline)) void profile_keep_large(void) {
  for (int i = 0; i < LARGE; i++) {
    large[i] = malloc(3u << 20);
    CHECK(large[i] != NULL, "malloc");
  }
}

__attribute__((noinline)) void profile_churn(size_t bytes) {
  for (size_t done = 0; done < bytes; done += 1000) {
    void *p = malloc(1000);
    *(volatile char *)p = 1;
    free(p);
  }
}

/* Two sites called in turn from one loop, at the same depth: a sample's
 * stack must not be taken for the one before it (profile.c keeps a
 * thread's last walk). */
__attribute__((noinline)) void *profile_keep_alt_a(void) {
  void *p = malloc(64);
  __asm__ volatile("" : : "r"(p) : "memory"); /* (no tail call: a frame of its own) */
  return p;
}
__attribute__((noinline)) void *profile_keep_alt_b(void) {
  void *p = malloc(192);
  __asm__ volatile("" : : "r"(p) : "memory");
  return p;
}
__attribute__((noinline)) void profile_keep_alt(void) {
  for (int i = 0; i < ALT; i++) {
    alt[2 * i] = profile_keep_alt_a();
    alt[2 * i + 1] = profile_keep_alt_b();
    CHECK(alt[2 * i] != NULL && alt[2 * i + 1] != NULL, "malloc");
  }
}

__attribute__((noinline)) void *profile_keep_cross(void *arg) {
  for (int i = 0; i < SMALL / 4; i++) cross[i] = calloc(1, 256);
  for (int i = 0; i < SPAN; i++) CHECK((span_cross[i] = malloc(300u << 10)) != NULL, "malloc");
  return arg;
}

/* Blocks of pages of one block (profile.c: sampled from the thread's own
 * heap, their pages marked): 250,000 bytes kept while others of the class
 * come and go, and 64 KiB-1 MiB blocks freed at once */
__attribute__((noinline)) void profile_keep_span(void) {
  for (int i = 0; i < SPAN; i++) {
    CHECK((span[i] = malloc(250000)) != NULL, "malloc");
    for (int k = 0; k < 4; k++) {
      void *p = malloc(250000);
      CHECK(p != NULL, "malloc");
      *(volatile char *)p = 1;
      free(p);
    }
  }
}
__attribute__((noinline)) void profile_span_churn(size_t bytes) {
  for (size_t done = 0, i = 0; done < bytes; i++) {
    size_t n = ((size_t)64 << 10) * (1 + i * 7919 % 15);
    void *p = malloc(n);
    CHECK(p != NULL, "malloc");
    *(volatile char *)p = 1;
    free(p);
    done += n;
  }
}
static void *free_span_quarter(void *arg) {
  for (int i = 0; i < SPAN; i += 4) free(span[i]);
  return arg;
}

static size_t workload(void) {
  profile_keep_small();
  profile_keep_large();
  profile_keep_alt();
  profile_keep_span();
  pthread_t t;
  CHECK(pthread_create(&t, NULL, profile_keep_cross, NULL) == 0 && pthread_join(t, NULL) == 0, "thread");
  profile_churn((size_t)100 << 20);
  profile_span_churn((size_t)256 << 20);
  /* half of each set freed, the other thread's by this one; of the 200,000
   * bytes blocks, a quarter by this thread and a quarter by another one */
  for (int i = 0; i < SMALL; i += 2) free(small[i]);
  for (int i = 0; i < SMALL / 4; i += 2) free(cross[i]);
  for (int i = 0; i < SPAN; i += 2) free(span_cross[i]);
  for (int i = 2; i < SPAN; i += 4) free(span[i]);
  CHECK(pthread_create(&t, NULL, free_span_quarter, NULL) == 0 && pthread_join(t, NULL) == 0, "thread");
  free(large[0]);
  return (size_t)(SMALL / 2) * 100 + (size_t)(LARGE - 1) * (3u << 20) + (size_t)(SMALL / 8) * 256 +
         (size_t)ALT * (64 + 192) + (size_t)(SPAN / 2) * 250000 + (size_t)(SPAN / 2) * (300u << 10);
}

__attribute__((noinline)) void *profile_span_current(void) {
  void *p = malloc(250000);
  __asm__ volatile("" : : "r"(p) : "memory");
  return p;
}
enum { REMOTE_SPANS = 16 };
static void *remote_spans[REMOTE_SPANS];
static pthread_barrier_t spans_made, spans_freed;
__attribute__((noinline)) void *profile_span_remote(void *arg) {
  for (int i = 0; i < REMOTE_SPANS; i++) CHECK((remote_spans[i] = malloc(300u << 10)) != NULL, "malloc");
  pthread_barrier_wait(&spans_made);
  pthread_barrier_wait(&spans_freed); /* (alive and idle until the profile is written) */
  return arg;
}
static void freed_spans(const char *path) {
  for (int round = 0; round < 100; round++) {
    void *p = profile_span_current();
    CHECK(p != NULL, "malloc");
    free(p);
  }
  pthread_barrier_init(&spans_made, NULL, 2);
  pthread_barrier_init(&spans_freed, NULL, 2);
  pthread_t t;
  CHECK(pthread_create(&t, NULL, profile_span_remote, NULL) == 0, "thread");
  pthread_barrier_wait(&spans_made);
  for (int i = 0; i < REMOTE_SPANS; i++) free(remote_spans[i]);
  CHECK(hak_profile_dump(path) == 0, "hak_profile_dump(%s): %s", path, strerror(errno));
  pthread_barrier_wait(&spans_freed);
  CHECK(pthread_join(t, NULL) == 0, "thread");
}

/* Lifetimes: blocks of 4 KiB (each sampled at a rate of 1 KiB but for
 * e^-4 of them) allocated at one site each, then freed at once, after
 * 30 ms or after 1.1 s. */
#define LIFE_BLOCKS 40
static void *life_blocks[LIFE_BLOCKS];
#define LIFE_SITE(name)                                                                       \
  __attribute__((noinline)) void name(void) {                                                 \
    for (int i = 0; i < LIFE_BLOCKS; i++) CHECK((life_blocks[i] = malloc(4096)) != NULL, "malloc"); \
  }
LIFE_SITE(life_short)
LIFE_SITE(life_mid)
LIFE_SITE(life_long)
static void life_free_after(unsigned ms) {
  if (ms != 0) usleep(ms * 1000);
  for (int i = 0; i < LIFE_BLOCKS; i++) free(life_blocks[i]);
}
static void lifetimes(const char *path) {
  life_short();
  life_free_after(0);
  life_mid();
  life_free_after(30);
  life_long();
  life_free_after(1100);
  CHECK(hak_profile_dump(path) == 0, "hak_profile_dump(%s): %s", path, strerror(errno));
}

__attribute__((noinline)) void *profile_short_thread(void *arg) {
  void *p[64];
  for (int round = 0; round < 64; round++) {
    for (int i = 0; i < 64; i++) p[i] = malloc(16 + (size_t)(i * 61 + round * 7) % 4000);
    for (int i = 0; i < 64; i++) free(p[i]);
  }
  return arg;
}

static unsigned long long mapped_after_threads(int threads) {
  for (int i = 0; i < threads; i++) {
    pthread_t t;
    CHECK(pthread_create(&t, NULL, profile_short_thread, NULL) == 0 && pthread_join(t, NULL) == 0, "thread");
  }
  struct hak_stats s;
  CHECK(hak_stats_get(&s, sizeof s) == 0, "hak_stats_get");
  return s.mapped_bytes;
}

/* modes: the count to the next sample goes with the thread into cache
 * mode and out of it; the bytes kept at profile_keep_modes between the
 * changes must be estimated as well as any. */
#define MODES_ROUNDS 400
#define MODES_FOREIGN 256
static void *modes_foreign[MODES_ROUNDS / 2][MODES_FOREIGN];
static void *modes_kept[MODES_ROUNDS][64];
static pthread_barrier_t modes_made;

static _Atomic int modes_stop;

/* Allocates the blocks the other thread frees, then goes on allocating
 * until it is told to stop: the blocks of an owner that exited or sits
 * idle go straight back to their pages (remote.c, owner_idle), which is no
 * cache mode. */
static void *modes_allocator(void *arg) {
  for (int r = 0; r < MODES_ROUNDS / 2; r++)
    for (int i = 0; i < MODES_FOREIGN; i++) CHECK((modes_foreign[r][i] = malloc(64)) != NULL, "malloc");
  pthread_barrier_wait(&modes_made);
  while (!atomic_load(&modes_stop)) {
    void *p[64];
    for (int i = 0; i < 64; i++) CHECK((p[i] = malloc(4096)) != NULL, "malloc");
    for (int i = 0; i < 64; i++) free(p[i]);
  }
  return arg;
}

__attribute__((noinline)) void *profile_keep_modes(size_t n) {
  void *p = malloc(n);
  CHECK(p != NULL, "malloc");
  return p;
}

static size_t modes(const char *path) {
  pthread_t t;
  CHECK(pthread_barrier_init(&modes_made, NULL, 2) == 0, "barrier");
  CHECK(pthread_create(&t, NULL, modes_allocator, NULL) == 0, "thread");
  pthread_barrier_wait(&modes_made);
  size_t kept = 0;
  for (int r = 0; r < MODES_ROUNDS; r++) {
    if (r % 2 == 0) {
      for (int i = 0; i < MODES_FOREIGN; i++) free(modes_foreign[r / 2][i]);
    } else {
      for (int k = 0; k < 4; k++) {
        void *own[256];
        for (int i = 0; i < 256; i++) CHECK((own[i] = malloc(64)) != NULL, "malloc");
        for (int i = 0; i < 256; i++) free(own[i]);
      }
    }
    for (int i = 0; i < 64; i++) {
      size_t n = 16 + (size_t)(i * 613 + r * 97) % 2000;
      modes_kept[r][i] = profile_keep_modes(n);
      kept += n;
    }
  }
  atomic_store(&modes_stop, 1);
  CHECK(pthread_join(t, NULL) == 0, "join");
  CHECK(hak_profile_dump(path) == 0, "hak_profile_dump(%s): %s", path, strerror(errno));
  return kept;
}

/* Bytes of spans serving pages after buffers grew through every class
 * (as bench/realloc_growth's) and were freed. */
static unsigned long long page_bytes_after_growth(void) {
  for (int round = 0; round < 10; round++) {
    void *buf[8] = {0};
    size_t len[8] = {0};
    for (int grown = 1; grown;) {
      grown = 0;
      for (int b = 0; b < 8; b++) {
        if (len[b] >= (1u << 20)) continue;
        len[b] = len[b] == 0 ? 16 : len[b] + len[b] / 10 + 8;
        if (len[b] > (1u << 20)) len[b] = 1u << 20;
        buf[b] = realloc(buf[b], len[b]);
        CHECK(buf[b] != NULL, "realloc");
        memset((char *)buf[b] + len[b] - 8, 1, 8);
        grown = 1;
      }
    }
    for (int b = 0; b < 8; b++) free(buf[b]);
  }
  struct hak_stats s;
  CHECK(hak_stats_get(&s, sizeof s) == 0, "hak_stats_get");
  return s.page_bytes;
}

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "realloc") == 0) {
    unsigned long long bytes = page_bytes_after_growth();
    printf("test_profile: realloc: %llu bytes of pages after the buffers were freed\n", bytes);
    return 0;
  }
  if (argc >= 2 && strcmp(argv[1], "threads") == 0) {
    unsigned long long first = mapped_after_threads(30), last = mapped_after_threads(270);
    printf("test_profile: threads: %llu bytes mapped after 30 threads, %llu after 300\n", first, last);
    CHECK(last <= first + (8u << 20), "the mapped bytes grow with exited threads");
    return 0;
  }
  if (argc < 2 || strcmp(argv[1], "off") == 0) {
    errno = 0;
    CHECK(hak_profile_dump("/nonexistent/x") == -1 && errno == ENOSYS, "hak_profile_dump without the profiler");
    printf("test_profile: off: OK\n");
    return 0;
  }
  CHECK(argc >= 3, "usage: test_profile dump|signal|freed|lifetimes|modes PATH | threads | realloc | [off]");
  if (strcmp(argv[1], "freed") == 0) {
    freed_spans(argv[2]);
    return 0;
  }
  if (strcmp(argv[1], "modes") == 0) {
    printf("kept %zu\n", modes(argv[2]));
    return 0;
  }
  if (strcmp(argv[1], "lifetimes") == 0) {
    lifetimes(argv[2]);
    return 0;
  }
  size_t live = workload();
  if (strcmp(argv[1], "dump") == 0) {
    CHECK(hak_profile_dump(argv[2]) == 0, "hak_profile_dump(%s): %s", argv[2], strerror(errno));
  } else {
    raise(SIGUSR2);
    /* the dump comes with the next sample or the purger's next pass */
    struct stat st;
    for (int i = 0; i < 5000 && stat(argv[2], &st) != 0; i++) {
      profile_churn((size_t)1 << 20);
      usleep(1000);
    }
    CHECK(stat(argv[2], &st) == 0, "no profile at %s after the signal", argv[2]);
  }
  printf("live %zu\nchurned %zu\n", live, (size_t)100 << 20);
  return 0;
}
