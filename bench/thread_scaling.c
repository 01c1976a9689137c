/* thread_scaling THREADS OPS
 * A fixed per-thread workload: OPS iterations of small-block churn (each
 * replaces a random one of 64 slots with a block of 16-256 B). Run it at 1,
 * 2, 4, 8 threads; ideal scaling keeps ops_per_sec growing up to the number
 * of cores. ops = OPS * THREADS. */
#include "bench_util.h" /* first: it defines _GNU_SOURCE */
#include <pthread.h>

#define SLOTS 64

static long long nops;

static void *worker(void *arg) {
  bu_rng rng;
  bu_seed(&rng, 99 + (uintptr_t)arg);
  void *p[SLOTS] = {0};
  size_t n[SLOTS];
  for (long long i = 0; i < nops; i++) {
    size_t k = bu_next(&rng) % SLOTS;
    if (p[k]) {
      bu_check(p[k], n[k], "thread_scaling");
      free(p[k]);
    }
    n[k] = bu_range(&rng, 16, 256);
    p[k] = bu_malloc(n[k]);
    bu_stamp(p[k], n[k]);
  }
  for (int k = 0; k < SLOTS; k++)
    if (p[k]) {
      bu_check(p[k], n[k], "thread_scaling (final)");
      free(p[k]);
    }
  return NULL;
}

int main(int argc, char **argv) {
  int threads = (int)bu_arg(argc, argv, 1, 1);
  nops = bu_arg(argc, argv, 2, 2000000);
  if (threads < 1 || threads > 256) return 64;
  pthread_t th[256];
  char name[32];
  snprintf(name, sizeof name, "thread_scaling_%d", threads);

  double t0 = bu_now();
  for (int i = 0; i < threads; i++) pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)i);
  for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
  double t = bu_now() - t0;
  bu_result(name, (double)threads * (double)nops, t, "threads=%d", threads);
  return 0;
}
