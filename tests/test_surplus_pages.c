/* test_surplus_pages: the empty medium pages of exited threads are kept
 * for the threads that start next, two a size class; the others go back
 * to their regions, purged (src/abandoned.c, surplus_empty).
 *
 * Rounds of eight threads: each allocates a block of 20 KiB and one of 40
 * KiB (classes whose pages span several slabs), fills them, waits until
 * all eight hold theirs (so eight pages of each class are in use at once),
 * checks and frees them, and leaves a block of 24 KiB for the main thread,
 * which frees it after joining the round (so those pages empty after
 * their owner has exited). Then at most three empty pages a class may be
 * kept (two, and a third where two threads exiting at the same moment each
 * keep one): keeping them all left eight a class (24 here), which later
 * threads adopted in turn, each with the memory earlier owners wrote. */
#define _GNU_SOURCE
#include "api.h"

#include <pthread.h>

#define KiB ((size_t)1 << 10)
#define THREADS 8
#define ROUNDS 12
#define CLASSES 3 /* of the blocks below */

static pthread_barrier_t all_hold;
static unsigned char *left[THREADS];

static void *worker(void *arg) {
  uintptr_t id = (uintptr_t)arg;
  size_t n1 = 20 * KiB, n2 = 40 * KiB, n3 = 24 * KiB;
  unsigned char *a = (unsigned char *)API(malloc)(n1), *b = (unsigned char *)API(malloc)(n2);
  CHECK(a != NULL && b != NULL, "malloc failed");
  hkt_fill(a, n1, id);
  hkt_fill(b, n2, ~id);
  pthread_barrier_wait(&all_hold);
  CHECK(hkt_verify(a, n1, id) == HKT_OK && hkt_verify(b, n2, ~id) == HKT_OK, "a block was corrupted");
  API(free)(a);
  API(free)(b);
  left[id % THREADS] = (unsigned char *)API(malloc)(n3);
  CHECK(left[id % THREADS] != NULL, "malloc failed");
  hkt_fill(left[id % THREADS], n3, id * 3);
  return NULL;
}

int main(void) {
  long kept_before = hkt_stat("empty pages of exited threads kept now");
  long given_before = hkt_stat("empty pages of exited threads given back");
  CHECK(pthread_barrier_init(&all_hold, NULL, THREADS) == 0, "pthread_barrier_init failed");
  for (int r = 0; r < ROUNDS; r++) {
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
      CHECK(pthread_create(&t[i], NULL, worker, (void *)(i + THREADS * (uintptr_t)r)) == 0, "pthread_create failed");
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    for (uintptr_t i = 0; i < THREADS; i++) {
      uintptr_t id = i + THREADS * (uintptr_t)r;
      CHECK(hkt_verify(left[i], 24 * KiB, id * 3) == HKT_OK, "a block left by an exited thread was corrupted");
      API(free)(left[i]);
    }
  }
  /* (an allocation's slow path sweeps the exited threads' pages that the
   * frees above emptied) */
  API(free)(API(malloc)(100 * KiB));
  long kept = hkt_stat("empty pages of exited threads kept now") - kept_before;
  long given = hkt_stat("empty pages of exited threads given back") - given_before;
  printf("test_surplus_pages (%s): %d rounds of %d threads: %ld empty pages kept, %ld given back\n", API_MODE, ROUNDS,
         THREADS, kept, given);
  CHECK(kept <= 3 * CLASSES, "%ld empty pages of exited threads kept for %d classes", kept, CLASSES);
  CHECK(given >= ROUNDS * (THREADS - 3), "only %ld empty pages of exited threads given back", given);
  return 0;
}
