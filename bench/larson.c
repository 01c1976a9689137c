/* larson THREADS ROUNDS|SECONDSs BLOCKS REPLACEMENTS SEED
 * A server simulation after Larson & Krishnan: every thread owns an array of
 * BLOCKS blocks (8-1024 B) and, each round, replaces REPLACEMENTS random
 * blocks (free + malloc). After every round the arrays move on to the next
 * thread, so a block is usually freed by a thread other than the one that
 * allocated it (remote frees). The second argument is a round count ("200")
 * or a duration ("3s"). ops = replacements done by all threads. */
#include "bench_util.h" /* first: it defines _GNU_SOURCE */
#include <pthread.h>

typedef struct { void **p; size_t *n; } array_t;

static int threads;
static long long blocks, repl, max_rounds, rounds_done;
static double seconds_limit, t_start;
static array_t *arrays;   /* arrays[i] is worked on by thread (i + round) % threads */
static volatile int stop; /* written by thread 0 between the two barriers */
static pthread_barrier_t bar;

static void *worker(void *arg) {
  int id = (int)(uintptr_t)arg;
  bu_rng rng;
  bu_seed(&rng, 7777 + (uint64_t)id);
  for (long long round = 0; !stop; round++) {
    array_t *a = &arrays[(id + round) % threads];
    for (long long r = 0; r < repl; r++) {
      size_t k = bu_next(&rng) % (uint64_t)blocks;
      if (a->p[k]) {
        bu_check(a->p[k], a->n[k], "larson");
        free(a->p[k]);
      }
      a->n[k] = bu_range(&rng, 8, 1024);
      a->p[k] = bu_malloc(a->n[k]);
      bu_stamp(a->p[k], a->n[k]);
    }
    pthread_barrier_wait(&bar); /* everyone is done with this round's array */
    if (id == 0) {
      rounds_done = round + 1;
      if (seconds_limit > 0 ? bu_now() - t_start >= seconds_limit : rounds_done >= max_rounds) stop = 1;
    }
    pthread_barrier_wait(&bar); /* stop is decided */
  }
  return NULL;
}

int main(int argc, char **argv) {
  threads = (int)bu_arg(argc, argv, 1, 2);
  if (argc > 2 && argv[2][0] && argv[2][strlen(argv[2]) - 1] == 's') seconds_limit = atof(argv[2]);
  else max_rounds = bu_arg(argc, argv, 2, 200);
  blocks = bu_arg(argc, argv, 3, 1000);
  repl = bu_arg(argc, argv, 4, 1000);
  bu_rng rng;
  bu_seed(&rng, (uint64_t)bu_arg(argc, argv, 5, 1));
  if (threads < 1 || threads > 256 || blocks < 1) return 64;

  /* fill the arrays in the main thread: the first frees are all remote */
  arrays = bu_malloc((size_t)threads * sizeof *arrays);
  for (int i = 0; i < threads; i++) {
    arrays[i].p = bu_malloc((size_t)blocks * sizeof(void *));
    arrays[i].n = bu_malloc((size_t)blocks * sizeof(size_t));
    for (long long k = 0; k < blocks; k++) {
      arrays[i].n[k] = bu_range(&rng, 8, 1024);
      arrays[i].p[k] = bu_malloc(arrays[i].n[k]);
      bu_stamp(arrays[i].p[k], arrays[i].n[k]);
    }
  }
  pthread_barrier_init(&bar, NULL, (unsigned)threads);
  pthread_t th[256];
  t_start = bu_now();
  for (int i = 0; i < threads; i++) pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)i);
  for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
  double t = bu_now() - t_start;

  for (int i = 0; i < threads; i++) {
    for (long long k = 0; k < blocks; k++) {
      bu_check(arrays[i].p[k], arrays[i].n[k], "larson (final)");
      free(arrays[i].p[k]);
    }
    free(arrays[i].p);
    free(arrays[i].n);
  }
  free(arrays);
  bu_result("larson", (double)rounds_done * threads * repl, t, "threads=%d rounds=%lld", threads, rounds_done);
  return 0;
}
