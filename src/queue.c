/* A heap's pages: for each size class a queue of pages whose first page,
 * the current one, serves the malloc fast path; the full list of pages with
 * no free block; the malloc slow path that finds or makes a page with a
 * free block; and what happens to a page that empties.
 *
 * Only the owner thread touches its heap's queues and full list, without a
 * lock; other threads reach its pages only through their remote stacks
 * (remote.c) and the heap's remote_hint. */
#include "internal.h"

#include <errno.h>
#include <string.h>

#define FULL_SCAN_EVERY 64  /* new pages at least between two scans of the full list without a hint */
#define CLOCK_EVERY 16      /* page searches between two readings of the clock */
#define ADOPT_ROUNDS 4      /* abandoned pages adopted by one search at most, each followed by a queue walk */

hk_page hk_page_empty = {.used = (uint32_t)HK_USED_NORMAL}; /* no blocks, normal state */
hk_heap hk_heap_empty = {.free_owner = HK_NO_OWNER(&hk_heap_empty), /* (not NULL: abandoned pages) */
                         .by_size = {[0 ... HK_LUT_SLOTS - 1] = &hk_page_empty},
                         .direct = {[0 ... HK_NCLASSES - 1] = &hk_page_empty}};
__thread hk_tls_state hk_tls __attribute__((tls_model("initial-exec"))) = {&hk_heap_empty, HK_BUDGET_SHUT, NULL};

bool hk_profile_on;       /* the heap profiler samples (profile.c) */

/* The budget for the thread's heap as it is now: shut while malloc must
 * leave the fast path every time (no heap, cache mode, hardened mode, a
 * heap of the program's in use: hak_heap_use); with the profiler on, the
 * bytes to the next sample: what cache mode's count left (sample_left,
 * taken once), else a fresh draw. (The exponential distribution is
 * memoryless: a fresh draw at any time keeps every byte's chance of being
 * sampled the same; the count carried over saves a draw each time a
 * thread leaves cache mode.) */
void hk_tls_arm(void) {
  hk_heap *h = hk_tls.heap;
  if (h->free_owner != h || hk_tls.use != NULL) {
    hk_tls.budget = HK_BUDGET_SHUT;
  } else if (!hk_profile_on) {
    hk_tls.budget = HK_BUDGET_OPEN;
  } else {
    hk_tls.budget = h->sample_left != 0 ? h->sample_left : hk_random_gap((uint64_t)hk_opt.profile_rate);
    h->sample_left = 0;
  }
}


void hk_heap_full_remove(hk_heap *h, hk_page *p) {
  hk_assert(hk_page_parked(p) || hk_page_used(p) == 0); /* (or reclaimed: started over) */
  hk_list_remove(&h->full, p);
  h->full_count--;
  h->full_pages[p->cls]--;
  hk_page_set_state(p, HK_USED_NORMAL);
}

/* The current page is the first of the class queue; direct[] exposes it to
 * the malloc fast path (hardened mode's malloc does not look: secure.c). */
void hk_heap_set_direct(hk_heap *h, unsigned cls, hk_page *page) {
  hk_assert(page == &hk_page_empty || page == h->queues[cls].first);
  /* a held page (hk_heap_page_emptied) stops being one; the old page is not
   * read: it may have been released to another thread already */
  if (h->direct[cls] != page) {
    h->held_bytes -= h->held[cls];
    h->held[cls] = 0;
  }
  /* (not a sampled page: its free must reach hk_heap_page_emptied) */
  if (page != &hk_page_empty && page->nslabs == 1 && !hk_load_relaxed(&page->sampled))
    hk_page_set_state(page, HK_USED_CURRENT);
  h->direct[cls] = page;
  /* the lookup table's slots of this class are consecutive */
  for (unsigned i = hk_class_lut_first[cls], end = hk_class_lut_end[cls]; i < end; i++) h->by_size[i] = page;
}

/* The page stops being current (it stays live and queued): free() may now
 * find it empty. */
static void uncurrent(hk_page *p) {
  if (p != NULL && hk_page_is_current(p)) hk_page_set_state(p, HK_USED_NORMAL);
}

/* An empty page left in its class's queue (hk_heap_page_emptied) stops
 * being held: it is taken, or given up. */
static void unhold(hk_heap *h, hk_page *page) {
  if (!page->held) return;
  page->held = 0;
  h->held_bytes -= (uint32_t)page->idle_ms; /* what it added: its capacity may have changed since */
  page->idle_ms = 0;
}

void hk_heap_set_current(hk_heap *h, unsigned cls) {
  hk_page *first = h->queues[cls].first;
  hk_heap_set_direct(h, cls, first ? first : &hk_page_empty);
}

void hk_heap_release_page(hk_heap *h, hk_page *page) {
  unhold(h, page);
  h->stats.pages_released++;
  hk_region_free_span(page);
}
/* a budget (below) refused class cls a span or a block */
static void note_refused(uint64_t *bits, unsigned cls) { bits[cls / 64] |= (uint64_t)1 << (cls % 64); }

/* An empty page leaves its class: kept as a spare (spares.c), or given
 * back to its region. */
static void retire_page(hk_heap *h, hk_page *page) {
  unhold(h, page);
  if (hk_spare_put(h, page)) return;
  /* (realloc's moves and pages with lent slabs are never spares) */
  if (page->block_size >= HK_SLAB_SIZE && !h->moving && !page->lent)
    note_refused(h->spare_refused, page->cls);
  hk_heap_release_page(h, page);
}

/* ---- full pages ---- */

/* Put a page on the full list (its state word already says FULL). */
static void full_push(hk_heap *h, hk_page *page) {
  hk_page_set_state(page, HK_USED_FULL);
  hk_list_push_front(&h->full, page);
  h->full_count++;
  h->full_pages[page->cls]++;
}

/* Park a page with no free block on the full list, so the page search does
 * not revisit it. Fails if a remote free arrived meanwhile: the state and the
 * remote stack share one word, so a remote freer either sees FULL (and sets
 * remote_hint) or its block is seen here. */
static bool park_full(hk_heap *h, hk_page *page) {
  uintptr_t expect = HK_PAGE_NORMAL;
  hk_page_park_note(page, hk_page_used(page));
  if (!atomic_compare_exchange_strong_explicit(&page->remote, &expect, HK_PAGE_FULL,
                                               memory_order_acq_rel, memory_order_relaxed))
    return false;
  hk_list_remove(&h->queues[page->cls], page);
  full_push(h, page);
  return true;
}

static void unpark(hk_heap *h, hk_page *page) {
  hk_heap_full_remove(h, page);
  hk_list_push_back(&h->queues[page->cls], page);
}

/* Bring back full pages that received remote frees. The hint is cleared
 * before the scan so a free racing with it sets it again. */
void hk_heap_rescue_full(hk_heap *h) {
  atomic_store_explicit(&h->remote_hint, 0, memory_order_seq_cst);
  hk_page *next;
  for (hk_page *p = h->full.first; p != NULL; p = next) {
    next = p->next;
    int r = hk_page_reclaimed(p);
    if (r == HK_PAGE_BUSY) hk_store_relaxed(&h->remote_hint, 1); /* look again */
    if (r != HK_PAGE_KEPT) {
      if (r == HK_PAGE_WAS_RECLAIMED) {
        hk_heap_full_remove(h, p);
        retire_page(h, p);
      }
      continue;
    }
    if (!(hk_load_acquire(&p->remote) & ~HK_REMOTE_STATE_MASK)) continue;
    if (hk_page_collect(p, HK_PAGE_NORMAL) == HK_COLLECT_RECLAIMED) { /* just now: next scan */
      hk_store_relaxed(&h->remote_hint, 1);
      continue;
    }
    unpark(h, p);
    if (hk_page_used(p) == 0) {
      hk_list_remove(&h->queues[p->cls], p);
      retire_page(h, p);
    }
  }
}

/* ---- how many empty pages a heap keeps ----
 * Empty pages left in their class's queue (held, page_emptied) and stashed
 * blocks (below) spare a thread that keeps a few medium blocks of a class
 * live a page search and a span taken and given back every few operations.
 * Only the owner reaches them, so a thread that stops allocating keeps
 * them: they stay within HK_HELD_BYTES plus held_grown, which grows by a
 * block each time a class takes a span after a block of it was refused
 * the stash for want of budget (a span the stash would have saved), and by
 * a span after an emptied page of several blocks was refused holding (a
 * span holding would have saved; not in hardened mode, which stashes
 * nothing, so that there the budget, all an idle thread keeps, stays
 * HK_HELD_BYTES), up to HK_HELD_GROWN_MAX more, and while the budget is
 * smaller than as many such blocks (spans) as the heap has full pages
 * holding live blocks: a program
 * that keeps many such blocks live, of many classes, needs a stash of many
 * blocks, one that keeps few live (a buffer growing through the classes)
 * does not, and its stash would only hold memory. Beyond that, empty pages
 * become spares (spares.c), which the purger gives back once unused for a
 * purge delay; the spare budget of
 * pages of a slab or more starts at HK_SPARE_BYTES and grows in the same
 * way by a span each time a class takes a span from the regions after
 * giving one up for want of spare budget, up to HK_SPARE_GROWN_MAX more.
 * Every timed purge pass, which also gives back the inside of held pages'
 * free blocks, retires the held pages of classes that made no page search
 * since the pass before, and lowers both budgets' growth by a quarter. */
static bool held_fits(const hk_heap *h, uint32_t bytes) {
  return hk_heap_held_bytes(h) + bytes <= HK_HELD_BYTES + h->held_grown;
}

static bool take_refused(uint64_t *bits, unsigned cls) {
  uint64_t bit = (uint64_t)1 << (cls % 64);
  if (!(bits[cls / 64] & bit)) return false;
  bits[cls / 64] &= ~bit;
  return true;
}

/* class cls takes a span from the regions (spare budget) or from anywhere
 * (held budget): each budget that refused the class a span or a block
 * since its last grows by one of the class's (the held budget: by what it
 * refused, a block to the stash or a span to holding) */
static void grow_on_miss(hk_heap *h, unsigned cls, bool from_regions) {
  uint32_t bs = hk_class_block[cls];
  /* (a stashed block's page may still be queued, not parked) */
  uint32_t alone = h->stash_blocks - h->stash_parked_blocks - h->stash_medium_blocks; /* stashed blocks of pages of one block */
  uint32_t live_full = h->full_count > alone ? h->full_count - alone : 0;
  if (take_refused(h->stash_refused, cls) && (uint64_t)live_full * bs > HK_HELD_BYTES + h->held_grown) {
    uint32_t room = HK_HELD_GROWN_MAX - h->held_grown;
    h->held_grown += bs < room ? bs : room;
  }
  uint32_t span = (uint32_t)hk_class_slabs[cls] << HK_SLAB_SHIFT;
  if (take_refused(h->held_refused, cls) && (uint64_t)live_full * span > HK_HELD_BYTES + h->held_grown) {
    uint32_t room = HK_HELD_GROWN_MAX - h->held_grown;
    h->held_grown += span < room ? span : room;
  }
  if (from_regions && take_refused(h->spare_refused, cls)) {
    uint32_t room = HK_SPARE_GROWN_MAX - h->spare_grown;
    h->spare_grown += span < room ? span : room;
  }
}

static void retire_page(hk_heap *h, hk_page *page);

/* After a timed purge pass (see above). */
static void pass_review(hk_heap *h) {
  for (unsigned c = 0; c < HK_NCLASSES && h->held_bytes != 0; c++) {
    if (hk_class_slabs[c] < 2 || h->class_searched[c] + 1 >= h->purge_passes) continue;
    hk_page *next;
    for (hk_page *p = h->queues[c].first; p != NULL; p = next) {
      next = p->next;
      if (!p->held) continue;
      if (hk_page_used(p) != 0) { /* current again, and in use: no longer held */
        unhold(h, p);
        continue;
      }
      bool first = p == h->queues[c].first;
      hk_list_remove(&h->queues[c], p);
      retire_page(h, p);
      if (first) hk_heap_set_current(h, c);
    }
  }
  h->spare_grown -= h->spare_grown / 4;
  /* (not below what the held pages still take: stashed blocks are back) */
  h->held_grown -= h->held_grown / 4;
  if (hk_heap_held_bytes(h) > HK_HELD_BYTES + h->held_grown) h->held_grown = hk_heap_held_bytes(h) - HK_HELD_BYTES;
}

/* ---- the stash: freed blocks of pages of one block, and of parked pages ----
 * A page of one block (64 KiB and up) empties at every free of its block
 * and fills at every malloc, and each time the page moves between the
 * queue, the full list and the region: a page search, a park (an atomic
 * compare-and-swap) and often a span given back and taken again, for one
 * block. The stash keeps such a freed block in its page, still counted as
 * handed out, on a list per class that the malloc slow path takes first,
 * within HK_HELD_BYTES (with the held pages): a free and a malloc of such
 * blocks then touch no page. A stashed block carries the foreign tag, so
 * freeing it again is a double free. The stash goes back to the pages at
 * the first page search after a timed purge pass (review_due), at
 * malloc_trim and at thread exit. An idle thread's stays until the thread
 * allocates again, but once the stash has not changed for a purge delay
 * the purger gives back its blocks' memory beyond their first OS page
 * (hk_heap_stash_purge_idle): only the owner may move the blocks, and it
 * may never allocate again. The owner holds stash_lock around each change
 * that starts or ends with the stash above HK_HELD_BYTES, and the purger
 * purges only such stashes: below that, the owner keeps no lock, and an
 * idle thread keeps at most that much, as it keeps its held pages.
 *
 * A block above 8 KiB freed into a parked page of 2 to HK_STASH_FEW_BLOCKS
 * blocks is stashed too, within the held budget, as a page of one block's
 * is: frees at random among full pages would otherwise each take a page
 * off the full list for one free block, and the malloc that takes it park
 * the page again (two atomic operations and two list moves a block).
 * A block of up to 8 KiB freed into a parked page of several blocks, but
 * fewer than SCANT_MIN_BLOCKS, is stashed as well, up to STASH_PARKED_MAX
 * a class and STASH_PARKED_TOTAL in
 * all (outside the held budget: each may keep a page that would otherwise
 * empty, so their number is bounded, not their bytes), while the class has
 * STASH_PARKED_PAGES parked pages or more: frees at random among many full pages would
 * otherwise each take a page off the full list for one free block, and
 * the malloc that takes it park the page again. Among few parked pages
 * each gathers several frees before a malloc reaches it, and the page's
 * trip costs less than a stash's put and take per block. A page whose
 * blocks are freed in a row is unparked at its second free instead
 * (stash_parked), so that the rest of its frees take the fast path.
 * A page of SCANT_MIN_BLOCKS or more rejoins its queue instead, where the
 * page search passes it by until it has gathered a share of free blocks
 * (page_scant): a trip a share costs fewer instructions than a stash's
 * put and take for each block.
 * malloc's fast path takes a stashed block before its slow path
 * (hk_malloc_no_head). */
#define SCANT_MIN_BLOCKS 128  /* blocks of a page, at least, for page_scant to pass it by */
#define STASH_PARKED_MAX 32   /* blocks of parked pages of several in a class's stash, at most */
#define STASH_PARKED_TOTAL 64 /* such blocks in the stash, all classes, at most */
#define STASH_PARKED_PAGES 8 /* parked pages of its class, at least, for such a block to be stashed */
static _Atomic bool stash_waiting; /* a stash may be waiting for its purge (hk_heap_stash_purge_idle) */

/* b, a block of class cls of bs bytes, onto the stash, and off it again.
 * Below HK_HELD_BYTES the owner changes the stash without the lock; a
 * change that starts or ends above it takes the lock (the purger purges
 * such stashes) and goes out of line, so that the common path makes no
 * call and saves no registers. */
HK_INLINE void stash_link(hk_heap *h, unsigned cls, hk_block *b, uint32_t bs) {
  (&b->link)[1] = hk_cache_link(h, h->stash[cls]);
  h->stash[cls] = b;
  __atomic_store_n(&h->stash_bytes, h->stash_bytes + bs, __ATOMIC_RELAXED);
  h->stash_count[cls]++;
  h->stash_blocks++;
}

static HK_NOINLINE void stash_link_above(hk_heap *h, unsigned cls, hk_block *b, uint32_t bs) {
  bool locked = hk_spin_lock(&h->stash_lock);
  stash_link(h, cls, b, bs);
  h->stash_ops++;
  if (locked) hk_spin_unlock(&h->stash_lock);
  if (!hk_load_relaxed(&stash_waiting)) { /* (the purger may be asleep) */
    hk_store_relaxed(&stash_waiting, true);
    hk_purge_poke = true;
  }
}

HK_INLINE void stash_unlink(hk_heap *h, unsigned cls, hk_block *b) {
  h->stash[cls] = hk_cache_next(h, b); /* (linked as the thread cache is) */
  h->stash_count[cls]--;
  h->stash_blocks--;
  hk_page *page = hk_block_page(b);
  if (hk_stash_medium(page)) {
    h->stash_medium_blocks--;
  } else if (page->reserved != 1) {
    h->stash_parked_blocks--;
    h->stash_parked_bytes -= page->block_size;
  }
  __atomic_store_n(&h->stash_bytes, h->stash_bytes - page->block_size, __ATOMIC_RELAXED);
}

static HK_NOINLINE void stash_unlink_above(hk_heap *h, unsigned cls, hk_block *b) {
  bool locked = hk_spin_lock(&h->stash_lock);
  stash_unlink(h, cls, b);
  h->stash_ops++;
  if (locked) hk_spin_unlock(&h->stash_lock);
}

HK_INLINE bool stash_put(hk_heap *h, hk_page *page) {
  uint32_t bs = page->block_size;
  /* (the current page stays current instead, held, and serves the fast
   * path: page_emptied) */
  if (h->moving) return false;
  if (hk_stash_medium(page)) {
    if (!hk_page_parked(page) || page == h->stash_parked) return false;
    if (!held_fits(h, bs)) {
      note_refused(h->stash_refused, page->cls);
      return false;
    }
    h->stash_parked = page;
    h->stash_medium_blocks++;
  } else if (page->reserved != 1) {
    /* (a stashed block's link is its second word: 8-byte blocks have none) */
    if (page->reserved >= SCANT_MIN_BLOCKS || bs < 16 || bs > HK_STASH_PARKED_SIZE || !hk_page_parked(page) ||
        page == h->stash_parked || h->full_pages[page->cls] < STASH_PARKED_PAGES ||
        h->stash_count[page->cls] >= STASH_PARKED_MAX || h->stash_parked_blocks >= STASH_PARKED_TOTAL)
      return false;
    h->stash_parked = page;
    h->stash_parked_blocks++;
    h->stash_parked_bytes += bs;
  } else {
    if (page == h->queues[page->cls].first) return false;
    if (!held_fits(h, bs)) {
      note_refused(h->stash_refused, page->cls);
      return false;
    }
  }
  /* the block just pushed is the list's head: take it back */
  hk_block *b = page->free;
  page->free = hk_link_next(b, page->key);
  page->used++;
  b->link = hk_foreign_tag(page);
  if (HK_UNLIKELY(h->stash_bytes + bs > HK_HELD_BYTES)) stash_link_above(h, page->cls, b, bs);
  else stash_link(h, page->cls, b, bs);
  return true;
}

/* b, the first stashed block of class cls, off the stash and live again. */
HK_INLINE hk_block *stash_take_first(hk_heap *h, unsigned cls, hk_block *b) {
  if (HK_UNLIKELY(h->stash_bytes > HK_HELD_BYTES)) stash_unlink_above(h, cls, b);
  else stash_unlink(h, cls, b);
  b->link = 0;
  (&b->link)[1] = 0;
  return b;
}

/* A stashed block of class cls, live again, or NULL. */
HK_INLINE hk_block *stash_take(hk_heap *h, unsigned cls) {
  hk_block *b = h->stash[cls];
  return b != NULL ? stash_take_first(h, cls, b) : NULL;
}

void *hk_heap_stash_malloc(hk_heap *h, unsigned cls) { return stash_take_first(h, cls, h->stash[cls]); }

static void page_emptied(hk_heap *h, hk_page *page);

void hk_heap_stash_flush(hk_heap *h) {
  for (unsigned c = 0; c < HK_NCLASSES && h->stash_bytes != 0; c++) {
    hk_block *b;
    while ((b = stash_take(h, c)) != NULL) {
      hk_page *page = hk_block_page(b);
      if (hk_page_push(page, b, page->key)) page_emptied(h, page);
    }
  }
}

bool hk_heap_stash_pending(void) { return hk_load_relaxed(&stash_waiting); }

/* The purger's pass (pressure.c): the stash of each heap whose stash is
 * above HK_HELD_BYTES and has not changed for a purge delay keeps its
 * blocks, but their memory beyond the first OS page (which holds the
 * stash's links) goes back to the OS, once until the stash changes again.
 * A heap whose lock is taken (its owner is changing the stash, or was when
 * the process forked) waits for the next pass. */
void hk_heap_stash_purge_idle(void) {
  uint64_t now = hk_os_now_ms();
  bool waiting = false;
  /* (cleared first: a stash changed during the walk sets it again) */
  hk_store_relaxed(&stash_waiting, false);
  atomic_thread_fence(memory_order_seq_cst);
  hk_lock(&hk_heap_lock);
  for (hk_heap *h = hk_all_heaps; h != NULL; h = h->all_next) {
    if (!hk_spin_trylock(&h->stash_lock)) {
      waiting = true;
      continue;
    }
    if (__atomic_load_n(&h->stash_bytes, __ATOMIC_RELAXED) <= HK_HELD_BYTES) {
      hk_spin_unlock(&h->stash_lock);
      continue;
    }
    if (h->stash_ops != h->stash_seen_ops) {
      h->stash_seen_ops = h->stash_ops;
      h->stash_seen_ms = now;
      h->stash_purged = 0;
    } else if (!h->stash_purged && now >= h->stash_seen_ms + (uint64_t)hk_opt.purge_delay_ms) {
      h->stash_purged = 1;
      uint64_t n = 0, bytes = 0;
      for (unsigned c = 0; c < HK_NCLASSES; c++)
        for (hk_block *b = h->stash[c]; b != NULL; b = hk_cache_next(h, b), n++)
          bytes += hk_block_purge_inside(b, hk_block_page(b)->block_size);
      hk_stat_add(blocks_purged, n);
      hk_stat_add(block_purge_bytes, bytes);
    }
    waiting |= !h->stash_purged;
    hk_spin_unlock(&h->stash_lock);
  }
  hk_unlock(&hk_heap_lock);
  if (waiting) hk_store_relaxed(&stash_waiting, true);
}

/* hk_heap_page_emptied of a sampled page or in hardened mode: the
 * profiler's mark (the sample goes before the block can be taken again),
 * and hardened mode's stash, which takes only blocks of one-block pages
 * (its quarantine does not take them; its malloc finds them in the slow
 * path, hk_heap_alloc, which marks them live), in zero mode none (a
 * stashed block's links would sit in the bytes it checks). Out of line:
 * the call would cost the default path a frame. */
static HK_NOINLINE void page_emptied_checked(hk_heap *h, hk_page *page) {
  hk_page_sample_freed(page);
  if ((hk_secure && (page->reserved != 1 || hk_secure_zero)) || !stash_put(h, page)) page_emptied(h, page);
}

/* Called by free() when a page became empty, or when it received a block
 * while parked on the full list. */
void hk_heap_page_emptied(hk_heap *h, hk_page *page) {
  /* (with the profiler on, a page whose block is no sample takes the
   * default path: most of them) */
  if (HK_UNLIKELY(hk_free_checks) && (hk_secure || hk_load_relaxed(&page->sampled))) {
    page_emptied_checked(h, page);
    return;
  }
  if (!stash_put(h, page)) page_emptied(h, page);
}

/* The page, of one block, handed its block out as a sample (profile.c):
 * out of the current state, so that the block's free empties it (in the
 * current state a page just stays current, see HK_USED_CURRENT). */
void hk_page_mark_sampled(hk_page *page) {
  hk_assert(page->reserved == 1 && hk_page_used(page) == 1);
  hk_store_relaxed(&page->sampled, 1);
  uncurrent(page);
}

#define SWAP_SLABS 4
static void page_emptied(hk_heap *h, hk_page *page) {
  unsigned cls = page->cls;
  if (hk_page_parked(page)) {
    /* The state word says FULL: return it to NORMAL, taking any remote
     * blocks along, before the page rejoins the queue. */
    if (hk_page_collect(page, HK_PAGE_NORMAL) == HK_COLLECT_RECLAIMED) return; /* a stray free's doing */
    unpark(h, page);
    page->rejoined = 1;
  }
  /* Each class keeps at most one empty page, as its current page, so a
   * malloc/free loop does not churn pages. An empty single-slab current
   * page stays; an emptied page of up to SWAP_SLABS slabs (a colour slab,
   * which holds no data, does not count) replaces a current page that has
   * no free block, so blocks of one per page (64 or 256 KiB) that are freed
   * and taken again reuse their span. A larger current page that empties
   * stays too, "held", while the carved bytes of the heap's held pages stay
   * within HK_HELD_BYTES: the bound limits what an idle thread keeps, and
   * holding spares a thread that keeps a few medium blocks per class live a
   * page search and a new span every few operations. Not held: a page
   * emptied by realloc moving its block to another class (the buffer is
   * growing past it: holding every class's page on the way only raises the
   * peak), nor in zero mode (HAKMEM_SECURE=2), whose free blocks the timed
   * purge leaves alone (a purge mark would break malloc's zero check). */
  hk_page *cur = h->queues[cls].first;
  if (hk_page_used(page) == 0 && page != cur) {
    if (page->held) return; /* (cannot happen: nothing was taken from it) */
    unsigned data_slabs = page->nslabs - hk_color_slabs(cls, page->nslabs);
    uint32_t carved = page->capacity * page->block_size;
    if (data_slabs <= SWAP_SLABS && cur != NULL && hk_list_end(cur->free) && cur->capacity == cur->reserved &&
        hk_page_used(cur) != 0) {
      hk_list_remove(&h->queues[cls], page);
      uncurrent(cur);
      hk_list_push_front(&h->queues[cls], page);
    } else if (page->nslabs > 1 && !h->moving && !hk_secure_zero && held_fits(h, carved)) {
      page->held = 1; /* stays queued: find_page takes it before a new span */
      page->idle_ms = carved;
      h->held_bytes += carved;
      hk_purger_poke_free();
      return;
    } else {
      if (page->reserved > 1 && !h->moving && !hk_secure) note_refused(h->held_refused, cls);
      hk_list_remove(&h->queues[cls], page);
      retire_page(h, page);
    }
    hk_heap_set_current(h, cls);
  } else if (hk_page_used(page) == 0 && (page->nslabs == 1 || h->held[cls] != 0)) {
    /* the current page, out of its state while its block was a sample
     * (hk_page_mark_sampled): back in it, or every free of its block would
     * come here */
    hk_page_set_state(page, HK_USED_CURRENT);
  } else if (hk_page_used(page) == 0 && page->nslabs > 1) {
    /* the current page itself emptied: held (until hk_heap_set_direct replaces it) */
    uint32_t carved = page->capacity * page->block_size;
    if (!h->moving && !hk_secure_zero && held_fits(h, carved)) {
      h->held[cls] = carved;
      h->held_bytes += carved;
      /* as a single-slab current page: it stays when it empties again
       * (with one or two medium blocks of a class live, nearly every free
       * of one would come here; uncurrent() ends it) */
      hk_page_set_state(page, HK_USED_CURRENT);
    } else {
      hk_list_remove(&h->queues[cls], page);
      retire_page(h, page);
      hk_heap_set_current(h, cls);
    }
  }
  hk_debug_heap(h, false);
  hk_purger_poke_free();
}
/* ---- the malloc slow path ---- */

/* A new page of class cls: a spare span of the right length, else one from
 * the regions. With room (a span block that may grow, see below), always
 * from the regions, placed with that many free slabs after it: spares have
 * no room after them. With dirty_out (calloc's span block), always from the
 * regions too, and *dirty_out says which of the span's slabs may hold
 * committed memory: the others read as zeros. */
static hk_page *fresh_page(hk_heap *h, unsigned cls, unsigned nslabs, unsigned room, hk_slabmask *dirty_out) {
  bool regions_only = room || dirty_out != NULL;
  if (room) hk_spares_release_big(h);
  hk_page *page = regions_only ? NULL : hk_spare_take(h, cls, nslabs);
  if (!regions_only) grow_on_miss(h, cls, page == NULL);
  /* the colour slab (sizeclass.c) of a span last used otherwise may hold
   * committed memory that the block will not use: the heap's next pass over
   * its medium pages (hk_heap_purge_blocks) gives it back (a spare of the
   * same class has touched one OS page of it at most). Here it would cost a
   * madvise per page taken, which dominates when medium blocks churn. */
  bool tail_dirty = page != NULL && page->cls != cls;
  if (page == NULL) {
    hk_slabmask dirty = 0;
    bool grew = false;
    page = hk_region_alloc_span(nslabs, cls, &dirty, room, h->region_list, &grew);
    if (grew) hk_spares_trim(); /* the heaps' spares beyond HK_SPARE_BYTES go back too */
    tail_dirty = (dirty >> (nslabs - 1)) & 1;
    if (dirty_out != NULL) *dirty_out = dirty;
  }
  if (page == NULL) return NULL;
  hk_page_init(page, cls);
  page->untrimmed = tail_dirty && hk_color_slabs(cls, nslabs);
  if (page->untrimmed) h->trim_due = 1;
  page->rejoined = 0;
  hk_store_release(&page->heap, hk_owner_tag(h));
  h->stats.pages_acquired++;
  /* Every so often look at all parked pages: a hint can be lost when a page
   * is abandoned and re-adopted while a remote free is in flight. After as
   * many new pages as are parked (FULL_SCAN_EVERY at least), so that the
   * scans cost a heap that grows to n pages O(n) in all, not O(n^2). */
  if (++h->fresh_count >= FULL_SCAN_EVERY && h->fresh_count >= h->full_count) {
    h->fresh_count = 0;
    hk_store_relaxed(&h->remote_hint, 1);
  }
  return page;
}

static hk_page *make_current(hk_heap *h, unsigned cls, hk_page *p) {
  unhold(h, p);
  p->rejoined = 0;
  hk_page_queue *q = &h->queues[cls];
  if (p != q->first) {
    uncurrent(q->first);
    hk_list_remove(q, p);
    hk_list_push_front(q, p);
  }
  hk_heap_set_current(h, cls);
  return p;
}

/* A page of many blocks back in its queue with few of them free: a page
 * that its owner's free took off the full list (rejoined), with fewer
 * than 1 in 16 of its blocks free. The page search passes it by for any
 * other page, carving, or a new span, and takes it only when no span can
 * be had. A class whose live blocks fill its pages (a program that frees
 * a block and allocates one of the same size, with a steady count of
 * them) would otherwise run on such pages: each free into a full page
 * puts the page back in the queue with that one block, and the next
 * malloc's search makes it current for that block alone, a search and a
 * park per block. New blocks give the class room instead, and the pages
 * passed by gather the frees that follow. What a class leaves unused this
 * way is under 1/16 of its pages, plus the room it takes. Pages that
 * other threads' frees bring back (hk_heap_rescue_full) are not passed by:
 * those frees come in runs, and a producer thread whose blocks a consumer
 * frees would otherwise take new pages while its own fill again. */
HK_INLINE bool page_scant(const hk_page *p) {
  return p->rejoined && p->reserved >= SCANT_MIN_BLOCKS && p->capacity - hk_page_used(p) < p->reserved / 16u;
}

/* Find a page of class cls with a free block and make it current. Memory
 * already handed out comes first: blocks freed into any page of the queue
 * (locally or remotely), then pages of exited threads; only then are new
 * blocks carved, and a new page taken last. */
static hk_page *find_page(hk_heap *h, unsigned cls) {
  /* the clock every 16th search only, as a read on each costs the search
   * path; an owner idle for HK_IDLE_OWNER_MS by this measure makes fewer
   * than 1600 page searches a second */
  if ((++h->searches % CLOCK_EVERY) == 0) hk_heap_note_active(h);
  h->class_searched[cls] = h->purge_passes;
  if (h->review_due) {
    h->review_due = 0;
    hk_heap_stash_flush(h);
    pass_review(h);
  }
  if (hk_load_acquire(&h->remote_hint)) hk_heap_rescue_full(h);
  hk_page_queue *q = &h->queues[cls];
  hk_page *carvable = NULL, *scant = NULL;
  hk_page_queue passed = {NULL, NULL}; /* scant pages passed by, back at the queue's end after the search */
  for (int round = 0; round < ADOPT_ROUNDS; round++) {
    hk_page *next;
    for (hk_page *p = q->first; p != NULL; p = next) {
      next = p->next;
      if (hk_list_end(p->free) && (hk_load_relaxed(&p->remote) & ~HK_REMOTE_STATE_MASK))
        hk_page_collect(p, HK_PAGE_NORMAL);
      if (!hk_list_end(p->free)) {
        /* (a page passed by takes the blocks other threads freed into it
         * first: they may make up its share) */
        if (page_scant(p) && (hk_load_relaxed(&p->remote) & ~HK_REMOTE_STATE_MASK)) hk_page_collect(p, HK_PAGE_NORMAL);
        if (!page_scant(p)) {
          hk_list_append(q, &passed);
          return make_current(h, cls, p);
        }
        if (scant == NULL) scant = p;
        /* (to the end: the next search looks first at pages that have had
         * longer to gather frees) */
        hk_list_remove(q, p);
        hk_list_push_back(&passed, p);
        continue;
      }
      /* hardened mode: a page whose list ended has handed out every block it
       * carved (those in a quarantine, the stash or its remote stack count
       * as handed out), unless a link rewritten to the list's end cut the
       * rest of the list off */
      if (hk_secure && HK_UNLIKELY(hk_page_used(p) != p->capacity))
        hk_fatal("free list corrupted (a link ends the list early: a write after free, or an overflow)",
                 (const void *)p->start);
      if (p->capacity < p->reserved) {
        if (carvable == NULL) carvable = p;
        continue;
      }
      if (!park_full(h, p)) hk_page_collect(p, HK_PAGE_NORMAL), next = p; /* retry it */
    }
    /* An exited thread's page: one with blocks in use, or, only if the
     * queue has no page left to carve, an empty one (adopted instead, each
     * would serve the few blocks carved in it, and the thread would spread
     * its blocks over as many pages). (A heap of the profiler's or the
     * program's holds only its own blocks: other threads' live blocks
     * would be taken for samples, or given back with the heap.) */
    hk_page *p = h->kind == HK_HEAP_THREAD ? hk_abandoned_adopt(h, cls, carvable != NULL) : NULL;
    if (p == NULL) break;
    uncurrent(q->first);
    hk_list_push_front(q, p);
  }
  hk_list_append(q, &passed);
  if (carvable != NULL && hk_page_extend(carvable)) return make_current(h, cls, carvable);
  /* about to take a new span: first give back the inside of free blocks
   * (both calls made only when due: with one block a page, as for 64 KiB
   * and more, this runs on nearly every malloc) */
  if (hk_heap_purge_blocks_due(h)) {
    uint64_t timed = h->block_purge_ms;
    hk_heap_purge_blocks(h, false);
    /* a timed pass: the stash goes back at the next search's start (not
     * here, in the middle of this class's) */
    if (h->block_purge_ms != timed && (h->stash_bytes | h->held_bytes | h->spare_grown | h->held_grown) != 0)
      h->review_due = 1;
  }
  if (hk_load_relaxed(&hk_abandoned_hint)) hk_abandoned_sweep(false, false);
  hk_page *p = fresh_page(h, cls, hk_class_slabs[cls], 0, NULL);
  if (p == NULL) {
    if (scant != NULL) return make_current(h, cls, scant);
    hk_heap_set_current(h, cls);
    return NULL;
  }
  uncurrent(q->first);
  hk_list_push_front(q, p);
  hk_page_extend(p);
  hk_heap_set_current(h, cls);
  return p;
}

/* The first free block of a page the search made current: its list's head
 * must be a carved block of the page. */
HK_INLINE hk_block *pop_checked(hk_page *page) {
  if (HK_UNLIKELY(!hk_list_head_ok(page, page->free)))
    hk_fatal("free list corrupted (a freed block was written: a use after free, or an overflow)", page->free);
  return hk_page_pop(page);
}

/* The fast path found its current page's list ended and nothing pending
 * (no purge, no soft limit, no stash of the class, no review, no remote
 * hint): the page after it in the queue, when it holds free blocks and is
 * not scant, becomes current as find_page would make it, without the slow
 * path's layers (a class whose live blocks fill its pages comes here every
 * few dozen mallocs). NULL where find_page has more to do. */
void *hk_heap_next_page_malloc(hk_heap *h, hk_page *page) {
  unsigned cls = page->cls;
  hk_page *next = page->next;
  if (HK_UNLIKELY(next == NULL || hk_list_end(next->free) || page_scant(next) || page != h->queues[cls].first ||
                  h->review_due || hk_secure || (hk_load_relaxed(&page->remote) & ~HK_REMOTE_STATE_MASK) ||
                  hk_load_acquire(&h->remote_hint)))
    return NULL;
  if ((++h->searches % CLOCK_EVERY) == 0) hk_heap_note_active(h);
  h->class_searched[cls] = h->purge_passes;
  /* (a page with blocks left to carve stays queued, as in find_page) */
  if (page->capacity == page->reserved && !park_full(h, page)) return NULL;
  make_current(h, cls, next);
  return pop_checked(next);
}

/* A block of class cls for a request of `size` bytes, from the pages. */
void *hk_heap_alloc(hk_heap *h, size_t size, unsigned cls) {
  if (h->stash_bytes != 0) {
    hk_block *b = stash_take(h, cls);
    if (b != NULL) {
      if (hk_secure) hk_secure_on_alloc(hk_block_page(b), b, size);
      return b;
    }
  }
  hk_page *page = h->queues[cls].first;
  if (page == NULL || hk_list_end(page->free)) page = find_page(h, cls);
  if (page == NULL) {
    errno = ENOMEM;
    return NULL;
  }
  hk_block *b = pop_checked(page);
  if (hk_secure) hk_secure_on_alloc(page, b, size);
  return b;
}
/* ---- blocks alone in their span: resizable in place ----
 * The classes whose block size is a whole number of slabs (64, 128, 192 KiB
 * ... 1 MiB) have one block per page, and such a page is a span of n
 * slabs holding one block of n * 64 KiB, plus one slab for its colour
 * (sizeclass.c; not 1 MiB, nor a span block made by realloc, below).
 * realloc can therefore resize it where it is: take the free slabs that
 * follow it in its region, or give back its tail, and the page becomes a
 * page of the class of its new length, coloured if it was. The block of a
 * class coloured inside its span (288 KiB in 5 slabs, at a colour offset)
 * shrinks the same way, into a span block of a class coloured with a slab,
 * as its colour offset needs (growing, it moves as other class blocks do,
 * into a span block with room: alloc.c). Copying
 * a buffer that grows step by step through the medium sizes, or that
 * shrinks to a fraction, would otherwise be the bulk of realloc's cost. */

static void span_block_sized(hk_page *page, unsigned color_slabs) {
  uint32_t bs = hk_page_span_bytes(page) - (color_slabs << HK_SLAB_SHIFT);
  page->cls = (uint8_t)hk_size_class(bs);
  page->block_size = bs;
  page->div_magic = hk_div_magic(bs);
  hk_page_set_carved(page);
}

/* Resize h's span block `page` (its block live), or shrink the block of a
 * class coloured inside its span (hk_colored_in_span), to hold size bytes
 * (HK_SLAB_SIZE / 2 < size <= HK_MEDIUM_MAX); false if the slabs after it
 * are taken. The page must be parked on the full list first: its class,
 * which indexes the queue it would be in, changes. */
bool hk_heap_resize_span_block(hk_heap *h, hk_page *page, size_t size) {
  unsigned color = hk_colored_page(page->cls, page->nslabs);
  unsigned n = (unsigned)((size + HK_SLAB_SIZE - 1) >> HK_SLAB_SHIFT);
  /* a coloured block stays coloured: its new class must be one */
  if (color && hk_class_colored[hk_size_class((size_t)n << HK_SLAB_SHIFT)] != HK_COLORED_SLAB) return false;
  n += color;
  /* (a block coloured in its span that holds size already stays: a shrink
   * never takes a slab) */
  if (n >= page->nslabs && size <= page->block_size) return true;
  if (n == page->nslabs) return false;
  if (!hk_page_parked(page)) {
    unsigned cls = page->cls;
    bool was_current = h->queues[cls].first == page;
    if (!hk_list_end(page->free) || !park_full(h, page)) return false;
    if (was_current) hk_heap_set_current(h, cls);
  }
  if (n > page->nslabs) {
    if (!hk_region_grow_span(page, n)) return false;
  } else {
    hk_region_shrink_span(page, n);
  }
  h->full_pages[page->cls]--; /* (parked, of its new class from here) */
  span_block_sized(page, color);
  h->full_pages[page->cls]++;
  return true;
}

/* The one block of a new page (a span block), parked at once: no other
 * thread knows the page yet. */
static hk_block *span_block_take(hk_heap *h, hk_page *page) {
  hk_page_extend(page);
  hk_block *b = hk_page_pop(page);
  hk_page_park_note(page, 1);
  hk_store_relaxed(&page->remote, HK_PAGE_FULL);
  full_push(h, page);
  return b;
}

/* The slabs a span block of size bytes takes. */
static unsigned span_block_slabs(size_t size) { return (unsigned)((size + HK_SLAB_SIZE - 1) >> HK_SLAB_SHIFT); }

/* n * 64 KiB is a class size that fills n slabs (sizeclass.c; its own
 * pages have a colour slab more, which a span block does without) */
static unsigned span_block_class(unsigned n) { return hk_size_class((size_t)n << HK_SLAB_SHIFT); }

/* A new span block of at least size bytes, placed where it has as many
 * free slabs after it as it takes (up to the largest span), so that it can
 * grow in place. */
void *hk_heap_alloc_span_block(hk_heap *h, size_t size) {
  unsigned n = span_block_slabs(size);
  unsigned room = n < HK_MAX_SPAN_SLABS - n ? n : HK_MAX_SPAN_SLABS - n;
  hk_page *page = fresh_page(h, span_block_class(n), n, room, NULL);
  return page != NULL ? span_block_take(h, page) : NULL;
}

/* A block of size bytes (up to HK_MEDIUM_MAX) at the start of its span,
 * and so aligned to a slab (64 KiB), for an aligned request whose classes
 * place their blocks at a colour's offset (alloc.c): a stashed span block
 * of the length, else a span block on a spare span or the regions'. */
void *hk_heap_aligned_span_block(hk_heap *h, size_t size) {
  unsigned n = span_block_slabs(size), cls = span_block_class(n);
  hk_block *b = h->stash[cls];
  if (b != NULL && ((uintptr_t)b & (HK_SLAB_SIZE - 1)) == 0 && hk_block_page(b)->nslabs == n)
    return stash_take_first(h, cls, b);
  hk_page *page = fresh_page(h, cls, n, 0, NULL);
  return page != NULL ? span_block_take(h, page) : NULL;
}

/* calloc of size bytes, a slab's worth up to HK_MEDIUM_MAX: a span block
 * from the regions, of which only the slabs that may hold committed memory
 * are cleared. The others have not been written since they were mapped or
 * purged (MADV_DONTNEED) and read as zeros, so a zeroed array that the
 * program fills sparsely costs neither the time of clearing it nor the
 * memory of the pages it never touches. NULL, having done nothing, when
 * the request's class has a stashed block (malloc takes that one, and
 * calloc clears it), when whole slabs would be more than a quarter larger
 * than the request (from 256 KiB they never are), or when the regions have
 * no span. */
void *hk_heap_calloc_span_block(hk_heap *h, size_t size) {
  unsigned n = span_block_slabs(size);
  /* (a block at most a quarter larger than the request, as a class's) */
  if (((size_t)n << HK_SLAB_SHIFT) - size > size / 4 || h->stash[hk_size_class(size)] != NULL) return NULL;
  hk_slabmask dirty = 0;
  hk_page *page = fresh_page(h, span_block_class(n), n, 0, &dirty);
  if (page == NULL) return NULL;
  char *b = (char *)span_block_take(h, page), *end = b + size;
  char *slab = (char *)hk_page_span_start(page);
  for (unsigned i = 0; i < n; i++, slab += HK_SLAB_SIZE) {
    char *lo = slab > b ? slab : b, *hi = slab + HK_SLAB_SIZE < end ? slab + HK_SLAB_SIZE : end;
    if ((dirty >> i) & 1) {
      memset(lo, 0, (size_t)(hi - lo));
    } else {
#ifdef HAKMEM_DEBUG
      for (const char *c = lo; c < hi; c += 256) hk_assert(*c == 0);
      hk_assert(hi[-1] == 0);
#endif
    }
  }
  return b;
}


/* ---- frees into the thread's own pages, beyond the fast path ---- */

/* The fast path saw a block that looks free already: confirm by walking the
 * page's lists (rare: live blocks almost never look free, see
 * hk_looks_free), then free it as the fast path would have. */
void hk_free_local_checked(hk_heap *heap, hk_page *page, hk_block *b) {
  if (hk_foreign_tagged(page, b) || hk_page_contains_free(page, b)) hk_fatal("double free detected", b);
  hk_free_local_push(heap, page, b);
}

void hk_free_local_push(hk_heap *heap, hk_page *page, hk_block *b) {
  if (hk_page_push(page, b, page->key)) hk_heap_page_emptied(heap, page);
}
