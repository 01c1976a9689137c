/* Memory pressure: what hakmem gives back, and when, beyond the pages and
 * spans that go back as they empty. Called from above every tier it
 * releases (the malloc slow path, malloc_trim, the purger's thread), so
 * that no tier calls back up into another to make room.
 *   hk_pressure_release  a mapping failed: empty the caches, then the caller retries once
 *   hk_pressure_trim     malloc_trim: the same, and the calling thread's heap, and the program's heaps not busy
 *   hk_pressure_purge_pass  the purger's pass: what has been unused for a purge delay */
#include "internal.h"

#include <errno.h>
#include <string.h>

/* Give back what the caches hold: every heap's spare spans, exited
 * threads' empty pages, cached large mappings, free slabs and empty regions. */
static bool release_cached(void) {
  hk_spares_expire(true);
  hk_abandoned_sweep(true, true);
  bool released = hk_large_trim(true);
  released |= hk_region_purge(true);
  return released;
}

/* The same, and the arena's never-used slots too. Under an address-space
 * limit (RLIMIT_AS) the arena's reservation takes what the limit leaves (a
 * quarter of what it asked for, and so on), and the caches hold the rest:
 * without this, a program that freed its medium blocks would get NULL for
 * a large block with most of the limit unused. */
void hk_pressure_release(size_t need) {
  hk_space_check(true); /* a limit may have been set since it was last asked */
  release_cached();
  /* The arena's unused reservation goes for good: only when an
   * address-space limit is what the mapping ran into (a request no machine
   * can serve, malloc(1 TiB), must not cost the arena) */
  if (hk_os_space_limited(need)) hk_arena_shrink();
}

/* ---- soft limits (limits.c) ---- */
void (*hk_pressure_handler)(void *arg); /* hak_set_pressure_handler's */
void *hk_pressure_handler_arg;

/* A soft limit was crossed (hk_limit_soft_crossed): everything free goes
 * back now, and the program's handler runs, at most every 100 ms. Called
 * by the malloc slow path with no lock held: the handler may allocate. */
void hk_pressure_soft(void) {
  static _Atomic uint64_t next_ms;
  uint64_t now = hk_os_now_ms(), next = hk_load_relaxed(&next_ms);
  hk_store_relaxed(&hk_limit_soft_crossed, false);
  if (now < next || !atomic_compare_exchange_strong(&next_ms, &next, now + 100)) return;
  int saved = errno;
  hk_heap *h = hk_tls_heap;
  if (h != &hk_heap_empty) hk_heap_collect(h, true);
  release_cached();
  hk_stat_add(soft_limit_passes, 1);
  void (*fn)(void *) = hk_pressure_handler;
  if (fn != NULL) fn(hk_pressure_handler_arg);
  errno = saved;
}

int hk_pressure_trim(void) {
  int saved = errno;
  hk_heap *h = hk_tls_heap;
  if (h != &hk_heap_empty) hk_heap_collect(h, true);
  hk_debug_heap(h, true);
  hk_heap_trim_users();
  bool released = release_cached();
  hk_debug_regions();
  hk_purge_poke = false; /* nothing left to purge */
  errno = saved;
  return released ? 1 : 0;
}

/* The purger's pass and a statistics walk (stats.c) never overlap: the
 * pass moves freed blocks between the counts the walk adds up (it collects
 * the remote frees of exited threads' pages and reaps heaps). */
static pthread_mutex_t pass_lock = PTHREAD_MUTEX_INITIALIZER;
void hk_pressure_hold(void) { hk_lock(&pass_lock); }
void hk_pressure_unhold(void) { hk_unlock(&pass_lock); }
void hk_pressure_fork_child(void) { pthread_mutex_init(&pass_lock, NULL); }

void hk_pressure_purge_pass(void) {
  hk_lock(&pass_lock);
  hk_spares_expire(false);
  hk_heap_stash_purge_idle();
  hk_region_purge(false);
  hk_large_trim(false);
  hk_abandoned_sweep(true, false);
  hk_heap_reap();
  hk_debug_regions();
  hk_unlock(&pass_lock);
  hk_profile_poll();
}

bool hk_pressure_pending(void) {
  return hk_region_pending() || hk_large_pending() || hk_abandoned_empty() != 0 || hk_spares_pending() ||
         hk_heap_stash_pending() ||
         hk_load_acquire(&hk_abandoned_hint);
}

void hk_pressure_usage(hk_usage *u) {
  hk_region_usage(&u->region_mapped, &u->region_in_use, &u->region_peak);
  hk_large_usage(&u->large_mapped, &u->large_cached);
  u->abandoned_empty = hk_abandoned_empty();
  hk_heap *h = hk_tls_heap;
  if (h != &hk_heap_empty) u->self = h->stats;
  else memset(&u->self, 0, sizeof u->self);
}
