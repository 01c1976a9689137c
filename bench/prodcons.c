/* prodcons PAIRS BLOCKS
 * PAIRS producer->consumer thread pairs. Each producer allocates BLOCKS
 * blocks (16-512 B), stamps them and passes them, in batches of 64, through
 * a single-producer single-consumer ring; its consumer checks and frees
 * them, so every free is a remote free. (Batches keep the ring's own
 * cache-line traffic small next to the allocator's.) ops = blocks passed by
 * all pairs. */
#include "bench_util.h" /* first: it defines _GNU_SOURCE */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#define RING 16  /* batches in flight per pair */
#define BATCH 64 /* blocks per batch */

typedef struct {
  _Alignas(64) _Atomic unsigned long head; /* next batch the producer fills */
  _Alignas(64) _Atomic unsigned long tail; /* next batch the consumer empties */
  _Alignas(64) void *slot[RING][BATCH];
  int id;
} ring_t;

static long long nblocks;

static size_t block_size(bu_rng *r) { return bu_range(r, 16, 512); }

static void *producer(void *arg) {
  ring_t *q = arg;
  bu_rng rng;
  bu_seed(&rng, 500 + (uint64_t)q->id);
  for (long long i = 0; i < nblocks; i += BATCH) {
    unsigned long h = atomic_load_explicit(&q->head, memory_order_relaxed);
    while (h - atomic_load_explicit(&q->tail, memory_order_acquire) == RING) sched_yield();
    for (int j = 0; j < BATCH; j++) {
      size_t n = block_size(&rng);
      void *p = bu_malloc(n);
      bu_stamp(p, n);
      q->slot[h % RING][j] = p;
    }
    atomic_store_explicit(&q->head, h + 1, memory_order_release);
  }
  return NULL;
}

static void *consumer(void *arg) {
  ring_t *q = arg;
  bu_rng rng; /* same seed as the producer: recomputes each block's size */
  bu_seed(&rng, 500 + (uint64_t)q->id);
  for (long long i = 0; i < nblocks; i += BATCH) {
    unsigned long t = atomic_load_explicit(&q->tail, memory_order_relaxed);
    while (atomic_load_explicit(&q->head, memory_order_acquire) == t) sched_yield();
    for (int j = 0; j < BATCH; j++) {
      size_t n = block_size(&rng);
      void *p = q->slot[t % RING][j];
      bu_check(p, n, "prodcons");
      free(p);
    }
    atomic_store_explicit(&q->tail, t + 1, memory_order_release);
  }
  return NULL;
}

int main(int argc, char **argv) {
  int pairs = (int)bu_arg(argc, argv, 1, 2);
  nblocks = (bu_arg(argc, argv, 2, 1000000) + BATCH - 1) / BATCH * BATCH;
  if (pairs < 1 || pairs > 64) return 64;
  ring_t *q = aligned_alloc(64, (size_t)pairs * sizeof *q);
  if (!q) return 3;
  memset(q, 0, (size_t)pairs * sizeof *q);
  pthread_t th[128];

  double t0 = bu_now();
  for (int i = 0; i < pairs; i++) {
    q[i].id = i;
    pthread_create(&th[2 * i], NULL, consumer, &q[i]);
    pthread_create(&th[2 * i + 1], NULL, producer, &q[i]);
  }
  for (int i = 0; i < 2 * pairs; i++) pthread_join(th[i], NULL);
  double t = bu_now() - t0;
  bu_result("prodcons", (double)pairs * (double)nblocks, t, "pairs=%d", pairs);
  free(q);
  return 0;
}
