/* test_large_realloc_race: one thread allocates 1-4 MiB blocks and hands
 * them to another, which grows each with realloc and frees it. realloc of a
 * large block may move its mapping; the old address is then free, and the
 * first thread's next mapping can land there. The mover must take the old
 * address out of the ownership bitmap before the move: taken out after it,
 * it would clear the new mapping's bit, and that block's realloc would
 * abort with "not allocated by hakmem" (docs/DESIGN.md, "Large tier").
 */
#include "api.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define BLOCKS 100000
#define RING 64
#define MiB ((size_t)1 << 20)

static void *_Atomic ring[RING];

static void *producer(void *arg) {
  (void)arg;
  uint64_t s = 1;
  for (long i = 0; i < BLOCKS; i++) {
    size_t n = MiB + hkt_rand(&s) % (3 * MiB);
    unsigned char *p = (unsigned char *)API(malloc)(n);
    CHECK(p != NULL, "malloc(%zu) failed", n);
    memcpy(p, &n, sizeof n);
    p[n - 1] = 0xa5;
    for (;;) {
      for (int k = 0; k < RING; k++) {
        void *empty = NULL;
        if (atomic_compare_exchange_strong(&ring[k], &empty, p)) goto passed;
      }
    }
  passed:;
  }
  return NULL;
}

static void *consumer(void *arg) {
  (void)arg;
  uint64_t s = 7;
  for (long got = 0; got < BLOCKS;) {
    for (int k = 0; k < RING && got < BLOCKS; k++) {
      unsigned char *p = (unsigned char *)atomic_exchange(&ring[k], NULL);
      if (p == NULL) continue;
      size_t n;
      memcpy(&n, p, sizeof n);
      CHECK(p[n - 1] == 0xa5, "block %ld: last byte changed", got);
      size_t m = n + hkt_rand(&s) % (2 * MiB) + 1;
      unsigned char *q = (unsigned char *)API(realloc)(p, m);
      CHECK(q != NULL, "realloc(%zu -> %zu) failed", n, m);
      size_t n2;
      memcpy(&n2, q, sizeof n2);
      CHECK(n2 == n && q[n - 1] == 0xa5, "block %ld: contents lost in realloc", got);
      q[m - 1] = 0x5a;
      API(free)(q);
      got++;
    }
  }
  return NULL;
}

int main(void) {
  pthread_t a, b;
  CHECK(pthread_create(&a, NULL, producer, NULL) == 0, "pthread_create");
  CHECK(pthread_create(&b, NULL, consumer, NULL) == 0, "pthread_create");
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  printf("test_large_realloc_race: %d blocks of 1-4 MiB allocated by one thread, grown and freed by another\n",
         BLOCKS);
  return 0;
}
