/* test_adopt: a thread adopts an exited thread's empty page only when it
 * has no page left to carve (src/queue.c, find_page; src/abandoned.c).
 *
 * Thread A allocates 640 blocks of 1000 bytes (ten pages or more of one
 * slab, all kept for adoption once empty), frees them, and exits. Thread
 * B then allocates 100 blocks of the same size: they lie in at most two
 * pages, both adopted. An
 * empty page kept for adoption has only a few blocks carved: adopted
 * whenever those ran out, B took one kept page after another, ten pages
 * for its first 40-odd blocks, and under thread churn every kept page
 * stayed in use. */
#define _GNU_SOURCE
#include "api.h"

#include <pthread.h>

#define SIZE 1000
#define A_BLOCKS 640
#define B_BLOCKS 100
#define SLAB ((uintptr_t)64 << 10)

/* n blocks of SIZE bytes, each filled from seed i * mul */
static void alloc_filled(unsigned char **p, int n, uint64_t mul) {
  for (int i = 0; i < n; i++) {
    p[i] = (unsigned char *)API(malloc)(SIZE);
    CHECK(p[i] != NULL, "malloc failed");
    hkt_fill(p[i], SIZE, (uint64_t)i * mul);
  }
}

static void check_and_free(unsigned char **p, int n, uint64_t mul, const char *who) {
  for (int i = 0; i < n; i++) {
    CHECK(hkt_verify(p[i], SIZE, (uint64_t)i * mul) == HKT_OK, "%s block %d was corrupted", who, i);
    API(free)(p[i]);
  }
}

static void *thread_a(void *arg) {
  (void)arg;
  static unsigned char *p[A_BLOCKS];
  alloc_filled(p, A_BLOCKS, 1);
  check_and_free(p, A_BLOCKS, 1, "A's");
  return NULL;
}

static uintptr_t slabs[B_BLOCKS];
static int nslabs;

static void *thread_b(void *arg) {
  (void)arg;
  static unsigned char *p[B_BLOCKS];
  alloc_filled(p, B_BLOCKS, 7);
  for (int i = 0; i < B_BLOCKS; i++) {
    uintptr_t s = (uintptr_t)p[i] & ~(SLAB - 1);
    int k = 0;
    while (k < nslabs && slabs[k] != s) k++;
    if (k == nslabs) slabs[nslabs++] = s;
  }
  check_and_free(p, B_BLOCKS, 7, "B's");
  return NULL;
}

int main(void) {
  pthread_t t;
  CHECK(pthread_create(&t, NULL, thread_a, NULL) == 0, "pthread_create failed");
  pthread_join(t, NULL);
  long kept = hkt_stat("empty pages of exited threads kept now");
  long adopted_before = hkt_stat("pages adopted from exited threads");
  CHECK(kept >= 10, "only %ld empty pages of the exited thread kept", kept);
  CHECK(pthread_create(&t, NULL, thread_b, NULL) == 0, "pthread_create failed");
  pthread_join(t, NULL);
  long adopted = hkt_stat("pages adopted from exited threads") - adopted_before;
  printf("test_adopt (%s): %ld empty pages kept; %d blocks of the next thread in %d pages, %ld adopted\n", API_MODE,
         kept, B_BLOCKS, nslabs, adopted);
  CHECK(nslabs <= 2, "%d blocks of %d bytes spread over %d pages", B_BLOCKS, SIZE, nslabs);
  CHECK(adopted >= 1 && adopted <= nslabs, "%ld pages adopted for blocks in %d pages", adopted, nslabs);
  return 0;
}
