/* Frees of blocks whose page another thread's heap owns ("remote" frees),
 * and the thread cache.
 *
 * Such a block does not go straight back to its page. The freeing thread
 * keeps it in a small cache per size class (heap->cache_first[]). While it
 * sits there the block stays counted in its page's `used`, exactly as if
 * it were still live, so the owner needs to know nothing. Why: in a
 * server-style program most frees are remote, and pushing each one onto
 * the owner's page costs a CAS on a cache line that the owner writes too,
 * a CAS that mostly waits for that line. The blocks go back in batches, a
 * run of blocks of one page with one CAS.
 *
 * Cache mode. Once remote frees fill a class's list, the thread switches
 * to cache mode: its mallocs take the class's cached block first (the
 * thread's budget is shut, so malloc's fast path goes through
 * hk_malloc_gated to hk_malloc_cached), and its frees of its own blocks go to the cache too
 * (free's fast path compares page->heap with heap->free_owner, which is
 * then no heap). malloc thus finds a class's most recently freed block
 * first whoever owns it, while it is hot in this core's cache, and both
 * paths take one branch whatever the mix: with local and remote frees in
 * random order, the fast path's owner test and malloc's "cache or page"
 * test would otherwise each go the wrong way about half the time.
 * Every 64 cached mallocs the thread checks that a quarter of the blocks
 * it kept were other heaps'; if not, it leaves the mode and gives the
 * cache back (hk_cache_pop_noting_time): for its own blocks the pages are
 * faster, and outside cache mode it does not reuse other heaps' blocks.
 * Reused, they would stay in its working set, each free of them a remote
 * free: a thread with only occasional remote frees of a busy owner's
 * blocks would fill up with that owner's blocks and stay in cache mode
 * for good.
 *
 * The cache is bounded: at most hk_class_cache_max[cls] blocks per class
 * (none of blocks above HK_CACHE_BLOCK_MAX, types.h) and HK_CACHE_BYTES
 * in all. Past that, the older half of the class, or
 * of every class (all of it, in a thread that has allocated nothing),
 * goes back to the pages: each run of blocks of one page
 * with one CAS onto the page's remote stack, or onto the page's own list
 * for the thread's own blocks (cache_flush_keep). Thread exit and
 * malloc_trim flush it all.
 *
 * Double frees stay detected. A cached block's first word is the page key
 * XOR (its region base + HK_FOREIGN_TAG): it looks free to hk_looks_free,
 * so freeing it again from any thread but the owner fails at once, and the
 * owner, whose fast path sends a block that looks free to
 * hk_free_local_checked, finds the exact tag there. The cache's own links
 * are in the second word (blocks of 16 bytes and more), XOR-ed with the
 * heap's list key. */
#include "internal.h"
#include "fastpath.h"
#include "secure.h"

#include <sched.h>

/* ---- parked pages of idle owners ----
 * A page parked full whose blocks have all come back through remote frees
 * is free, but only its owner can reuse it, and an owner that no longer
 * allocates (a thread that filled a structure for others and now waits for
 * them in pthread_join) never comes back for it. The
 * freer whose push completes such a page, if the owner has not looked for a
 * page for HK_IDLE_OWNER_MS, gives its memory back at once: it swaps the
 * stack for the state RECLAIMED and purges the span; the owner's next scan
 * of its full list re-initialises the page (hk_heap_rescue_full,
 * hk_page_reclaimed).
 *
 * The owner may have collected the stack and parked the page again between
 * the push and the swap, with the word back to the same value (ABA); the
 * page then holds live blocks. `park` counts the parks, so the freer sees
 * that and puts the stack back instead. `reclaiming` keeps the owner off
 * the page until the freer is done. */
static void restore_stack(hk_page *page, uintptr_t stack) {
  uintptr_t key = page->key, cur = hk_load_acquire(&page->remote), want;
  do {
    /* blocks pushed since (stray frees) go on top of the stack taken */
    hk_block *top = (hk_block *)(cur & HK_REMOTE_PTR_MASK);
    uint32_t n = (uint32_t)(cur >> HK_REMOTE_COUNT_SHIFT);
    if (top != NULL) {
      hk_block *tail = top;
      for (uint32_t i = 1; i < n; i++) tail = hk_link_next(tail, key);
      tail->link = (stack & HK_REMOTE_PTR_MASK) ^ key;
    }
    want = (top ? (uintptr_t)top : stack & HK_REMOTE_PTR_MASK) | HK_PAGE_FULL |
           (((stack >> HK_REMOTE_COUNT_SHIFT) + n) << HK_REMOTE_COUNT_SHIFT);
  } while (!atomic_compare_exchange_weak_explicit(&page->remote, &cur, want, memory_order_acq_rel,
                                                  memory_order_acquire));
}

/* Instead of pushing first..last (n blocks) onto a parked page whose stack
 * word is `old`: if that completes the page and its owner is idle, give
 * the page back. The page cannot be released before this returns: the
 * chain is not pushed yet, and once the page is RECLAIMED its owner waits
 * for `reclaiming` to clear. */
static _Atomic int reclaims_running, reclaims_blocked; /* fork: see hk_reclaim_fork_prepare */

static bool try_reclaim(hk_page *page, hk_block *first, hk_block *last, uint32_t n, uintptr_t old, hk_heap *owner) {
  uint64_t park = hk_load_acquire(&page->park);
  /* (a page with lent slabs is never given back whole: others' spans may
   * hold them) */
  if (__atomic_load_n(&page->lent, __ATOMIC_RELAXED) || (old >> HK_REMOTE_COUNT_SHIFT) + n != (uint32_t)park ||
      hk_os_now_ms() < hk_load_relaxed(&owner->active_ms) + HK_IDLE_OWNER_MS)
    return false;
  atomic_fetch_add(&reclaims_running, 1);
  uint8_t idle = 0;
  if (atomic_load(&reclaims_blocked) ||
      !atomic_compare_exchange_strong_explicit(&page->reclaiming, &idle, 1, memory_order_acq_rel, memory_order_relaxed)) {
    atomic_fetch_sub(&reclaims_running, 1);
    return false;
  }
  /* linked as a push would link it, for the ABA case below */
  last->link = ((old & HK_REMOTE_PTR_MASK) | ((uintptr_t)last & ~HK_REGION_MASK)) ^ page->key;
  uintptr_t expect = old;
  bool taken = atomic_compare_exchange_strong_explicit(&page->remote, &expect, HK_PAGE_RECLAIMED,
                                                       memory_order_acq_rel, memory_order_relaxed);
  if (taken) {
    if (hk_load_acquire(&page->park) == park) {
      hk_page_clear_carved(page); /* a stray free now fails the range test */
      hk_os_purge((void *)hk_page_span_start(page), (size_t)page->nslabs << HK_SLAB_SHIFT);
      hk_stat_add(pages_reclaimed, 1);
    } else {
      restore_stack(page, (uintptr_t)first | HK_PAGE_FULL | ((old >> HK_REMOTE_COUNT_SHIFT) + n) << HK_REMOTE_COUNT_SHIFT);
    }
  }
  hk_store_release(&page->reclaiming, 0);
  atomic_fetch_sub(&reclaims_running, 1);
  if (taken) hk_store_release(&owner->remote_hint, 1);
  return taken;
}

/* A reclaim in flight when another thread forks would leave its page
 * marked busy in the child forever, and the page's owner waiting for it.
 * So fork waits for those in flight, and none starts until it is done. */
void hk_reclaim_fork_prepare(void) {
  atomic_store(&reclaims_blocked, 1);
  while (atomic_load(&reclaims_running) != 0) sched_yield();
}
void hk_reclaim_fork_done(void) { atomic_store(&reclaims_blocked, 0); }

/* Push the chain first..last (n blocks, already linked with the page key
 * from first to last) onto the page's remote stack. */
static void remote_push(hk_page *page, hk_block *first, hk_block *last, uint32_t n) {
  uintptr_t key = page->key;
  /* Read the owner before the push: once pushed, the blocks may be collected
   * and the page released at any time. */
  hk_heap *owner = hk_owner_untag(hk_load_acquire(&page->heap));
  uintptr_t old = hk_load_relaxed(&page->remote);
  if ((old & HK_REMOTE_STATE_MASK) == HK_PAGE_FULL && owner != NULL && try_reclaim(page, first, last, n, old, owner))
    return;
  if ((old & HK_REMOTE_STATE_MASK) == HK_PAGE_ABANDONED) hk_abandoned_unfull(page);
  do {
    /* an empty stack (0) is linked as the region base: see hk_list_end */
    last->link = ((old & HK_REMOTE_PTR_MASK) | ((uintptr_t)last & ~HK_REGION_MASK)) ^ key;
  } while (!atomic_compare_exchange_weak_explicit(
      &page->remote, &old,
      (uintptr_t)first | (old & HK_REMOTE_STATE_MASK) | ((old >> HK_REMOTE_COUNT_SHIFT) + n) << HK_REMOTE_COUNT_SHIFT,
      memory_order_release, memory_order_relaxed));
  unsigned state = (unsigned)(old & HK_REMOTE_STATE_MASK);
  /* Heaps are never unmapped, so a stale owner pointer is harmless here. */
  if (state == HK_PAGE_FULL && owner != NULL)
    hk_store_release(&owner->remote_hint, 1);
  else if (state == HK_PAGE_ABANDONED && !atomic_exchange_explicit(&hk_abandoned_hint, 1, memory_order_acq_rel))
    /* Only a sweep notes a page that empties here, and a program whose
     * other threads have exited may make no further call that sweeps: the
     * purger must (no lock is held here, and the cache being flushed is
     * already detached from the heap; started at once only while the
     * process has one thread, see purger.c). */
    hk_purger_notify_free();
}


/* Give the cached blocks of class cls back to their pages but the `keep` most
 * recently freed ones. A run of blocks of one page goes back in one push;
 * the thread's own blocks (cache mode) go onto their page's free list as a
 * local free would. */
static void cache_flush_keep(hk_heap *h, unsigned cls, uint32_t keep) {
  uint32_t held = (uint32_t)(hk_class_cache_max[cls] - h->cache_room[cls]);
  if (held <= keep) return;
  hk_block *b;
  if (keep == 0) {
    b = h->cache_first[cls];
    h->cache_first[cls] = NULL;
  } else {
    hk_block *cut = h->cache_first[cls];
    for (uint32_t i = 1; i < keep; i++) cut = hk_cache_next(h, cut);
    b = hk_cache_next(h, cut);
    (&cut->link)[1] = hk_cache_link(h, NULL);
  }
  h->cache_bytes -= (held - keep) * hk_class_size[cls];
  h->cache_room[cls] = (uint16_t)(hk_class_cache_max[cls] - keep);
  while (b != NULL) {
    hk_page *page = hk_block_page(b);
    hk_block *first = b, *last = b, *next = hk_cache_next(h, b);
    uint32_t n = 1;
    /* (every `next` is read before its block is pushed: then the owner may
     * reuse it) */
    while (next != NULL && hk_block_page(next) == page) {
      hk_link_set(last, next, page->key);
      last = next;
      next = hk_cache_next(h, next);
      n++;
    }
    if (hk_load_relaxed(&page->heap) == h) {
      if (hk_page_push_run(page, first, last, n, page->key)) hk_heap_page_emptied(h, page);
    } else {
      remote_push(page, first, last, n);
      h->stats.remote_frees += n;
    }
    b = next;
  }
}

/* How many of a class's `held` cached blocks stay when it overflows: the
 * newer half, which the thread's next mallocs of the class reuse while it
 * is hot in this core's cache; none in a heap that has handed out no block
 * yet (no page taken or adopted, no cached block reused: a consumer that
 * only frees), where kept blocks would only be kept from their owner, and
 * finding the cut walks through them. */
static uint32_t cache_keeps(const hk_heap *h, uint32_t held) {
  return (h->stats.pages_acquired | h->stats.pages_adopted | h->stats.cache_reused) ? held / 2 : 0;
}

/* The cache is over HK_CACHE_BYTES: every class gives back its older half
 * (see cache_keeps; a class's recent blocks are the ones its next mallocs
 * reuse while they are still in this core's cache; emptying the whole
 * cache would send the next mallocs to cold page blocks). */
static void cache_halve(hk_heap *h) {
  for (unsigned c = 0; c < HK_NCLASSES; c++)
    if (h->cache_first[c] != NULL)
      cache_flush_keep(h, c, cache_keeps(h, (uint32_t)(hk_class_cache_max[c] - h->cache_room[c])));
}

void hk_cache_flush_all(hk_heap *h) {
  for (unsigned c = 0; c < HK_NCLASSES && h->cache_bytes != 0; c++)
    if (h->cache_first[c] != NULL) cache_flush_keep(h, c, 0);
}

/* Every 64 blocks taken from the cache (in cache mode: only then does
 * malloc take any). A thread that takes its blocks from here may not search
 * pages for a long time, so it notes the time (see owner_idle). And a
 * thread whose cache took fewer than 16 blocks of other heaps since the
 * last time leaves cache mode and sends the cache back to the pages: a
 * thread that caches mostly its own frees (e.g. once its one remote owner
 * is idle) runs faster on its pages. */
HK_NOINLINE void *hk_cache_pop_noting_time(hk_heap *h, size_t cls, hk_block *b) {
  hk_heap_note_active(h);
  void *p = hk_cache_pop(h, cls, b);
  if (h->cache_remote < 16) { /* fewer than a quarter: back to the pages */
    h->free_owner = h;
    hk_tls_arm(); /* (h is this thread's heap) */
    hk_cache_flush_all(h);
  }
  h->cache_remote = 0;
  return p;
}

/* Has the owner stopped allocating, by the freeing thread's clock? Both
 * clocks advance only while their threads allocate (no clock read here).
 * Such an owner (a thread that filled a structure for others and now
 * waits) would never free its blocks itself: cached and reused here, they
 * would go round this cache forever, keeping it in cache mode, and its
 * pages would never empty for the reclaim above. */
HK_INLINE bool owner_idle(const hk_heap *self, const hk_heap *owner) {
  return hk_load_relaxed(&owner->active_ms) + HK_IDLE_OWNER_MS <=
         hk_load_relaxed(&self->active_ms);
}

/* A thread that frees other threads' blocks without ever allocating (the
 * consumer of a producer/consumer pair) has no heap, hence no cache, and
 * each of its frees would be a push onto the owner's page: a compare-and-
 * swap on a line the owner writes too. Its HK_HEAPLESS_FREES-th such free
 * gives it a heap, and its frees from then on are cached and go back in
 * runs; a thread that frees a few blocks of others only costs no heap. */
#define HK_HEAPLESS_FREES 64
static __thread uint32_t heapless_frees __attribute__((tls_model("initial-exec")));
/* Makes this thread's heap (thread.c sets it with the first heap it makes;
 * any block freed here was handed out by one): heaps are made a layer
 * above this file. */
_Atomic(hk_heap_maker) hk_make_heap_for_frees;

/* b (linked as a run of one) goes back to its page at once from a thread
 * with no heap, which counts such frees (above). */
static void heapless_push(hk_page *page, hk_block *b) {
  remote_push(page, b, b, 1);
  if (++heapless_frees == HK_HEAPLESS_FREES) {
    hk_heap_maker make = hk_load_relaxed(&hk_make_heap_for_frees);
    if (make != NULL) make();
  }
}

/* b goes first in h's cache of class cls (there is room), linked through
 * its second word; its first word is the caller's. (Not counted here: a
 * kept block is counted when it is reused or flushed, see stats.c.) */
HK_INLINE void cache_link_in(hk_heap *h, unsigned cls, hk_block *b) {
  (&b->link)[1] = hk_cache_link(h, h->cache_first[cls]);
  h->cache_first[cls] = b;
  h->cache_room[cls]--;
  h->cache_bytes += hk_class_size[cls];
}

/* Keep b, a block of owner's, in self's cache of class cls (there is
 * room). */
HK_INLINE void cache_keep(hk_heap *self, unsigned cls, const hk_page *page, hk_block *b, const hk_heap *owner) {
  /* (without a branch: local and remote frees come in any order) */
  self->cache_remote += (uint32_t)(owner != self);
  b->link = hk_foreign_tag(page);
  cache_link_in(self, cls, b);
}

/* ---- hardened mode's free, quarantine and thread cache ----
 * Every block the thread frees, its own or another heap's, waits in the
 * quarantine first (below). A block of another heap's that leaves it goes
 * into the thread cache of its class, as the default mode keeps remote
 * frees (above), and from there to this thread's next malloc of the class
 * (hk_secure_cache_pop) or, in runs, to its page's remote stack. While it
 * waits and while it is cached, the block map has it free
 * (hk_secure_give_remote flipped its remote bit), so a second free of it
 * from any thread is a double free; its first word is the
 * quarantine's tag (a per-block secret) and is checked when it leaves the
 * quarantine and again when it is reused, and its second word is the
 * cache's link (hk_cache_link). Zero mode keeps no cache (init.c): a
 * cached block's link would sit in the bytes it keeps zero. */

/* The first word of a block in the quarantine or the cache: secret (the
 * page key), and different for every block (`mix`: the block's
 * hk_secure_mix). */
static uintptr_t quarantine_tag(uintptr_t mix) { return ~mix; }

/* Keep b, another heap's block (freed, checked, its remote bit flipped), in
 * h's cache, or push it back to its page when the class keeps none or its
 * owner would not take blocks from caches (see free_remote_other). */
static void secure_keep(hk_heap *h, hk_page *page, hk_block *b) {
  unsigned cls = page->cls;
  hk_heap *owner = hk_owner_untag(hk_load_relaxed(&page->heap));
  if (hk_class_cache_max[cls] == 0 || owner == NULL || owner_idle(h, owner) || hk_owner_kind(owner) != HK_HEAP_THREAD) {
    remote_push(page, b, b, 1);
    h->stats.remote_frees++;
    return;
  }
  if (h->cache_room[cls] == 0) cache_flush_keep(h, cls, cache_keeps(h, hk_class_cache_max[cls]));
  if (h->cache_bytes + hk_class_size[cls] > HK_CACHE_BYTES) cache_halve(h);
  cache_link_in(h, cls, b); /* (the first word keeps its tag) */
}

/* Hardened malloc's block from the cache of class cls: b, its first block.
 * It must be a carved block of a page of the class, with its tag intact
 * and its bits saying "free"; its remote bit is flipped back (atomically:
 * other threads flip the word's other bits) and it is handed out again,
 * live to its page as before this thread freed it. */
void *hk_secure_cache_pop(hk_heap *h, unsigned cls, hk_block *b, size_t size) {
  /* (as free's fast path finds a page: every slab of the arena has one) */
  uintptr_t slab = hk_arena_slab((uintptr_t)b);
  hk_page *page;
  if (HK_LIKELY(slab < HK_ARENA_SLABS)) {
    page = hk_arena_page(slab);
  } else {
    hk_region *r = hk_region_is_ours((uintptr_t)b) ? hk_region_of(b) : NULL;
    page = r != NULL && r->kind == HK_KIND_SMALL ? hk_page_of(r, b) : NULL;
  }
  if (HK_UNLIKELY(page == NULL || page->cls != cls || !hk_is_carved_block(page, (uintptr_t)b)))
    hk_cache_corrupted(b);
  uintptr_t mix = hk_secure_mix(page, b);
  if (HK_UNLIKELY(b->link != quarantine_tag(mix)))
    hk_fatal("write after free detected (a freed block was modified)", b);
  h->cache_first[cls] = hk_cache_next(h, b);
  h->cache_room[cls]++;
  h->cache_bytes -= hk_class_size[cls];
  /* (relaxed: this thread flipped the remote bit as it freed the block,
   * and its owner flips the live bit only of blocks on its lists, which
   * this one is not) */
  hk_block_bit m = hk_block_bit_of(page, b);
  bool remote = hk_flip_bit(m.remote, m.bit, memory_order_relaxed);
  if (HK_UNLIKELY(remote != ((hk_load_relaxed(m.live) & m.bit) != 0)))
    hk_fatal("free list corrupted (a cached block is not a freed one: a double free, or a write after free)", b);
  b->link = 0;
  (&b->link)[1] = 0;
  if ((++h->stats.cache_reused & 63) == 0) hk_heap_note_active(h); /* (see owner_idle) */
  hk_secure_mark_mixed(page, b, size, mix);
  return b;
}

/* A block leaves the quarantine: its first word must still be its tag (a
 * write after free would be lost under the link written now). The
 * thread's own block goes back onto its page's free list, another heap's
 * (bit 0 of `page`) to the cache. */
static void quarantine_out(hk_heap *h, hk_block *b, uintptr_t page, uintptr_t tag) {
  if (HK_UNLIKELY(b->link != tag)) hk_fatal("write after free detected (a freed block was modified)", b);
  hk_page *pg = (hk_page *)(page & ~(uintptr_t)1);
  if (page & 1) secure_keep(h, pg, b);
  else if (hk_page_push(pg, b, pg->key)) hk_heap_page_emptied(h, pg);
}

/* A block the thread freed (checked, and free in the block map) waits in
 * its heap's quarantine, in a random one of its
 * HK_QUARANTINE slots, and the block it displaces leaves (quarantine_out):
 * a freed block is not the next one handed out, and when it comes back is
 * random. A double free of a waiting block is found in the block map as
 * any other, and a write into its first word when it leaves (the slot
 * keeps the tag written there). Blocks above HK_QUARANTINE_BLOCK_MAX skip
 * it: the quarantine holds the blocks, and keeps their pages from
 * emptying. `remote` (1) marks another heap's block: its page may be this
 * thread's by the time it leaves (adopted from an exited owner), and it
 * goes where another heap's block goes (secure_keep). */
_Static_assert(HK_QUARANTINE == 32, "the slot is the generator's top 5 bits");
HK_INLINE void quarantine(hk_heap *h, hk_page *page, hk_block *b, uintptr_t mix, uintptr_t remote) {
  uintptr_t tag = quarantine_tag(mix);
  b->link = tag;
  /* (a 64-bit LCG, Knuth's MMIX constants: its top bits are its best) */
  uint64_t x = h->quarantine_rng * 6364136223846793005u + 1442695040888963407u;
  h->quarantine_rng = x;
  unsigned i = (unsigned)(x >> 59);
  hk_block *out = h->quarantine[i].block;
  uintptr_t out_page = h->quarantine[i].page, out_tag = h->quarantine[i].tag;
  h->quarantine[i].block = b;
  h->quarantine[i].page = (uintptr_t)page | remote;
  h->quarantine[i].tag = tag;
  if (out != NULL) quarantine_out(h, out, out_page, out_tag);
}

/* Every waiting block out (thread exit, malloc_trim). */
void hk_secure_quarantine_flush(hk_heap *h) {
  for (unsigned i = 0; i < HK_QUARANTINE; i++) {
    hk_block *b = h->quarantine[i].block;
    if (b == NULL) continue;
    h->quarantine[i].block = NULL;
    quarantine_out(h, b, h->quarantine[i].page, h->quarantine[i].tag);
  }
}

/* A hardened free but the common one: another heap's block, or zero
 * mode. */
static HK_NOINLINE void secure_free_other(hk_block *b, hk_page *page, hk_heap *self, bool mine) {
  if (mine) hk_secure_give(page, b);
  else hk_secure_give_remote(page, b);
  uintptr_t mix = hk_secure_check(page, b);
  if (hk_secure_zero) memset(b, 0, page->block_size);
  if (!mine) {
    /* Blocks of a heap the program made or of the profiler's go straight
     * back, as in the default mode (see free_remote_other), and so does
     * every block a thread with no heap frees. */
    hk_heap *owner = hk_owner_untag(hk_load_relaxed(&page->heap));
    if (self == &hk_heap_empty) {
      heapless_push(page, b);
      return;
    }
    if (owner == NULL || hk_owner_kind(owner) != HK_HEAP_THREAD) {
      remote_push(page, b, b, 1);
      self->stats.remote_frees++;
      return;
    }
  }
  if (page->block_size <= HK_QUARANTINE_BLOCK_MAX) {
    quarantine(self, page, b, mix, !mine);
  } else if (!mine) {
    b->link = quarantine_tag(mix); /* (what the cache checks) */
    secure_keep(self, page, b);
  } else if (hk_page_push(page, b, page->key)) hk_heap_page_emptied(self, page);
}

/* Hardened mode sends every free here (pages store their owner tagged, so
 * the fast path's owner test never matches; a build hardened by default
 * calls it from the fast path, fastpath.h): the block map's test of a
 * double free (secure.h), the canary's and the trailer's, the quarantine.
 * (hk_heap_empty owns no page, so its tag matches none.) Every call is a
 * tail call, so that the common path saves no registers. */
HK_NOINLINE void hk_secure_free(hk_block *b, hk_page *page, hk_heap *self) {
  bool mine = hk_load_acquire(&page->heap) == (hk_heap *)((uintptr_t)self | 1);
  if (HK_UNLIKELY(!mine || hk_secure_zero)) {
    secure_free_other(b, page, self, mine);
    return;
  }
  hk_secure_give(page, b);
  uintptr_t mix = hk_secure_check(page, b);
  if (HK_LIKELY(page->block_size <= HK_QUARANTINE_BLOCK_MAX)) quarantine(self, page, b, mix, 0);
  else if (hk_page_push(page, b, page->key)) hk_heap_page_emptied(self, page);
}


/* The common path's tests failed: the block goes back to its page (this
 * thread keeps no cache, the class has none, or the owner is gone or
 * idle), or the cache is full for b's class, or in all, and makes room.
 * Out of line, so that the common path below saves and restores no
 * registers. */
static HK_NOINLINE void free_remote_other(hk_block *b, hk_page *page, hk_heap *self, hk_heap *owner) {
  unsigned cls = page->cls;
  if (owner == self) { /* cache mode, and the class has no cache */
    if (hk_class_cache_max[cls] == 0) {
      hk_free_local_push(self, page, b);
      return;
    }
  } else if (self == &hk_heap_empty || hk_class_cache_max[cls] == 0 || owner == NULL || owner_idle(self, owner) ||
             hk_owner_kind(owner) != HK_HEAP_THREAD) {
    /* A block of an exited thread's page (no owner) goes straight back, so
     * the page can empty and be reused or given back: kept here, it would
     * pin its page for as long as this thread allocates nothing of the
     * class. A block the heap profiler sampled goes back too: reused from
     * here, it would live on as a sample after its free (profile.c); it
     * leaves the profile, and goes to its page's local list when the
     * sample heap is this thread's. So does a block of a heap the program
     * made: hak_heap_destroy gives back its pages, and with them every
     * block still in them (user_heap.c). */
    if (owner != NULL && hk_owner_kind(owner) == HK_HEAP_SAMPLES) {
      hk_sample_freed(b, owner); /* (before the block can be handed out again) */
      if (owner == self->sample_heap) {
        hk_free_local_push(owner, page, b);
        return;
      }
    }
    if (self == &hk_heap_empty) {
      heapless_push(page, b);
      return;
    }
    remote_push(page, b, b, 1);
    self->stats.remote_frees++;
    return;
  }
  if (self->cache_room[cls] == 0) {
    cache_flush_keep(self, cls, cache_keeps(self, hk_class_cache_max[cls]));
    /* remote frees filled a class's list: cache mode (cache_remote still
     * counts the keeps before, so the first check, which may come with the
     * next cached malloc, keeps the mode) */
    if (self->free_owner == self) {
      self->free_owner = HK_NO_OWNER(self);
      /* (self is this thread's heap: its budget, with the profiler on, is
       * the count to the next sample, carried over; hk_tls_arm carries it
       * back) */
      if (hk_profile_on)
        self->sample_left = hk_tls.budget - 1 < HK_BUDGET_OPEN - 1 ? hk_tls.budget : hk_random_gap((uint64_t)hk_opt.profile_rate);
      hk_tls.budget = HK_BUDGET_SHUT;
    }
  }
  if (self->cache_bytes + hk_class_size[cls] > HK_CACHE_BYTES) cache_halve(self);
  cache_keep(self, cls, page, b, owner);
}

/* hk_free_to_cache's path: b, a carved block of page's, freed by self.
 * Every call in it is a tail call, so that it saves no registers. */
HK_INLINE void free_to_cache(hk_block *b, hk_page *page, hk_heap *self) {
  hk_heap *owner = hk_load_relaxed(&page->heap);
  if (HK_UNLIKELY(hk_looks_free(page, b))) {
    if (owner == self) { /* cache mode: the owner can confirm */
      hk_free_local_checked(self, page, b);
      return;
    }
    /* Only the owner may walk the page's lists to confirm, and pushing the
     * block would corrupt the list (or cache) it is already on. A live
     * block's first word is 0 or user data, which matches a free link only
     * if it equals page->key ^ (an address in its region): with a random
     * 64-bit key, that does not happen by chance. */
    hk_fatal("double free detected (block freed again by another thread)", b);
  }
  size_t cls = page->cls;
  /* room 0 also stands for "no cache here" (hk_heap_empty) and "no cache
   * for the class" (its maximum is 0): one test for all. An owner that is
   * this thread is neither NULL nor idle. */
  if (HK_UNLIKELY(self->cache_room[cls] == 0 || self->cache_bytes + hk_class_size[cls] > HK_CACHE_BYTES ||
                  owner == NULL || owner_idle(self, owner) || hk_owner_kind(owner) != HK_HEAP_THREAD)) {
    free_remote_other(b, page, self, owner);
    return;
  }
  cache_keep(self, (unsigned)cls, page, b, owner);
}

/* hk_free_to_cache of a sampled one-block page's block: out of the
 * profile before the block can be handed out again. (A block of a sample
 * heap fails free_to_cache's owner-kind test and goes to
 * free_remote_other, which drops its sample.) */
static HK_NOINLINE void free_to_cache_sampled(hk_block *b, hk_page *page, hk_heap *self) {
  hk_page_sample_freed(page);
  free_to_cache(b, page, self);
}

/* A free of another heap's block, or any free in cache mode (see the top
 * of this file). self: this thread's heap, or hk_heap_empty (no heap yet,
 * or exiting). Hardened mode has its own (hk_secure_free). */
void hk_free_to_cache(hk_block *b, hk_page *page, hk_heap *self) {
  if (HK_UNLIKELY(hk_free_checks)) {
    if (hk_secure) {
      hk_secure_free(b, page, self);
      return;
    }
    if (hk_load_relaxed(&page->sampled)) {
      free_to_cache_sampled(b, page, self);
      return;
    }
  }
  free_to_cache(b, page, self);
}
