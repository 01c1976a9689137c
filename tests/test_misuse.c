/* test_misuse: invalid frees and double frees must be reported on stderr
 * with a message naming hakmem, followed by abort() (hakmem.h contract).
 *
 * Each case runs in a forked child with stderr captured through a pipe; the
 * child must die of SIGABRT and its stderr must contain "hakmem".
 */
#define _GNU_SOURCE
#include "api.h"

#include <errno.h>
#include <stdbool.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static char global_buf[256];

/* Each case does one invalid operation; if it returns, the allocator did not
 * detect it. */
static void free_stack(void) {
  char local[64];
  memset(local, 1, sizeof local);
  API(free)(hkt_opaque_ptr(local));
}
static void free_global(void) { API(free)(hkt_opaque_ptr(global_buf + 16)); }
static void free_interior(void) {
  char *p = (char *)API(malloc)(64);
  CHECK(p != NULL, "malloc failed");
  API(free)(hkt_opaque_ptr(p + 32));
}
static void free_misaligned(void) {
  char *p = (char *)API(malloc)(64);
  CHECK(p != NULL, "malloc failed");
  API(free)(hkt_opaque_ptr(p + 1));
}
static void double_free_small(void) {
  void *p = API(malloc)(32);
  CHECK(p != NULL, "malloc failed");
  API(free)(p);
  API(free)(hkt_opaque_ptr(p));
}
static void double_free_small_later(void) {
  void *keep = API(malloc)(32);
  void *p = API(malloc)(32), *q = API(malloc)(32), *r = API(malloc)(32);
  CHECK(keep && p && q && r, "malloc failed");
  API(free)(p);
  API(free)(q);
  void *s = API(malloc)(100);
  API(free)(r);
  API(free)(s);
  API(free)(hkt_opaque_ptr(p)); /* p is no longer the head of the free list */
}
static void double_free_medium(void) {
  void *p = API(malloc)(200 * KiB);
  CHECK(p != NULL, "malloc failed");
  memset(p, 1, 200 * KiB);
  API(free)(p);
  API(free)(hkt_opaque_ptr(p));
}
static void double_free_large(void) {
  void *p = API(malloc)(4 * MiB);
  CHECK(p != NULL, "malloc failed");
  memset(p, 1, 4096);
  API(free)(p);
  API(free)(hkt_opaque_ptr(p));
}
static void realloc_freed(void) {
  void *p = API(malloc)(48);
  CHECK(p != NULL, "malloc failed");
  API(free)(p);
  void *q = API(realloc)(hkt_opaque_ptr(p), 100);
  (void)q;
}
/* the same size, from another thread: realloc has nothing to move */
static void *realloc_48(void *p) { return API(realloc)(hkt_opaque_ptr(p), 48); }
static void realloc_freed_other_thread(void) {
  void *p = API(malloc)(48);
  CHECK(p != NULL, "malloc failed");
  API(free)(p);
  pthread_t t;
  CHECK(pthread_create(&t, NULL, realloc_48, p) == 0, "pthread_create failed");
  pthread_join(t, NULL);
}
/* a block alone in its span (about 1 MiB), freed and held by its thread
 * off the page's lists: a same-size realloc would resize it in place */
static void realloc_freed_span_block(void) {
  void *p = API(malloc)(999965), *keep = API(malloc)(999965);
  CHECK(p != NULL && keep != NULL, "malloc failed");
  API(free)(p);
  void *q = API(realloc)(hkt_opaque_ptr(p), 999965);
  (void)q;
}
static void free_mmap(void) {
  void *p = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(p != MAP_FAILED, "mmap failed");
  API(free)(hkt_opaque_ptr(p));
}
static void free_mmap_2mib_aligned(void) {
  /* looks like the start of a hakmem region (2 MiB-aligned), but is not one */
  char *p = (char *)mmap(NULL, 6 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(p != MAP_FAILED, "mmap failed");
  char *a = (char *)(((uintptr_t)p + 2 * MiB - 1) & ~(uintptr_t)(2 * MiB - 1));
  memset(a, 0, 8192);
  API(free)(hkt_opaque_ptr(a + 4096));
}
static void free_interior_large(void) {
  char *p = (char *)API(malloc)(4 * MiB);
  CHECK(p != NULL, "malloc failed");
  API(free)(hkt_opaque_ptr(p + 8192));
}
static void free_interior_medium(void) {
  char *p = (char *)API(malloc)(200 * KiB);
  CHECK(p != NULL, "malloc failed");
  API(free)(hkt_opaque_ptr(p + 4096));
}
/* A 256 KiB block is coloured (src/page.c): it starts 0-4032 bytes into
 * its span. Freeing the span's start, below the block, is invalid (when the
 * colour is 0 the span's start is the block: step past it, then back). */
static void free_before_colored(void) {
  char *p = (char *)API(malloc)(256 * KiB);
  CHECK(p != NULL, "malloc failed");
  uintptr_t below = ((uintptr_t)p & ~(uintptr_t)0xffff) - ((uintptr_t)p % 65536 == 0 ? 64 : 0);
  API(free)(hkt_opaque_ptr((void *)below));
}
static void double_free_colored(void) {
  void *p = API(malloc)(64 * KiB);
  CHECK(p != NULL, "malloc failed");
  API(free)(p);
  API(free)(hkt_opaque_ptr(p));
}
/* a 128 KiB block alone in its page, not the class's current page (b's,
 * allocated after it): its free keeps it in the heap's stash (src/queue.c),
 * where it carries the foreign tag */
static void double_free_stashed(void) {
  void *a = API(malloc)(128 * KiB), *b = API(malloc)(128 * KiB);
  CHECK(a != NULL && b != NULL, "malloc failed");
  memset(a, 1, 128 * KiB);
  API(free)(a);
  API(free)(hkt_opaque_ptr(a));
  API(free)(b);
}
/* a 1 KiB block of a full page (of 1,500: its page, among 23 of 64
 * blocks, is parked on the full list): its free keeps it in the stash too */
static void double_free_stashed_parked(void) {
  static void *p[1500];
  for (int i = 0; i < 1500; i++) CHECK((p[i] = API(malloc)(KiB)) != NULL, "malloc failed");
  API(free)(p[3]);
  API(free)(hkt_opaque_ptr(p[3]));
}
static void double_free_aligned(void) {
  void *p = API(aligned_alloc)(256, 300);
  CHECK(p != NULL, "aligned_alloc failed");
  API(free)(p);
  API(free)(hkt_opaque_ptr(p));
}
static void double_free_aligned_large(void) {
  void *p = API(aligned_alloc)(MiB, 100); /* alignment > 64 KiB: large tier */
  CHECK(p != NULL, "aligned_alloc failed");
  API(free)(p);
  API(free)(hkt_opaque_ptr(p));
}
/* a block boundary in a page, but past the blocks carved so far: never
 * handed out (3 KiB blocks are carved one 4 KiB step at a time) */
static void free_never_allocated(void) {
  char *p = (char *)API(malloc)(3000);
  CHECK(p != NULL, "malloc failed");
  size_t bs = API(malloc_usable_size)(p);
  API(free)(hkt_opaque_ptr(p + 8 * bs));
}
static void realloc_stack(void) {
  char local[32];
  memset(local, 0, sizeof local);
  void *q = API(realloc)(hkt_opaque_ptr(local), 100);
  (void)q;
}

static void *thread_free(void *p) {
  API(free)(p);
  return NULL;
}
static void *thread_alloc(void *arg) {
  (void)arg;
  void *p = API(malloc)(40);
  CHECK(p != NULL, "malloc failed");
  return p;
}
/* first free by another thread, second by this one */
static void double_free_cross_thread(void) {
  void *p = API(malloc)(40);
  void *other = API(malloc)(40); /* keeps the page in use */
  CHECK(p && other, "malloc failed");
  pthread_t t;
  CHECK(pthread_create(&t, NULL, thread_free, p) == 0, "pthread_create failed");
  pthread_join(t, NULL);
  API(free)(hkt_opaque_ptr(p));
}
/* a block allocated by a thread that has exited, freed twice here */
static void double_free_remote(void) {
  pthread_t t;
  void *p = NULL, *keep = NULL;
  CHECK(pthread_create(&t, NULL, thread_alloc, NULL) == 0, "pthread_create failed");
  pthread_join(t, &p);
  CHECK(p != NULL, "thread_alloc failed");
  CHECK(pthread_create(&t, NULL, thread_alloc, NULL) == 0, "pthread_create failed");
  pthread_join(t, &keep); /* a second live block on a (maybe) abandoned page */
  API(free)(p);
  API(free)(hkt_opaque_ptr(p));
}
/* both frees remote (from two other threads) while the owner is alive */
static void *owner_keeps_alive(void *arg) {
  void **slot = (void **)arg;
  void *p = API(malloc)(40);
  void *other = API(malloc)(40);
  CHECK(p && other, "malloc failed");
  *slot = p;
  return NULL;
}
static void double_free_two_remote(void) {
  void *p = NULL;
  pthread_t t;
  pthread_create(&t, NULL, owner_keeps_alive, &p);
  pthread_join(t, NULL);
  CHECK(p != NULL, "owner thread failed");
  pthread_create(&t, NULL, thread_free, p);
  pthread_join(t, NULL);
  pthread_create(&t, NULL, thread_free, hkt_opaque_ptr(p));
  pthread_join(t, NULL);
}
/* The first free by a thread that stays alive: the block sits in that
 * thread's cache of remote-freed blocks (src/remote.c), not on its page.
 * The second free comes from the owner, from the same thread, or from a
 * third thread. */
static pthread_barrier_t keeper_freed, keeper_done;
static void *keeper(void *p) {
  void *mine = API(malloc)(16); /* a thread keeps such blocks once it has a heap */
  CHECK(mine != NULL, "malloc failed");
  API(free)(p);
  pthread_barrier_wait(&keeper_freed);
  pthread_barrier_wait(&keeper_done); /* never passed: the process aborts first */
  return NULL;
}
static void *start_keeper(size_t size) {
  void *p = API(malloc)(size);
  void *other = API(malloc)(size); /* keeps the page in use */
  CHECK(p && other, "malloc failed");
  pthread_barrier_init(&keeper_freed, NULL, 2);
  pthread_barrier_init(&keeper_done, NULL, 2);
  pthread_t t;
  CHECK(pthread_create(&t, NULL, keeper, p) == 0, "pthread_create failed");
  pthread_barrier_wait(&keeper_freed);
  return p;
}
static void double_free_kept_then_owner(void) { API(free)(hkt_opaque_ptr(start_keeper(40))); }
static void double_free_kept_then_third(void) {
  void *p = start_keeper(200);
  pthread_t t;
  pthread_create(&t, NULL, thread_free, hkt_opaque_ptr(p));
  pthread_join(t, NULL);
}
static void *free_twice(void *p) {
  void *mine = API(malloc)(16);
  CHECK(mine != NULL, "malloc failed");
  API(free)(p);
  API(free)(hkt_opaque_ptr(p));
  return NULL;
}
static void double_free_same_other_thread(void) {
  void *p = API(malloc)(64);
  void *other = API(malloc)(64);
  CHECK(p && other, "malloc failed");
  pthread_t t;
  pthread_create(&t, NULL, free_twice, p);
  pthread_join(t, NULL);
}

/* ---- cases only hardened mode detects (docs/SAFETY.md) ---- */
/* one byte after the request, the canary not on a word boundary */
static void overflow_1_byte_unaligned_canary(void) {
  char *p = (char *)API(malloc)(21);
  CHECK(p != NULL, "malloc failed");
  p[hkt_opaque(21)] = 'x';
  API(free)(p);
}
/* one byte after the request, a word-aligned canary */
static void overflow_1_byte(void) {
  char *p = (char *)API(malloc)(200);
  CHECK(p != NULL, "malloc failed");
  p[hkt_opaque(200)] = 'x';
  API(free)(p);
}
/* a write at the end of the canary (bytes 200..231 after a 200-byte request);
 * its bytes but the first are secret, so the write flips the byte's bits:
 * a fixed value would equal it one run in 256 */
static void overflow_far(void) {
  char *p = (char *)API(malloc)(200);
  CHECK(p != NULL, "malloc failed");
  p[hkt_opaque(207)] ^= 0x5a;
  API(free)(p);
}
/* a freed block written, then handed out again (after the quarantine gave it back) */
static void write_after_free(void) {
  char *keep = (char *)API(malloc)(64); /* (the page stays: the trim below keeps it) */
  char *p = (char *)API(malloc)(64);
  CHECK(keep != NULL && p != NULL, "malloc failed");
  API(free)(p);
  p[hkt_opaque(20)] = 1;
  API(malloc_trim)(0); /* (hardened mode's quarantine gives p back to its page) */
  for (int i = 0; i < 1024 && API(malloc)(64) != p; i++) {
  }
}
/* a write just past a large block: on its canary (the block starts at a
 * cache-line offset into its first page, so its end is as far from the
 * guard page after it), reported by free */
static void overflow_large_canary(void) {
  size_t n = 4 * MiB;
  char *p = (char *)API(malloc)(n);
  CHECK(p != NULL, "malloc failed");
  p[hkt_opaque(n)] = 1;
  API(free)(p);
}
/* a write running on past a large block lands on its guard page */
static void overflow_large_guard(void) {
  size_t n = 4 * MiB;
  char *p = (char *)API(malloc)(n);
  CHECK(p != NULL, "malloc failed");
  /* (past the slack in the block's last page, to the guard after it) */
  for (volatile char *q = hkt_opaque_ptr(p + n); q < p + n + 2 * hkt_page(); q++) *q = 0x41;
  API(free)(p);
}
/* the same in a cached 8 MiB mapping reused for the 4 MiB block (which
 * starts in the page after the guard before it, as ending at the guard
 * after it would start it past its header's 4 MiB unit) */
static void overflow_large_reused(void) {
  char *big = (char *)API(malloc)(8 * MiB);
  CHECK(big != NULL, "malloc failed");
  API(free)(big);
  size_t n = 4 * MiB;
  char *p = (char *)API(malloc)(n);
  CHECK(p != NULL, "malloc failed");
  memset(p, 1, n); /* the block is all writable */
  p[hkt_opaque(n)] = 1;
  API(free)(p);
}
/* a write running on past a block that realloc grew in a cached 8 MiB
 * mapping to 6 MiB, then moved to 24 MiB: the guard follows the mapping's
 * end */
static void overflow_large_realloc(void) {
  char *p = (char *)API(malloc)(8 * MiB);
  CHECK(p != NULL, "malloc failed");
  API(free)(p);
  p = (char *)API(malloc)(4 * MiB);
  CHECK(p != NULL, "malloc failed");
  p = (char *)API(realloc)(p, 6 * MiB);
  CHECK(p != NULL, "realloc failed");
  memset(p, 1, 6 * MiB);
  p = (char *)API(realloc)(p, 24 * MiB);
  CHECK(p != NULL, "realloc failed");
  memset(p, 2, 24 * MiB);
  char *end = p + hkt_opaque(24 * MiB);
  while (((uintptr_t)end & (hkt_page() - 1)) != 0) *end++ = 3; /* (the rest of its last page: slack) */
  *end = 4;
}

/* a write below the first block of a region, toward its header in slab 0,
 * lands on a guard page */
static void underflow_region_start(void) {
  char *p = hkt_block_at_region_offset(hkt_region_blocks_start());
  CHECK(p != NULL, "no 4 KiB block at the start of a region's blocks in 16 MiB of them");
  memset(hkt_opaque_ptr(p - 8 * KiB), 0x41, 8 * KiB);
}
/* a write past the last block of a region, toward the next region's
 * header, lands on a guard page (in the arena: a region mapped elsewhere,
 * as under a small HAKMEM_ARENA_MB, has no neighbour of ours). Hardened
 * mode, and pages of 32 KiB or more, leave slab 63 unused, its last page a
 * guard (hkt_region_blocks_end). */
static int secure_level;
static void overflow_region_end(void) {
  const char *arena = getenv("HAKMEM_ARENA_MB");
  if (arena != NULL && atol(arena) < 1024) raise(SIGSEGV); /* (the outcome is not hakmem's to give: counted as expected) */
  size_t end = hkt_region_blocks_end(secure_level);
  char *p = hkt_block_at_region_offset(end - 4 * KiB);
  CHECK(p != NULL, "no 4 KiB block at the end of a region in 16 MiB of them");
  /* the next region made too: its slab 0 is then mapped, but for its header */
  uintptr_t next = ((uintptr_t)p & ~(uintptr_t)(4 * MiB - 1)) + 4 * MiB;
  int i = 0;
  while (i < 4096 && ((uintptr_t)API(malloc)(4000) & ~(uintptr_t)(4 * MiB - 1)) != next) i++;
  CHECK(i < 4096, "the region after a full one is not the next to be made");
  memset(hkt_opaque_ptr(p + 4 * KiB), 0x41, 4 * MiB - end + 8 * KiB);
}

/* a write running down from a 4 MiB block toward the start of its mapping
 * (4 MiB-aligned, its header there) lands on a guard page first */
static void underflow_large(void) {
  size_t n = 4 * MiB;
  char *p = (char *)API(malloc)(n);
  CHECK(p != NULL, "malloc failed");
  volatile char *base = (char *)((uintptr_t)p & ~(uintptr_t)(4 * MiB - 1));
  for (volatile char *q = hkt_opaque_ptr(p); q-- > base + 64;) *q = 0x41;
  API(free)(p);
}

/* the same after realloc grew the block to 64 MiB, in place or moved
 * (with other large blocks after it, most often moved): its guard went
 * with it */
static void underflow_large_grown(void) {
  char *p = (char *)API(malloc)(4 * MiB);
  CHECK(p != NULL, "malloc failed");
  for (int i = 0; i < 4; i++) CHECK(API(malloc)(4 * MiB) != NULL, "malloc failed");
  p = (char *)API(realloc)(p, 64 * MiB);
  CHECK(p != NULL, "realloc failed");
  volatile char *base = (char *)((uintptr_t)p & ~(uintptr_t)(4 * MiB - 1));
  for (volatile char *q = hkt_opaque_ptr(p); q-- > base + 64;) *q = 0x41;
  API(free)(p);
}

/* a pointer into the tail a block gave back when realloc shrank it in place */
static void free_into_shrunk_tail(void) {
  char *p = (char *)API(malloc)(512 * KiB);
  CHECK(p != NULL, "malloc failed");
  char *q = (char *)API(realloc)(p, 100 * KiB);
  CHECK(q != NULL, "realloc failed");
  API(free)(hkt_opaque_ptr(q + 256 * KiB));
}

/* a block freed again after another thread freed every block of its page
 * while the owner waited, so the page's memory went back to the OS */
enum { RECLAIM_N = 256 }; /* x 1000 B: a few full pages */
static void *reclaim_blocks[RECLAIM_N];
static void *free_reclaim_blocks(void *arg) {
  (void)arg;
  struct timespec d = {0, 30 * 1000 * 1000}; /* the owner is idle meanwhile */
  nanosleep(&d, NULL);
  for (int i = 0; i < RECLAIM_N; i++) API(free)(reclaim_blocks[i]);
  return NULL;
}
static void double_free_reclaimed(void) {
  for (int i = 0; i < RECLAIM_N; i++) {
    reclaim_blocks[i] = API(malloc)(1000);
    CHECK(reclaim_blocks[i] != NULL, "malloc failed");
  }
  pthread_t t;
  CHECK(pthread_create(&t, NULL, free_reclaim_blocks, NULL) == 0, "pthread_create failed");
  pthread_join(t, NULL);
  API(free)(hkt_opaque_ptr(reclaim_blocks[RECLAIM_N / 2])); /* past the first page, which may hold older blocks */
}

/* Blocks another thread freed and gave back to their owner's page (its
 * malloc_trim empties its quarantine and cache), which the owner takes
 * back with its own malloc_trim: a second free of one of them, from the
 * owner or from another thread. Every other block stays live, so that no
 * page empties and goes back. */
enum { TAKEN_N = 256 };
static void *taken_blocks[TAKEN_N];
static void *free_taken_and_trim(void *arg) {
  (void)arg;
  void *mine = API(malloc)(16); /* (a heap of its own, with a quarantine and a cache) */
  CHECK(mine != NULL, "malloc failed");
  for (int i = 0; i < TAKEN_N; i += 2) API(free)(taken_blocks[i]);
  API(malloc_trim)(0);
  API(free)(mine);
  return NULL;
}
static void *taken_back_setup(void) {
  for (int i = 0; i < TAKEN_N; i++) CHECK((taken_blocks[i] = API(malloc)(48)) != NULL, "malloc failed");
  pthread_t t;
  CHECK(pthread_create(&t, NULL, free_taken_and_trim, NULL) == 0, "pthread_create failed");
  pthread_join(t, NULL);
  API(malloc_trim)(0); /* (the remote stacks taken back) */
  return taken_blocks[TAKEN_N / 2];
}
static void double_free_taken_back_owner(void) { API(free)(hkt_opaque_ptr(taken_back_setup())); }
static void double_free_taken_back_other(void) {
  void *p = taken_back_setup();
  pthread_t t;
  CHECK(pthread_create(&t, NULL, thread_free, hkt_opaque_ptr(p)) == 0, "pthread_create failed");
  pthread_join(t, NULL);
}

/* level: the HAKMEM_SECURE level from which the case is detected (0: every
 * mode); below it the misuse goes unseen, as docs/SAFETY.md says, and the
 * child must simply exit (a guard-page case is skipped: without the guard
 * the stray write's outcome is undefined). sig: the expected signal; msg:
 * text the report must contain (NULL: only "hakmem"; a guard page fault
 * prints nothing). */
typedef struct mcase {
  const char *name;
  void (*fn)(void);
  int level, sig;
  const char *msg;
} mcase;

static const mcase cases[] = {
    {"free of a stack address", free_stack, 0, SIGABRT, NULL},
    {"free of a global", free_global, 0, SIGABRT, NULL},
    {"free of a pointer into the middle of a 64-byte block", free_interior, 0, SIGABRT, NULL},
    {"free of a misaligned pointer (p+1)", free_misaligned, 0, SIGABRT, NULL},
    {"double free of a small block", double_free_small, 0, SIGABRT, NULL},
    {"double free of a small block after other frees", double_free_small_later, 0, SIGABRT, NULL},
    {"double free of a 200 KiB block", double_free_medium, 0, SIGABRT, NULL},
    {"double free of a 4 MiB block", double_free_large, 0, SIGABRT, NULL},
    {"realloc of a freed small block", realloc_freed, 0, SIGABRT, NULL},
    {"realloc of a freed small block from another thread, same size", realloc_freed_other_thread, 0, SIGABRT, "realloc"},
    {"realloc of a freed 1 MiB block held by its thread, same size", realloc_freed_span_block, 0, SIGABRT, "realloc"},
    {"free of a pointer from mmap()", free_mmap, 0, SIGABRT, NULL},
    {"free of a 2 MiB-aligned mmap() pointer", free_mmap_2mib_aligned, 0, SIGABRT, NULL},
    {"free of a pointer into the middle of a 4 MiB block", free_interior_large, 0, SIGABRT, NULL},
    {"free of a pointer into the middle of a 200 KiB block", free_interior_medium, 0, SIGABRT, NULL},
    {"free of the span start below a coloured 256 KiB block", free_before_colored, 0, SIGABRT, NULL},
    {"double free of a coloured 64 KiB block", double_free_colored, 0, SIGABRT, NULL},
    {"double free of a 128 KiB block kept in the stash", double_free_stashed, 0, SIGABRT, "double free"},
    {"double free of a 1 KiB block of a full page, kept in the stash", double_free_stashed_parked, 0, SIGABRT,
     "double free"},
    {"double free of an aligned_alloc(256) block", double_free_aligned, 0, SIGABRT, NULL},
    {"double free of an aligned_alloc(1 MiB) block", double_free_aligned_large, 0, SIGABRT, NULL},
    {"realloc of a stack address", realloc_stack, 0, SIGABRT, NULL},
    {"free of a block never handed out", free_never_allocated, 0, SIGABRT, NULL},
    {"free of a pointer into the tail a realloc shrink gave back", free_into_shrunk_tail, 0, SIGABRT, NULL},
    {"1-byte overflow of a 21-byte block (canary not word-aligned)", overflow_1_byte_unaligned_canary, 1, SIGABRT, "heap buffer overflow"},
    {"1-byte overflow of a 200-byte block", overflow_1_byte, 1, SIGABRT, "heap buffer overflow"},
    {"write 7 bytes past a 200-byte block", overflow_far, 1, SIGABRT, "heap buffer overflow"},
    {"write after free, then malloc", write_after_free, 2, SIGABRT, "write after free"},
    {"write just past the end of a 4 MiB block", overflow_large_canary, 1, SIGABRT, "heap buffer overflow detected"},
    {"the same, the block in a cached 8 MiB mapping", overflow_large_reused, 1, SIGABRT, "heap buffer overflow detected"},
    {"a write running on past the end of a 4 MiB block", overflow_large_guard, 1, SIGSEGV, NULL},
    {"the same after realloc grew it to 6, then 24 MiB", overflow_large_realloc, 1, SIGSEGV, NULL},
    {"8 KiB written below the first block of a region", underflow_region_start, 0, SIGSEGV, NULL},
    {"a write running down from a 4 MiB block toward its header", underflow_large, 0, SIGSEGV, NULL},
    {"the same after realloc grew the block to 64 MiB", underflow_large_grown, 0, SIGSEGV, NULL},
    {"8 KiB written past the last block of a region", overflow_region_end, 0, SIGSEGV, NULL},
    {"double free, first free by another thread", double_free_cross_thread, 0, SIGABRT, NULL},
    {"double free of an exited thread's block", double_free_remote, 0, SIGABRT, NULL},
    {"double free, both frees by other threads", double_free_two_remote, 0, SIGABRT, NULL},
    {"double free by the owner of a block a live thread freed", double_free_kept_then_owner, 0, SIGABRT, NULL},
    {"double free by a third thread of a block a live thread freed", double_free_kept_then_third, 0, SIGABRT, NULL},
    {"double free, both by the same other thread", double_free_same_other_thread, 0, SIGABRT, NULL},
    {"double free into a page its owner left and another thread emptied", double_free_reclaimed, 0, SIGABRT, NULL},
    {"double free by the owner of a block another thread freed and the owner took back", double_free_taken_back_owner, 0,
     SIGABRT, "double free"},
    {"the same, the second free by another thread", double_free_taken_back_other, 0, SIGABRT, "double free"},
};

static int run_case(const mcase *c) {
  int sig = c->sig ? c->sig : SIGABRT;
  bool expect = secure_level >= c->level;
  if (!expect && sig == SIGSEGV) {
    /* without the guard page the write lands wherever it lands */
    printf("ok: %s -> skipped at HAKMEM_SECURE=%d (guard pages from %d)\n", c->name, secure_level, c->level);
    return 1;
  }
  int errp[2];
  CHECK(pipe(errp) == 0, "pipe: %s", strerror(errno));
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  CHECK(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    struct rlimit nocore = {0, 0};
    setrlimit(RLIMIT_CORE, &nocore); /* no core dumps from the expected aborts */
    dup2(errp[1], 2);
    close(errp[0]);
    close(errp[1]);
    alarm(20);
    /* some normal activity first, so the heap is not pristine */
    void *warm[64];
    for (int i = 0; i < 64; i++) warm[i] = API(malloc)((size_t)i * 24 + 8);
    for (int i = 0; i < 64; i += 2) API(free)(warm[i]);
    c->fn();
    _exit(0); /* not detected */
  }
  close(errp[1]);
  char buf[8192];
  size_t len = hkt_read_all(errp[0], buf, sizeof buf);
  int st;
  CHECK(waitpid(pid, &st, 0) == pid, "waitpid: %s", strerror(errno));
  /* strip a trailing newline for printing */
  while (len > 0 && buf[len - 1] == '\n') buf[--len] = 0;
  int ok = 1;
  if (!expect) {
    /* below its mode: must not be reported, and must not crash hakmem */
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
      printf("ok: %s -> not detected at HAKMEM_SECURE=%d (detected from %d)\n", c->name, secure_level, c->level);
    } else {
      fprintf(stderr, "FAIL: %s: at HAKMEM_SECURE=%d the child should run on, but %s %d; its stderr: %s\n", c->name,
              secure_level, WIFEXITED(st) ? "exited with" : "died of signal",
              WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), len ? buf : "(empty)");
      ok = 0;
    }
  } else if (WIFEXITED(st)) {
    fprintf(stderr, "FAIL: %s: not detected (child exited with status %d)%s%s\n", c->name, WEXITSTATUS(st),
            len ? "; its stderr: " : "", buf);
    ok = 0;
  } else if (WIFSIGNALED(st) && WTERMSIG(st) != sig) {
    fprintf(stderr, "FAIL: %s: child died of signal %d (%s), expected %s; its stderr: %s\n", c->name,
            WTERMSIG(st), strsignal(WTERMSIG(st)), strsignal(sig), len ? buf : "(empty)");
    ok = 0;
  } else if (sig == SIGSEGV && c->msg == NULL) {
    printf("ok: %s -> %s (guard page)\n", c->name, strsignal(sig));
  } else if (c->msg != NULL && strstr(buf, c->msg) == NULL) {
    fprintf(stderr, "FAIL: %s: aborted, but stderr does not say \"%s\": %s\n", c->name, c->msg, len ? buf : "(empty)");
    ok = 0;
  } else if (strstr(buf, "hakmem") == NULL) {
    fprintf(stderr, "FAIL: %s: aborted, but stderr does not mention hakmem: %s\n", c->name, len ? buf : "(empty)");
    ok = 0;
  } else {
    printf("ok: %s -> %s\n", c->name, buf);
  }
  return ok;
}

int main(void) {
  const char *env = getenv("HAKMEM_SECURE");
  secure_level = env ? atoi(env) : 0;
#ifdef HAKMEM_TEST_SECURE_DEFAULT
  if (!env) secure_level = 1;
#endif
  printf("test_misuse [%s, HAKMEM_SECURE=%d]\n", API_MODE, secure_level);
  int failed = 0;
  size_t n = sizeof cases / sizeof cases[0];
  for (size_t i = 0; i < n; i++) failed += !run_case(&cases[i]);
  CHECK(failed == 0, "%d of %zu misuse cases were not reported as required (see FAIL lines above)", failed, n);
  printf("test_misuse: all %zu cases passed\n", n);
  return 0;
}
