/* thread_churn THREADS [AT_ONCE]
 * THREADS short-lived threads, AT_ONCE (default 8) running at a time. Each
 * allocates 32 blocks (mostly 16-2048 B, some 8-64 KiB), frees half of
 * them itself and leaves the other half to the main thread, which frees
 * them after the thread has exited. Measures what thread churn costs and,
 * through peak RSS, whether the memory of exited threads is reused by the
 * living or accumulates. ops = threads started and joined. */
#include "bench_util.h" /* first: it defines _GNU_SOURCE */
#include <pthread.h>

#define PER_THREAD 32

typedef struct {
  int id;
  void *left[PER_THREAD / 2]; /* blocks left for the main thread */
  size_t left_n[PER_THREAD / 2];
} job_t;

static void *worker(void *arg) {
  job_t *j = arg;
  bu_rng rng;
  bu_seed(&rng, 4242 + (uint64_t)j->id);
  void *p[PER_THREAD];
  size_t n[PER_THREAD];
  for (int i = 0; i < PER_THREAD; i++) {
    n[i] = bu_next(&rng) % 16 == 0 ? bu_range(&rng, 8 << 10, 64 << 10) : bu_range(&rng, 16, 2048);
    p[i] = bu_malloc(n[i]);
    bu_stamp(p[i], n[i]);
  }
  for (int i = 0; i < PER_THREAD; i += 2) {
    bu_check(p[i], n[i], "thread_churn");
    free(p[i]);
    j->left[i / 2] = p[i + 1];
    j->left_n[i / 2] = n[i + 1];
  }
  return NULL;
}

int main(int argc, char **argv) {
  long long total = bu_arg(argc, argv, 1, 20000);
  int at_once = (int)bu_arg(argc, argv, 2, 8);
  if (at_once < 1 || at_once > 256 || total < 1) return 64;
  pthread_t th[256];
  job_t *jobs = bu_malloc((size_t)at_once * sizeof *jobs);

  double t0 = bu_now();
  for (long long started = 0; started < total; started += at_once) {
    int k = (int)(total - started < at_once ? total - started : at_once);
    for (int i = 0; i < k; i++) {
      jobs[i].id = (int)(started + i);
      if (pthread_create(&th[i], NULL, worker, &jobs[i]) != 0) {
        fprintf(stderr, "pthread_create failed\n");
        return 3;
      }
    }
    for (int i = 0; i < k; i++) pthread_join(th[i], NULL);
    /* the exited threads' blocks, freed by the main thread */
    for (int i = 0; i < k; i++)
      for (int b = 0; b < PER_THREAD / 2; b++) {
        bu_check(jobs[i].left[b], jobs[i].left_n[b], "thread_churn (left)");
        free(jobs[i].left[b]);
      }
  }
  double t = bu_now() - t0;
  free(jobs);
  bu_result("thread_churn", (double)total, t, "at_once=%d", at_once);
  return 0;
}
