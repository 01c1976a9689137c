/* false_sharing THREADS ROUNDS WRITES [SIZE]
 * Active false sharing (Hoard's cache-thrash): each thread repeatedly
 * allocates a small block (default 16 B), writes to it WRITES times and frees
 * it. Allocators that give back-to-back blocks of one cache line to
 * different threads make the writes bounce the line between cores.
 * ops = writes by all threads. */
#include "bench_util.h" /* first: it defines _GNU_SOURCE */
#include <pthread.h>

static long long rounds, writes;
static size_t size;

static void *worker(void *arg) {
  (void)arg;
  for (long long r = 0; r < rounds; r++) {
    volatile char *p = bu_malloc(size);
    for (long long w = 0; w < writes; w++) p[w & 7] = (char)w;
    for (size_t i = 0; i < size; i++) p[i] = 0;
    bu_stamp((void *)p, size);
    bu_check((void *)p, size, "false_sharing");
    free((void *)p);
  }
  return NULL;
}

int main(int argc, char **argv) {
  int threads = (int)bu_arg(argc, argv, 1, 2);
  rounds = bu_arg(argc, argv, 2, 10000);
  writes = bu_arg(argc, argv, 3, 10000);
  size = (size_t)bu_arg(argc, argv, 4, 16);
  if (threads < 1 || threads > 256 || size < 8) return 64;
  pthread_t th[256];

  double t0 = bu_now();
  for (int i = 0; i < threads; i++) pthread_create(&th[i], NULL, worker, NULL);
  for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
  double t = bu_now() - t0;
  bu_result("false_sharing", (double)threads * (double)rounds * (double)writes, t, "threads=%d size=%zu", threads, size);
  return 0;
}
