/* test_region_lists: the regions are in several lists of a lock each, a
 * heap taking its spans from its own list first (region.c). A heap whose
 * list has no committed free run that fits takes another list's before it
 * touches clean memory of its own, so two threads that take turns with the
 * same amount of memory do not each keep a copy of it. It finds another
 * list's runs through that list's bound of its longest committed run,
 * raised by every free: ctest runs this with 8 lists or more and with 64.
 *
 * Run with HAKMEM_PURGE_DELAY_MS=1000000 and HAKMEM_PURGE_THREAD=0, so that
 * no delayed purge lowers RSS. Thread A writes 64 blocks of 256 KiB (a span
 * of 5 slabs each: blocks of a slab or more keep no spares) and frees them,
 * then waits; thread B, with a heap of its own and so another list, writes
 * as many. B must find A's committed slabs: RSS may grow by what A's heap
 * keeps for its class (2 MiB of empty pages) and a little more, not by the
 * 16 MiB of B's blocks. Every block of B keeps its contents.
 */
#define _GNU_SOURCE
#include "api.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define N 64
#define SIZE (256 * KiB)

static pthread_barrier_t freed, done;
static size_t rss_freed;

static void *thread_a(void *arg) {
  (void)arg;
  unsigned char *p[N];
  for (int i = 0; i < N; i++) {
    p[i] = (unsigned char *)API(malloc)(SIZE);
    CHECK(p[i] != NULL, "malloc(%zu) failed", SIZE);
    hkt_fill(p[i], SIZE, (uint64_t)i);
  }
  for (int i = 0; i < N; i++) API(free)(p[i]);
  rss_freed = hkt_rss_bytes();
  pthread_barrier_wait(&freed);
  pthread_barrier_wait(&done); /* stays alive: its heap keeps its list */
  return NULL;
}

static void *thread_b(void *arg) {
  (void)arg;
  pthread_barrier_wait(&freed);
  unsigned char *p[N];
  for (int i = 0; i < N; i++) {
    p[i] = (unsigned char *)API(malloc)(SIZE);
    CHECK(p[i] != NULL, "malloc(%zu) failed", SIZE);
    hkt_fill(p[i], SIZE, (uint64_t)i + 1000);
  }
  size_t after = hkt_rss_bytes();
  size_t limit = 6 * MiB;
  printf("test_region_lists: RSS %.1f MiB after thread A freed 16 MiB, %.1f MiB after thread B wrote 16 MiB "
         "(growth allowed: %.1f MiB)\n",
         (double)rss_freed / (double)MiB, (double)after / (double)MiB, (double)limit / (double)MiB);
  CHECK(after <= rss_freed + limit, "thread B took clean memory while thread A's list held committed slabs: "
        "RSS %.1f -> %.1f MiB", (double)rss_freed / (double)MiB, (double)after / (double)MiB);
  for (int i = 0; i < N; i++) {
    size_t bad = hkt_verify(p[i], SIZE, (uint64_t)i + 1000);
    CHECK(bad == HKT_OK, "block %d corrupted at byte %zu", i, bad);
    API(free)(p[i]);
  }
  pthread_barrier_wait(&done);
  return NULL;
}

int main(void) {
  const char *delay = getenv("HAKMEM_PURGE_DELAY_MS");
  CHECK(delay != NULL && atol(delay) >= 1000000, "run with HAKMEM_PURGE_DELAY_MS=1000000 (ctest sets it)");
  pthread_barrier_init(&freed, NULL, 2);
  pthread_barrier_init(&done, NULL, 2);
  pthread_t a, b;
  CHECK(pthread_create(&a, NULL, thread_a, NULL) == 0, "pthread_create failed");
  CHECK(pthread_create(&b, NULL, thread_b, NULL) == 0, "pthread_create failed");
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  printf("test_region_lists: ok\n");
  return 0;
}
