/* test_adopt: a thread adopts an exited thread's empty page only when it
 * has no page left to carve (src/queue.c, find_page; src/abandoned.c), and
 * threads that exit one after another, each leaving a few blocks live, do
 * not make the memory grow beyond those blocks.
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

/* Threads that exit leaving blocks behind: STRAND_THREADS threads, one
 * after another, each allocate STRAND_BLOCKS blocks of 16 to 2,015 bytes,
 * keep one in STRAND_KEEP and free the rest. The pages the kept blocks
 * fill go back to the exited threads' lists with no block free; were the
 * next threads to adopt them, they would find no block in them and take a
 * fresh page for each class instead, which the thread's exit leaves empty
 * (and kept for adoption, which prefers pages in use), and the spans in
 * use would grow with every thread run. */
#define STRAND_THREADS 600
#define STRAND_MORE 200 /* run while the first ones' blocks are freed */
#define STRAND_BLOCKS 1000
#define STRAND_KEEP 100
#define STRAND_KEPT ((STRAND_THREADS + STRAND_MORE) * (STRAND_BLOCKS / STRAND_KEEP))
static unsigned char *stranded[STRAND_KEPT];
static size_t stranded_size[STRAND_KEPT];
static int nstranded; /* written by the strander running (one at a time), read after its join */

static size_t strand_size(uint64_t *rng) {
  *rng ^= *rng << 13, *rng ^= *rng >> 7, *rng ^= *rng << 17;
  return 16 + (size_t)(*rng % 2000);
}

static void *strander(void *arg) {
  uint64_t rng = (uint64_t)(uintptr_t)arg * 0x9e3779b97f4a7c15ull | 1;
  static unsigned char *p[STRAND_BLOCKS];
  static size_t n[STRAND_BLOCKS];
  int kept = nstranded;
  for (int i = 0; i < STRAND_BLOCKS; i++) {
    n[i] = strand_size(&rng);
    p[i] = (unsigned char *)API(malloc)(n[i]);
    CHECK(p[i] != NULL, "malloc(%zu) failed", n[i]);
    hkt_fill(p[i], n[i], (uint64_t)(uintptr_t)p[i]);
  }
  for (int i = 0; i < STRAND_BLOCKS; i++) {
    CHECK(hkt_verify(p[i], n[i], (uint64_t)(uintptr_t)p[i]) == HKT_OK, "a block of %zu bytes was corrupted", n[i]);
    if (i % STRAND_KEEP == 0) {
      stranded_size[kept] = n[i];
      stranded[kept++] = p[i];
    } else {
      API(free)(p[i]);
    }
  }
  nstranded = kept;
  return NULL;
}

static void run_stranders(int from, int to) {
  for (int t = from; t < to; t++) {
    pthread_t th;
    CHECK(pthread_create(&th, NULL, strander, (void *)(uintptr_t)(t + 1)) == 0, "pthread_create failed");
    pthread_join(th, NULL);
  }
}

/* Free kept blocks from..to-1, each checked first */
static void free_kept(int from, int to) {
  for (int i = from; i < to; i++) {
    CHECK(hkt_verify(stranded[i], stranded_size[i], (uint64_t)(uintptr_t)stranded[i]) == HKT_OK,
          "a kept block of %zu bytes was corrupted", stranded_size[i]);
    API(free)(stranded[i]);
  }
}
static int first_kept; /* the first STRAND_THREADS threads' kept blocks: [0, first_kept) */
static void *free_first_kept(void *arg) {
  (void)arg;
  free_kept(0, first_kept);
  return NULL;
}

static void strand_threads(void) {
  run_stranders(0, STRAND_THREADS);
  struct hak_stats s;
  CHECK(hak_stats_get(&s, sizeof s) == 0, "hak_stats_get failed");
  unsigned long long kept = 0;
  for (int i = 0; i < nstranded; i++) kept += stranded_size[i];
  printf("test_adopt (%s): %d threads leaving %d blocks (%llu B): page_bytes %llu B, small live bytes %llu B\n",
         API_MODE, STRAND_THREADS, nstranded, kept, s.page_bytes, s.small_live_bytes);
  CHECK(s.page_bytes <= 2 * s.small_live_bytes + ((unsigned long long)8 << 20),
        "the spans in use (%llu B) grew with the threads: %llu B live", s.page_bytes, s.small_live_bytes);
  /* Their kept blocks freed by another thread (to pages of exited threads,
   * most of them full, which join the pages in use at their first free)
   * while more threads adopt those pages and leave blocks in them; then
   * the rest: every page empties and, at a trim, goes back. */
  first_kept = nstranded;
  pthread_t freer;
  CHECK(pthread_create(&freer, NULL, free_first_kept, NULL) == 0, "pthread_create failed");
  run_stranders(STRAND_THREADS, STRAND_THREADS + STRAND_MORE);
  pthread_join(freer, NULL);
  free_kept(first_kept, nstranded);
  API(malloc_trim)(0);
  CHECK(hak_stats_get(&s, sizeof s) == 0, "hak_stats_get failed");
  printf("test_adopt (%s): all %d freed and trimmed: page_bytes %llu B\n", API_MODE, nstranded, s.page_bytes);
  CHECK(s.page_bytes <= ((unsigned long long)4 << 20), "%llu B of spans still in use after every block was freed",
        s.page_bytes);
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
  strand_threads();
  return 0;
}
