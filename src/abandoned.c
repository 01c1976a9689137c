/* Abandoned pages: the pages of exited threads, on three lists per class
 * (pages with blocks in use and free ones, pages with every block in use,
 * empty pages), from which threads that need a page of the class adopt
 * them. Empty ones are kept for adoption for a purge delay, then given
 * back to their regions; full ones wait until a free reaches them. */
#include "internal.h"

#include <sched.h>

_Atomic uint32_t hk_abandoned_hint;
/* Per class, under abandoned_lock(class): the pages with blocks in use and
 * blocks free (or to carve), oldest first; the pages with none free, which
 * no thread could take a block from (adopted, each would be handed from
 * thread to thread, and a thread that took a few would find no block and
 * take a fresh page: under thread churn with long-lived blocks, the full
 * pages pile up at the front), until the first free that reaches one
 * moves it to the others (hk_abandoned_unfull); and the empty ones, in
 * the order they emptied. */
static hk_page_queue used_pages[HK_NCLASSES], full_pages[HK_NCLASSES], empty_pages[HK_NCLASSES];
static _Atomic uint32_t abandoned_count[HK_NCLASSES]; /* on the three lists */
static _Atomic uint32_t abandoned_full_in[HK_NCLASSES]; /* on full_pages */
#define FULL_MARK UINT64_MAX /* idle_ms of a page on full_pages (an empty one's is a time) */
static _Atomic uint32_t abandoned_empty; /* empty pages on the abandoned lists */
static _Atomic uint32_t abandoned_empty_in[HK_NCLASSES]; /* the same, per class */
/* One lock per class: threads that start (hk_abandoned_adopt) and threads that exit
 * (hk_abandon_page) wait for each other only over pages of one class. All
 * zero (glibc's PTHREAD_MUTEX_INITIALIZER): in .bss, no page written until
 * a class's lock is used. */
static struct {
  pthread_mutex_t m;
} __attribute__((aligned(64))) abandoned_locks[HK_NCLASSES] = {[0 ... HK_NCLASSES - 1] = {PTHREAD_MUTEX_INITIALIZER}};
HK_INLINE pthread_mutex_t *abandoned_lock(unsigned cls) { return &abandoned_locks[cls].m; }

static void reset_kept(hk_page *p);
static void note_empty(hk_page *page, uint64_t now) {
  reset_kept(page);
  page->idle_ms = now | 1; /* never 0, which means "not empty" */
  hk_add_relaxed(&abandoned_empty, 1);
  hk_add_relaxed(&abandoned_empty_in[page->cls], 1);
}

static void forget_empty(unsigned cls) {
  hk_sub_relaxed(&abandoned_empty, 1);
  hk_sub_relaxed(&abandoned_empty_in[cls], 1);
}

/* An empty page of several slabs (blocks above 8 KiB) whose class has
 * KEPT_EMPTY empty pages kept already goes back to its region, purged,
 * instead of joining the list: the threads that start next take one page a
 * class each, and if every empty page were kept, they would take them in
 * turn, each with the OS pages its earlier owners wrote, and the memory
 * kept would grow with the number of threads run. Two rather than one: two
 * threads that end together leave a page of each class each, and the two
 * that start next would otherwise fault a purged span in for the second;
 * more would keep memory for thread counts a program may never reach
 * again. Pages of one slab are all kept: giving them back costs a madvise
 * and page faults for each, more than the memory is worth. A page with
 * lent slabs is kept: they are not its to purge. */
#define KEPT_EMPTY 2
static bool surplus_empty(const hk_page *page) {
  return page->nslabs > 1 && !page->lent && hk_load_relaxed(&abandoned_empty_in[page->cls]) >= KEPT_EMPTY;
}

/* A page off full_pages, onto used_pages. Under its class's lock. */
static void unfull(hk_page *page) {
  hk_list_remove(&full_pages[page->cls], page);
  hk_sub_relaxed(&abandoned_full_in[page->cls], 1);
  __atomic_store_n(&page->idle_ms, 0, __ATOMIC_RELAXED);
  hk_list_push_back(&used_pages[page->cls], page);
}

/* A free is about to push a block onto the remote stack of page, which it
 * read abandoned: on full_pages, the page joins the pages in use, where the
 * next thread that needs a page of its class adopts it and collects the
 * block. Before the push, so that the page cannot have emptied (and gone
 * back to its region) meanwhile: the block being freed is in use in it.
 * The mark, read without the lock, is checked again under it (with the
 * owner: a page taken over meanwhile is in a heap's queue; and a page with
 * a block in use is never a spare's or a held page, whose idle_ms would
 * hold something else). */
void hk_abandoned_unfull(hk_page *page) {
  if (__atomic_load_n(&page->idle_ms, __ATOMIC_RELAXED) != FULL_MARK) return;
  unsigned cls = page->cls;
  hk_lock(abandoned_lock(cls));
  if (hk_load_relaxed(&page->heap) == NULL && page->idle_ms == FULL_MARK) unfull(page);
  hk_unlock(abandoned_lock(cls));
}

/* An exiting thread's page joins the abandoned list of its class, even
 * when it is empty: a thread that starts later and uses the class adopts
 * it, blocks carved and memory committed where the class carves. Given
 * back to its region at once, the span would go to whichever class takes
 * it next, at whatever offset, and under thread churn slabs would end up
 * committed all over for a few blocks each. Empty abandoned pages go back
 * after the purge delay (hk_abandoned_sweep). */
void hk_abandon_page(hk_page *page) {
  for (;;) {
    if (hk_page_reclaimed(page) == HK_PAGE_BUSY) {
      sched_yield(); /* a freer is purging it: a system call's wait */
      continue;
    }
    if (hk_page_collect(page, HK_PAGE_ABANDONED) != HK_COLLECT_RECLAIMED) break;
  }
  hk_page_set_state(page, HK_USED_NORMAL);
  page->held = 0; /* (the heap's held_bytes goes with the heap) */
  page->rejoined = 0; /* (its adopter takes it as any other page: queue.c, page_scant) */
  hk_store_release(&page->heap, NULL);
  __atomic_store_n(&page->idle_ms, 0, __ATOMIC_RELAXED); /* (read by freers: hk_abandoned_unfull) */
  if (hk_page_used(page) == 0) {
    if (surplus_empty(page)) {
      hk_region_free_span_purged(page);
      hk_stat_add(abandoned_released, 1);
      return;
    }
    note_empty(page, hk_os_now_ms());
  }
  bool empty = page->idle_ms != 0, full = hk_page_used(page) == page->reserved;
  hk_lock(abandoned_lock(page->cls));
  if (full) {
    __atomic_store_n(&page->idle_ms, FULL_MARK, __ATOMIC_RELAXED); /* (read by freers: hk_abandoned_unfull) */
    hk_add_relaxed(&abandoned_full_in[page->cls], 1);
  }
  hk_list_push_back(empty ? &empty_pages[page->cls] : full ? &full_pages[page->cls] : &used_pages[page->cls], page);
  hk_add_relaxed(&abandoned_count[page->cls], 1);
  /* A remote free may have landed between the collect and now. */
  if (hk_load_acquire(&page->remote) & ~HK_REMOTE_STATE_MASK)
    hk_store_release(&hk_abandoned_hint, 1);
  hk_unlock(abandoned_lock(page->cls));
}

/* ---- empty abandoned pages, kept for adoption ----
 * Under thread churn such a page is adopted again within the purge delay,
 * again and again, and never goes back to its region, so every block some
 * thread ever used in it would stay committed (a new owner pops whichever
 * block was freed last). So an empty page starts over when it is noted
 * empty: its free list is rebuilt as a fresh page's, carving from the
 * start, which writes only memory the page used first; the purger then
 * gives back the rest of the span (trim_kept) and the inside of its free
 * medium blocks, off the exiting thread's path. Not in hardened mode, whose
 * pages carve in random order. */
static void reset_kept(hk_page *p) {
  if (hk_secure || p->lent || p->capacity <= hk_extend_blocks(p->block_size)) return; /* as fresh; lent slabs are not its own */
  hk_page_init(p, p->cls);
  hk_page_extend(p);
  hk_store_relaxed(&p->remote, HK_PAGE_ABANDONED);
  p->untrimmed = 1;
}

/* Purger only (it makes system calls), under the class's abandoned_lock. */
static void trim_kept(hk_page *p) {
  if (hk_page_trim_tail(p)) hk_stat_add(abandoned_trimmed, 1);
  if (p->block_size >= HK_PURGE_BLOCK_MIN && !hk_secure_zero) hk_page_purge_free_blocks(p);
}

/* Collect the remote frees of abandoned pages (when a hint says some
 * arrived) and note the pages that became empty; with trim, also give back
 * the pages empty for a purge delay (all empty ones with force). Trim runs
 * in the purger and in malloc_trim. */
void hk_abandoned_sweep(bool trim, bool force) {
  bool hinted = hk_load_relaxed(&hk_abandoned_hint) &&
                atomic_exchange_explicit(&hk_abandoned_hint, 0, memory_order_acq_rel);
  if (!hinted && !(trim && hk_load_relaxed(&abandoned_empty))) return;
  uint64_t now = hk_os_now_ms(), delay = force ? 0 : (uint64_t)hk_opt.purge_delay_ms;
  hk_page *surplus = NULL;
  for (unsigned c = 0; c < HK_NCLASSES; c++) {
    /* (a page pushed after this test with remote frees on it sets the
     * hint again, for the next sweep) */
    if (hk_load_relaxed(&abandoned_count[c]) == 0) continue;
    hk_lock(abandoned_lock(c));
    hk_page *next;
    /* a full page that a free reached before it joined the list (the
     * others move at their first free) joins the pages in use, whose loop
     * below collects it */
    for (hk_page *p = full_pages[c].first; p != NULL; p = next) {
      next = p->next;
      if (hk_load_acquire(&p->remote) & ~HK_REMOTE_STATE_MASK) unfull(p);
    }
    for (hk_page *p = used_pages[c].first; p != NULL; p = next) {
      next = p->next;
      if (!(hk_load_acquire(&p->remote) & ~HK_REMOTE_STATE_MASK)) continue;
      hk_page_collect(p, HK_PAGE_ABANDONED);
      if (hk_page_used(p) != 0) continue;
      hk_list_remove(&used_pages[c], p);
      if (surplus_empty(p)) { /* (given back below, out of the lock) */
        hk_sub_relaxed(&abandoned_count[c], 1);
        p->next = surplus;
        surplus = p;
        continue;
      }
      note_empty(p, now);
      hk_list_push_back(&empty_pages[c], p);
    }
    for (hk_page *p = empty_pages[c].first; p != NULL; p = next) {
      next = p->next;
      /* (a stray free of a block of an empty page: collected, and found) */
      if (hk_load_acquire(&p->remote) & ~HK_REMOTE_STATE_MASK) hk_page_collect(p, HK_PAGE_ABANDONED);
      if (!trim) continue;
      /* now | 1: idle_ms is rounded up to odd, and a coarse clock (4 ms
       * ticks) reads even: `now >=` alone would never release a page noted
       * empty in the same millisecond, even with force */
      if ((now | 1) >= p->idle_ms + delay) {
        hk_list_remove(&empty_pages[c], p);
        hk_sub_relaxed(&abandoned_count[c], 1);
        forget_empty(c);
        hk_stat_add(abandoned_released, 1);
        hk_region_free_span(p);
      } else {
        trim_kept(p);
      }
    }
    hk_unlock(abandoned_lock(c));
  }
  while (surplus != NULL) {
    hk_page *next = surplus->next;
    hk_region_free_span_purged(surplus);
    hk_stat_add(abandoned_released, 1);
    surplus = next;
  }
}

uint32_t hk_abandoned_empty(void) { return hk_load_relaxed(&abandoned_empty); }

/* With HAKMEM_THREAD_STATS, pages in use of a class wait for their live
 * blocks to be freed while at most this many wait: the live blocks of a
 * page count to its owner (inspect.c), and an exited thread's are no other
 * thread's. Past it, the oldest is adopted (and the adopting thread's
 * figures are inexact from then on): threads that exit leaving live
 * blocks behind, one after another, would otherwise leave a page of each
 * class they used each, and memory would grow with the threads run. */
#define USED_WAITING_MAX 4

/* A page of class cls for h: the oldest with blocks in use (its free
 * blocks are memory handed out already, and its other blocks have had the
 * longest to come back), else, unless used_only, the empty page that
 * emptied last, the likeliest to be committed and in the caches: the
 * older ones age out and go back (hk_abandoned_sweep). */
hk_page *hk_abandoned_adopt(hk_heap *h, unsigned cls, bool used_only) {
  if (hk_load_relaxed(&abandoned_count[cls]) == hk_load_relaxed(&abandoned_full_in[cls])) return NULL;
  hk_lock(abandoned_lock(cls));
  hk_page *p = used_pages[cls].first;
  if (p != NULL && hk_thread_stats) {
    uint32_t used = hk_load_relaxed(&abandoned_count[cls]) - hk_load_relaxed(&abandoned_empty_in[cls]) -
                    hk_load_relaxed(&abandoned_full_in[cls]);
    if (used > USED_WAITING_MAX) h->inherited = 1;
    else p = NULL;
  }
  if (p != NULL) {
    hk_list_remove(&used_pages[cls], p);
  } else if (!used_only && (p = empty_pages[cls].last) != NULL) {
    hk_list_remove(&empty_pages[cls], p);
  }
  if (p != NULL) hk_sub_relaxed(&abandoned_count[cls], 1);
  hk_unlock(abandoned_lock(cls));
  if (p == NULL) return NULL;
  if (p->idle_ms != 0) {
    p->idle_ms = 0;
    forget_empty(cls);
  }
  hk_store_release(&p->heap, hk_owner_tag(h));
  hk_page_collect(p, HK_PAGE_NORMAL);
  if (p->untrimmed) h->trim_due = 1;
  h->stats.pages_adopted++;
  return p;
}

/* fork: every class's lock */
void hk_abandoned_fork_lock(void) {
  for (unsigned c = 0; c < HK_NCLASSES; c++) hk_lock(abandoned_lock(c));
}
void hk_abandoned_fork_unlock(void) {
  for (unsigned c = 0; c < HK_NCLASSES; c++) hk_unlock(abandoned_lock(c));
}
