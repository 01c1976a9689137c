/* mid_large_mt THREADS CYCLES WS [MIN MAX]
 * random_mixed in every thread (its own WS slots, CYCLES iterations each)
 * with block sizes of MIN-MAX bytes (default 8-32 KiB). */
#include "bench_util.h" /* first: it defines _GNU_SOURCE */
#include <pthread.h>

static long long cycles, ws, min_size, max_size;

static void *worker(void *arg) {
  bu_rng rng;
  bu_seed(&rng, 1000 + (uintptr_t)arg);
  void **slot = bu_malloc((size_t)ws * sizeof *slot);
  size_t *size = bu_malloc((size_t)ws * sizeof *size);
  memset(slot, 0, (size_t)ws * sizeof *slot);
  for (long long i = 0; i < cycles; i++) {
    size_t k = bu_next(&rng) % (uint64_t)ws;
    if (slot[k]) {
      bu_check(slot[k], size[k], "mid_large_mt");
      free(slot[k]);
      slot[k] = NULL;
    } else {
      size[k] = bu_range(&rng, (size_t)min_size, (size_t)max_size);
      slot[k] = bu_malloc(size[k]);
      bu_stamp(slot[k], size[k]);
    }
  }
  for (long long k = 0; k < ws; k++)
    if (slot[k]) {
      bu_check(slot[k], size[k], "mid_large_mt (final)");
      free(slot[k]);
    }
  free(slot);
  free(size);
  return NULL;
}

int main(int argc, char **argv) {
  int threads = (int)bu_arg(argc, argv, 1, 2);
  cycles = bu_arg(argc, argv, 2, 500000);
  ws = bu_arg(argc, argv, 3, 256);
  min_size = bu_arg(argc, argv, 4, 8 << 10);
  max_size = bu_arg(argc, argv, 5, 32 << 10);
  pthread_t th[256];
  if (threads < 1 || threads > 256 || min_size < 16 || max_size < min_size) return 64;

  double t0 = bu_now();
  for (int i = 0; i < threads; i++) pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)i);
  for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
  double t = bu_now() - t0;
  bu_result("mid_large_mt", (double)threads * (double)cycles, t, "threads=%d", threads);
  return 0;
}
