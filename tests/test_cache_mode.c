/* test_cache_mode: a thread whose cache filled with blocks of other
 * threads' pages sends its own frees there too, and leaves that mode when
 * few blocks of other heaps come any more (src/remote.c, "cache mode").
 *
 * Thread A frees B's blocks of 64 bytes until the class's list is full: A
 * is in cache mode (free_owner is not A's heap). A's own free then goes to
 * the cache too (the block carries the foreign tag) and is A's next malloc
 * of that size. In a forked child, freeing such a cached block of
 * A's own again aborts with hakmem's double-free message. A block of B's
 * above HK_CACHE_BLOCK_MAX that A frees goes straight back to its page,
 * not to the cache. Then A and B
 * free each other's blocks, and their own, thousands of times over sizes
 * 16 B-8 KiB, so that classes overflow (half of a class goes back) and the
 * cache overflows (every class halves): every live block keeps its
 * contents. Last, A replaces its own blocks only: within a few hundred
 * mallocs it is out of cache mode (its cache is empty and its frees go to
 * its pages again).
 * Before all that, thread C, which never allocates, frees 200 of A's
 * blocks: its first 63 frees leave it without a heap, its 64th gives it
 * one, and its next frees are kept in its cache (remote.c,
 * HK_HEAPLESS_FREES), which gives all of them back when the class's list
 * overflows (it allocates nothing); once C has exited, the blocks are A's
 * again.
 *
 * Linked with libhakmem.a (malloc replaced, internal names visible). */
#define _GNU_SOURCE
#include "../src/internal.h"
#include "api.h"

#include <pthread.h>

#define NBLK 4000

#define N64 200 /* more than the 64-byte class's list holds (128) */

static hkt_blk a_own[NBLK], b_own[NBLK], b_64[N64], b_big;
static pthread_barrier_t bar;
static uint64_t seed_next = 1;

static size_t pick_size(uint64_t *rng) {
  uint64_t r = hkt_rand(rng);
  /* mostly up to 1 KiB (the classes with a cache), some up to 8 KiB
   * (above HK_CACHE_BLOCK_MAX: none) */
  return (r & 3) ? 16 + (size_t)(r >> 8) % 1009 : 1024 + (size_t)(r >> 8) % 7169;
}

static void alloc_blk(hkt_blk *b, size_t n) { hkt_blk_alloc(b, n, __atomic_fetch_add(&seed_next, 1, __ATOMIC_RELAXED)); }

/* A block's page: through the page table inside the arena, through its
 * region's records outside it (HAKMEM_ARENA_MB=0, as free's slow path). */
static hk_page *page_of(const void *p) {
  uintptr_t slab = hk_arena_slab((uintptr_t)p);
  return slab < HK_ARENA_SLABS ? hk_arena_page(slab) : hk_page_of(hk_region_of(p), p);
}

/* Sets h's clock an hour ahead: to other threads, h's owner is active
 * until its own page searches note the time again. The tests below that
 * need an active owner do not depend on the scheduler running it within
 * HK_IDLE_OWNER_MS (a loaded machine with two cores may not). */
static void hold_active(hk_heap *h) { hk_store_relaxed(&h->active_ms, hk_os_now_ms() + 3600 * 1000); }

static bool in_cache_mode(void) {
  hk_heap *h = hk_tls_heap;
  return h->free_owner != h;
}

/* B: allocates its blocks, waits; then frees A's blocks and replaces them
 * with its own, while A does the same with B's */
static void *thread_b(void *arg) {
  (void)arg;
  uint64_t rng = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < NBLK; i++) alloc_blk(&b_own[i], pick_size(&rng));
  for (int i = 0; i < N64; i++) alloc_blk(&b_64[i], 64);
  alloc_blk(&b_big, HK_CACHE_BLOCK_MAX + 1);
  /* B counts as active while A frees B's blocks, however long the machine
   * keeps B or A waiting (remote.c, owner_idle); B's next page search sets
   * its clock back to the time */
  hold_active(hk_tls_heap);
  pthread_barrier_wait(&bar); /* 1: B's blocks are there */
  pthread_barrier_wait(&bar); /* 2: A is done with the single-block checks */
  for (int i = 0; i < NBLK; i += 2) { /* A's even blocks: remote frees here */
    hkt_blk_check(&a_own[i], "A's block, freed by B");
    free(a_own[i].p);
    alloc_blk(&a_own[i], pick_size(&rng));
  }
  pthread_barrier_wait(&bar); /* 3 */
  return NULL;
}

#define NC 200
static hkt_blk c_blk[NC];
static int c_heap_at = -1;     /* the free after which C had a heap */
static bool c_kept_after_heap; /* a later free went to C's cache */
static int c_held;             /* blocks in C's cache at the end */

/* C: frees A's blocks, never allocates */
static void *thread_c(void *arg) {
  (void)arg;
  for (int i = 0; i < NC; i++) {
    hkt_blk_check(&c_blk[i], "A's block, freed by C");
    free(c_blk[i].p);
    if (c_heap_at < 0 && hk_tls_heap != &hk_heap_empty) c_heap_at = i;
    if (i == NC - 1) c_kept_after_heap = hk_foreign_tagged(page_of(c_blk[i].p), (hk_block *)c_blk[i].p);
  }
  unsigned cls = hk_size_class(32);
  c_held = (int)(hk_class_cache_max[cls] - hk_tls_heap->cache_room[cls]);
  return NULL;
}

/* A thread that only frees other threads' blocks gets a heap, and a cache */
static void heapless_consumer(void) {
  for (int i = 0; i < NC; i++) alloc_blk(&c_blk[i], 32);
  /* A counts as active while C frees: its blocks are cached, not sent
   * straight back to an idle owner (remote.c, owner_idle) */
  hold_active(hk_tls_heap);
  pthread_t tc;
  CHECK(pthread_create(&tc, NULL, thread_c, NULL) == 0, "pthread_create failed");
  pthread_join(tc, NULL);
  hk_heap_note_active(hk_tls_heap);
  CHECK(c_heap_at == 63, "a thread that only frees had a heap after free %d (0: never), not after its 64th",
        c_heap_at + 1);
  CHECK(c_kept_after_heap, "the freeing thread's last free did not go to its cache");
  /* its class's list overflowed once: a thread that allocates nothing keeps
   * none of it (remote.c, cache_keeps) */
  unsigned max = hk_class_cache_max[hk_size_class(32)];
  CHECK(NC - 64 > (int)max && c_held == NC - 64 - (int)max, "the freeing thread's cache holds %d blocks of 32 bytes, "
        "not %d: the overflow of a list of %u did not give back all of it", c_held, NC - 64 - (int)max, max);
  for (int i = 0; i < NC; i++) alloc_blk(&c_blk[i], 32);
  for (int i = 0; i < NC; i++) {
    hkt_blk_check(&c_blk[i], "a 32-byte block after C's frees");
    free(c_blk[i].p);
  }
}

int main(void) {
  if (hk_secure || hk_thread_stats) { /* no cache in hardened mode, nor with HAKMEM_THREAD_STATS (init.c) */
    printf("test_cache_mode: %s keeps no cache: skipped\n", hk_secure ? "hardened mode" : "HAKMEM_THREAD_STATS");
    return 0;
  }
  heapless_consumer();
  CHECK(pthread_barrier_init(&bar, NULL, 2) == 0, "pthread_barrier_init failed");
  uint64_t rng = 12345;
  for (int i = 0; i < NBLK; i++) alloc_blk(&a_own[i], pick_size(&rng));
  pthread_t tb;
  CHECK(pthread_create(&tb, NULL, thread_b, NULL) == 0, "pthread_create failed");
  pthread_barrier_wait(&bar); /* 1 */

  /* remote frees until the 64-byte class's list is full: cache mode */
  CHECK(!in_cache_mode(), "in cache mode before any remote free");
  hkt_blk spare;
  alloc_blk(&spare, 64); /* keeps the 64-byte class's page in use */
  int kept = 0;
  for (; kept < N64 && !in_cache_mode(); kept++) {
    hkt_blk_check(&b_64[kept], "B's 64-byte block");
    free(b_64[kept].p);
  }
  CHECK(in_cache_mode(), "%d remote frees of one class did not start cache mode", kept);
  CHECK(kept > 64, "cache mode after %d remote frees only: the class's list holds 128", kept);
  for (int i = kept; i < N64; i++) free(b_64[i].p);

  /* a block above HK_CACHE_BLOCK_MAX goes straight back to its page, in
   * cache mode too */
  hkt_blk_check(&b_big, "B's block above HK_CACHE_BLOCK_MAX");
  hk_page *big_page = page_of(b_big.p);
  uint64_t sent = hk_tls_heap->stats.remote_frees;
  free(b_big.p);
  CHECK(hk_tls_heap->stats.remote_frees == sent + 1 && hk_tls_heap->cache_first[big_page->cls] == NULL,
        "a remote free of a block of %zu bytes was kept in the cache", (size_t)HK_CACHE_BLOCK_MAX + 1);

  /* an own free goes to the cache and comes back first (a class with no
   * cached block, so that the block reused is this thread's own) */
  hkt_blk mine;
  alloc_blk(&mine, 48);
  hk_page *page = page_of(mine.p);
  CHECK(hk_is_carved_block(page, (uintptr_t)mine.p), "block %p not found in the page table", (void *)mine.p);
  unsigned char *was = mine.p;
  free(mine.p);
  CHECK(atomic_load_explicit(&page->heap, memory_order_relaxed) == hk_tls_heap, "the 48-byte block is not the thread's own");
  CHECK(hk_foreign_tagged(page, (hk_block *)was), "own free in cache mode did not go to the cache");
  alloc_blk(&mine, 48);
  CHECK(mine.p == was, "own block freed in cache mode not reused first: got %p, freed %p", (void *)mine.p,
        (void *)was);

  /* freeing a cached block of one's own again is a double free */
  free(mine.p);
  hkt_expect_double_free(was, "a cached block of the thread's own");
  alloc_blk(&mine, 64);

  pthread_barrier_wait(&bar); /* 2 */
  /* B's odd blocks and A's own odd blocks, interleaved: local and remote frees */
  for (int round = 0; round < 3; round++)
    for (int i = 1; i < NBLK; i += 2) {
      hkt_blk_check(&b_own[i], "B's block, freed by A");
      free(b_own[i].p);
      alloc_blk(&b_own[i], pick_size(&rng));
      hkt_blk_check(&a_own[i], "A's own block");
      free(a_own[i].p);
      alloc_blk(&a_own[i], pick_size(&rng));
    }
  pthread_barrier_wait(&bar); /* 3 */
  pthread_join(tb, NULL);
  /* (B, waiting, may count as idle by now: its blocks then go straight
   * back, and A may have left cache mode already) */

  /* own blocks only: the mode ends */
  int ops = 0;
  for (; ops < 2000 && in_cache_mode(); ops++) {
    int i = 1 + 2 * (int)(hkt_rand(&rng) % (NBLK / 2));
    hkt_blk_check(&a_own[i], "A's own block (own frees only)");
    free(a_own[i].p);
    alloc_blk(&a_own[i], pick_size(&rng));
  }
  CHECK(!in_cache_mode(), "still in cache mode after %d own frees and mallocs", ops);
  CHECK(hk_tls_heap->free_owner == hk_tls_heap, "free_owner not restored");
  hkt_blk after;
  alloc_blk(&after, 64);
  page = page_of(after.p);
  free(after.p);
  CHECK(!hk_foreign_tagged(page, (hk_block *)after.p), "own free after cache mode still went to the cache");

  for (int i = 0; i < NBLK; i++) {
    hkt_blk_check(&a_own[i], "final A");
    hkt_blk_check(&b_own[i], "final B");
    free(a_own[i].p);
    free(b_own[i].p);
  }
  hkt_blk_check(&mine, "final own block");
  hkt_blk_check(&spare, "final spare");
  free(mine.p);
  free(spare.p);
  printf("test_cache_mode: a thread that only frees had a heap after its 64th free and cached the next; "
         "cache mode began after %d remote frees of one class, took own frees (reused first, "
         "double free caught), kept %d blocks intact over %d mixed frees, ended after %d own-only operations\n",
         kept, 2 * NBLK, 3 * NBLK, ops);
  return 0;
}
