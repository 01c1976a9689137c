/* test_deferred_spans: a span given back while another thread holds its
 * region list's lock goes onto the list's stack of deferred spans, and
 * the next thread to take that lock frees it (src/region.c, free_span).
 *
 * Eight threads replace blocks of 64 KiB-1 MiB (each alone in a span of
 * its own, which goes back to its region when freed) in 16 slots each,
 * checking every block's first and last bytes before freeing it; heaps
 * take committed runs of other threads' lists, and give them back there
 * while those threads work on their lists. Rounds repeat until the
 * statistics count deferred give-backs (at most 8 rounds). Then every
 * block is freed and the threads exit, and after malloc_trim(0) the slabs
 * in use must be back to about where they were before the threads: a
 * deferred span that no one freed would keep its slabs in use (and its
 * memory) for good.
 */
#define _GNU_SOURCE
#include "api.h"

#include <pthread.h>

#define KiB ((size_t)1 << 10)
#define THREADS 8
#define SLOTS 16
#define STEPS 4000
#define EDGE 64 /* bytes filled and checked at each end of a block */

static void fill_ends(unsigned char *p, size_t n, uint64_t seed) {
  hkt_fill(p, EDGE, seed);
  hkt_fill(p + n - EDGE, EDGE, seed + 1);
}
static void check_ends(const unsigned char *p, size_t n, uint64_t seed) {
  CHECK(hkt_verify(p, EDGE, seed) == HKT_OK && hkt_verify(p + n - EDGE, EDGE, seed + 1) == HKT_OK,
        "block %p of %zu bytes corrupted", (const void *)p, n);
}

static void *worker(void *arg) {
  uint64_t rng = 0x9e3779b97f4a7c15ull * ((uintptr_t)arg + 1);
  unsigned char *p[SLOTS] = {0};
  size_t n[SLOTS];
  uint64_t seed[SLOTS];
  for (int step = 0; step < STEPS; step++) {
    int k = (int)(hkt_rand(&rng) % SLOTS);
    if (p[k] != NULL) {
      check_ends(p[k], n[k], seed[k]);
      API(free)(p[k]);
    }
    n[k] = 64 * KiB + (size_t)(hkt_rand(&rng) % (960 * KiB));
    seed[k] = hkt_rand(&rng);
    p[k] = (unsigned char *)API(malloc)(n[k]);
    CHECK(p[k] != NULL, "malloc(%zu) failed", n[k]);
    fill_ends(p[k], n[k], seed[k]);
  }
  for (int k = 0; k < SLOTS; k++)
    if (p[k] != NULL) {
      check_ends(p[k], n[k], seed[k]);
      API(free)(p[k]);
    }
  return NULL;
}

int main(void) {
  long before = hkt_stat("slabs in use");
  long deferred = 0;
  int rounds = 0;
  while (rounds < 8 && deferred == 0) {
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
      CHECK(pthread_create(&t[i], NULL, worker, (void *)(i + THREADS * (uintptr_t)rounds)) == 0, "pthread_create failed");
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    rounds++;
    deferred = hkt_stat("spans given back while their list was busy");
  }
  API(malloc_trim)(0);
  long after = hkt_stat("slabs in use");
  printf("test_deferred_spans (%s): %ld spans given back while their list was busy in %d round(s) of %d threads; "
         "slabs in use %ld before, %ld after malloc_trim\n",
         API_MODE, deferred, rounds, THREADS, before, after);
  if (deferred == 0)
    printf("test_deferred_spans: no give-back found its list busy (no contention on this machine): the deferred "
           "path was not exercised\n");
  /* the exited threads' small pages (their stacks' TLS, stdio) aside */
  CHECK(after <= before + 4, "slabs in use %ld -> %ld after all blocks were freed and malloc_trim(0): spans lost", before,
        after);
  return 0;
}
