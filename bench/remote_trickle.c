/* remote_trickle ITERS PER_MILLE
 * random_mixed's loop (4096 slots, 16-1040 B) in the main thread, where a
 * few of the frees are of blocks another thread allocated: on PER_MILLE of
 * the iterations that free a block, the block freed is the next one of a
 * pool that a second thread filled, and that thread keeps allocating and
 * freeing blocks of its own meanwhile (an owner that is alive and busy).
 * A server thread that mostly works on its own data but now and then frees
 * a request another thread built. ops = the main thread's iterations. */
#include "bench_util.h" /* first: it defines _GNU_SOURCE */
#include <pthread.h>
#include <stdatomic.h>

#define WS 4096
#define POOL (1 << 17)

static void *pool[POOL];
static size_t pool_n[POOL];
static atomic_int ready, stop;

/* random_mixed's step on slot k: free its block, or allocate one */
static void step(bu_rng *rng, void **slot, size_t *size, size_t k, const char *what) {
  if (slot[k]) {
    bu_check(slot[k], size[k], what);
    free(slot[k]);
    slot[k] = NULL;
  } else {
    size[k] = bu_range(rng, 16, 1040);
    slot[k] = bu_malloc(size[k]);
    bu_stamp(slot[k], size[k]);
  }
}

static void *owner(void *arg) {
  (void)arg;
  bu_rng rng;
  bu_seed(&rng, 77);
  for (int i = 0; i < POOL; i++) {
    pool_n[i] = bu_range(&rng, 16, 1040);
    pool[i] = bu_malloc(pool_n[i]);
    bu_stamp(pool[i], pool_n[i]);
  }
  atomic_store(&ready, 1);
  static void *slot[WS];
  static size_t size[WS];
  while (!atomic_load_explicit(&stop, memory_order_relaxed))
    for (int r = 0; r < 1000; r++) step(&rng, slot, size, bu_next(&rng) % WS, "remote_trickle (owner)");
  for (int k = 0; k < WS; k++) free(slot[k]);
  return NULL;
}

int main(int argc, char **argv) {
  long long iters = bu_arg(argc, argv, 1, 20000000);
  long long per_mille = bu_arg(argc, argv, 2, 5);
  bu_rng rng;
  bu_seed(&rng, 42);
  pthread_t th;
  if (pthread_create(&th, NULL, owner, NULL) != 0) return 3;
  while (!atomic_load(&ready)) sched_yield();
  static void *slot[WS];
  static size_t size[WS];
  long long used = 0;

  double t0 = bu_now();
  for (long long i = 0; i < iters; i++) {
    size_t k = bu_next(&rng) % WS;
    if (slot[k] && used < POOL && (long long)(bu_next(&rng) % 1000) < per_mille) {
      bu_check(pool[used], pool_n[used], "remote_trickle (pool)");
      free(pool[used]); /* instead of the slot's block, which stays */
      pool[used++] = NULL;
    } else {
      step(&rng, slot, size, k, "remote_trickle");
    }
  }
  double t = bu_now() - t0;

  atomic_store(&stop, 1);
  pthread_join(th, NULL);
  for (int k = 0; k < WS; k++)
    if (slot[k]) {
      bu_check(slot[k], size[k], "remote_trickle (final)");
      free(slot[k]);
    }
  for (long long i = used; i < POOL; i++) free(pool[i]);
  bu_result("remote_trickle", (double)iters, t, "remote_frees=%lld", used);
  return 0;
}
