/* Free blocks and free slabs of pages in use go back: the inside of free
 * medium blocks to the OS, the slabs of a page whose blocks there are all
 * free to their region (lent while the page lives). */
#include "internal.h"

/* ---- free medium blocks: their inside goes back to the OS ----
 * A page keeps its span committed until every block is free, so a program
 * that frees most of its large blocks but not all would keep their
 * memory. Every purge delay, the owner's slow path gives back the
 * whole OS pages inside each free block of HK_PURGE_BLOCK_MIN or more: all
 * but the first page, which holds the free-list link and, in the second
 * word, a mark saying the block is purged (so it is not purged again while
 * it stays free). The mark includes the link: a block handed out and freed
 * again since gets a new link (as a rule) and is purged again. A reused block faults its pages back in, zero-filled.
 * The pass runs when the heap is about to take a new span (and on
 * malloc_trim), not on every slow path: it reads the clock. */

/* "purged!" in ASCII: mixed into the mark so that no link value alone makes it */
#define HK_PURGED_TAG ((uintptr_t)0x70757267656421ull)
HK_INLINE uintptr_t purged_mark(const hk_page *page, const hk_block *b) {
  return page->key ^ (uintptr_t)b ^ b->link ^ HK_PURGED_TAG;
}

/* Give back a freed block's memory but its first OS page's (its first two
 * words hold a list's link and a mark); the bytes given back. */
uint64_t hk_block_purge_inside(void *b, uint32_t bs) {
  uintptr_t lo = ((uintptr_t)b + 2 * sizeof(uintptr_t) + hk_os_page - 1) & ~(uintptr_t)(hk_os_page - 1);
  uintptr_t hi = ((uintptr_t)b + bs) & ~(uintptr_t)(hk_os_page - 1);
  if (hi <= lo) return 0;
  hk_os_purge((void *)lo, hi - lo);
  return hi - lo;
}

void hk_page_purge_free_blocks(hk_page *page) {
  uintptr_t key = page->key, start = page->start;
  uint32_t bs = page->block_size, area = hk_page_area(page), n = 0;
  uint64_t bytes = 0;
  hk_block *b = page->free;
  for (uint32_t i = 0; !hk_list_end(b); i++, b = hk_link_next(b, key)) {
    if (HK_UNLIKELY(i >= page->capacity || (uintptr_t)b - start >= area))
      hk_fatal("free list corrupted (write after free or heap overflow)", b);
    uintptr_t *mark = &b->link + 1;
    /* hardened mode 2 keeps a free block zero but for its link: no mark
     * there, and its only pass, malloc_trim's, purges again every time */
    if (!hk_secure_zero && *mark == purged_mark(page, b)) continue;
    uint64_t given = hk_block_purge_inside(b, bs);
    bytes += given;
    n += given != 0;
    if (!hk_secure_zero) *mark = purged_mark(page, b);
  }
  if (n) {
    hk_stat_add(blocks_purged, n);
    hk_stat_add(block_purge_bytes, bytes);
  }
}

/* ---- lending free slabs ----
 * Purging the inside of free blocks gives their memory back, but a page
 * whose blocks are mostly free still holds its whole span: no other class
 * can use it. A program that frees most of its blocks of 16-64 KiB and
 * then allocates bigger ones would fault the new blocks in from fresh
 * memory, page by page, while the old spans sit mostly free. So the same
 * pass lends the region the slabs of a page in which every
 * block that overlaps them is free: they go back committed, as a released
 * span's do, and the next span of any class takes them without a fault
 * (or the region's purge gives them back after the delay). The page lives
 * on around the holes: its free list drops the blocks there, its span is
 * released without them, it is never re-initialised whole (a spare, an
 * abandoned page starting over, a remote reclaim), and a block dropped
 * with them whose start lies outside them carries the foreign tag, so that
 * freeing it is a double free. Not the head slab (its record heads the
 * span), nor slabs past the carved blocks, nor in hardened mode. */
static void lend_free_slabs(hk_page *p) {
  if (hk_secure || p->nslabs < 2 || p->nslabs > 16 || p->held || p->reserved > 64 || hk_page_used(p) == 0) return;
  if (hk_load_relaxed(&p->remote) & ~HK_REMOTE_STATE_MASK) {
    if (hk_page_collect(p, HK_PAGE_NORMAL) == HK_COLLECT_RECLAIMED) return;
  }
  uintptr_t key = p->key, start = p->start, span = hk_page_span_start(p);
  uint32_t bs = p->block_size, cap = p->capacity;
  uint64_t free_blocks = 0;
  uint32_t n = 0;
  for (hk_block *b = p->free; !hk_list_end(b); b = hk_link_next(b, key), n++) {
    uintptr_t off = (uintptr_t)b - start;
    if (HK_UNLIKELY(n >= cap || off >= (uintptr_t)cap * bs || off % bs != 0))
      hk_fatal("free list corrupted (write after free or heap overflow)", b);
    free_blocks |= (uint64_t)1 << (off / bs);
  }
  uintptr_t carved_end = start + (uintptr_t)cap * bs;
  unsigned lendable = 0;
  uint64_t over[16] = {0};
  for (unsigned k = 1; k < p->nslabs; k++) {
    uintptr_t s0 = span + ((uintptr_t)k << HK_SLAB_SHIFT), s1 = s0 + HK_SLAB_SIZE;
    if (s1 > carved_end) break;
    if (p->lent >> k & 1) continue;
    uint32_t first = (uint32_t)((s0 - start) / bs), last = (uint32_t)((s1 - 1 - start) / bs);
    over[k] = (last - first >= 63 ? ~(uint64_t)0 : (((uint64_t)1 << (last - first + 1)) - 1)) << first;
    if ((free_blocks & over[k]) == over[k]) lendable |= 1u << k;
  }
  /* runs of two slabs or more only: a lone slab serves only a span of one,
   * and lent it would mostly stay committed for nothing; its free blocks
   * are purged inside instead */
  unsigned lend = lendable & ((lendable << 1) | (lendable >> 1));
  if (lend == 0) return;
  uint64_t dropped = 0;
  for (unsigned m = lend; m != 0; m &= m - 1) dropped |= over[__builtin_ctz(m)];
  /* the free list without the dropped blocks, in its order */
  hk_block *keep[64];
  uint32_t kept = 0;
  for (hk_block *b = p->free, *next; !hk_list_end(b); b = next) {
    next = hk_link_next(b, key);
    uint32_t j = (uint32_t)(((uintptr_t)b - start) / bs);
    if (!(dropped >> j & 1)) {
      keep[kept++] = b;
      continue;
    }
    /* The part of the block outside the lent slabs is the page's still,
     * and is given back here as a free block's inside would be (it is on
     * no list now to be purged later): from its start to its last slab
     * when its first slab stays (a block of a one-block page spans many
     * slabs: the lent ones between are purged with it, and go to the
     * region without their memory), or its last slab's part when only
     * that one stays. */
    unsigned all = lend | p->lent;
    uintptr_t b0 = (uintptr_t)b, b1 = b0 + bs;
    uintptr_t second = span + ((((b1 - 1) - span) >> HK_SLAB_SHIFT) << HK_SLAB_SHIFT);
    bool lent0 = all >> ((b0 - span) >> HK_SLAB_SHIFT) & 1, lent1 = all >> ((second - span) >> HK_SLAB_SHIFT) & 1;
    uintptr_t lo = b1, hi = b1;
    if (!lent0) {
      b->link = hk_foreign_tag(p);
      lo = b0 + 2 * sizeof(uintptr_t); /* (its first OS page stays: the tag) */
      hi = second;
    } else if (!lent1) {
      lo = second;
    }
    lo = (lo + hk_os_page - 1) & ~(uintptr_t)(hk_os_page - 1);
    hi &= ~(uintptr_t)(hk_os_page - 1);
    if (hi > lo) hk_os_purge((void *)lo, hi - lo);
  }
  hk_block *list = (hk_block *)hk_region_base(p); /* the empty list */
  for (uint32_t k = kept; k-- > 0;) {
    hk_link_set(keep[k], list, key);
    list = keep[k];
  }
  p->free = list;
  __atomic_store_n(&p->lent, (uint16_t)(p->lent | lend), __ATOMIC_RELAXED); /* (try_reclaim reads it) */
  hk_region_lend_slabs(p, lend);
  hk_stat_add(slabs_lent, (unsigned)__builtin_popcount(lend));
}

/* At most once per purge delay, or at once when the program has grown
 * (hk_growth_epoch moved: region.c), or with force. The growth trigger
 * makes a program that frees most of its medium blocks and then allocates
 * other sizes give the free blocks' memory back before its RSS grows far,
 * whatever the clock says; a loop whose live spans stay level does not
 * trigger it. In hardened mode 2, where a
 * free block stays zero but for its link (no purge mark), with force only
 * (malloc_trim). */
void hk_heap_purge_blocks(hk_heap *h, bool force) {
  uint32_t epoch = hk_load_relaxed(&hk_growth_epoch);
  uint64_t now = hk_os_now_ms();
  bool timed = force || now >= h->block_purge_ms;
  if (!timed && h->growth_epoch == epoch) return;
  if (timed) h->block_purge_ms = now + (uint64_t)hk_opt.purge_delay_ms;
  h->growth_epoch = epoch;
  uint32_t pass = h->purge_passes++;
  for (unsigned c = 0; c < HK_NCLASSES; c++) {
    if (hk_class_slabs[c] < 2) continue; /* (classes below 8 KiB: pages of one slab) */
    /* growth elsewhere: only classes that searched no page since the last
     * pass (a class in use would fault its blocks straight back in), and
     * only blocks smaller than a slab (pages of several blocks) */
    if (!timed && (h->class_searched[c] == pass || hk_class_size[c] >= HK_SLAB_SIZE)) continue;
    /* A class that searched no page since the last pass lends its pages'
     * free slabs first (then the region's purge gives back those that no
     * span takes). On a timed pass, so do the pages of a class in use but
     * its current page, if its blocks are smaller than a slab: otherwise
     * their free blocks are purged here and lent only once the class goes
     * idle, already given back, so the spans that take them fault them in
     * again. Blocks of a slab or more are left alone: while their class is
     * in use, lending their pages' free slabs costs more page faults than
     * it saves. */
    bool small = hk_class_size[c] < HK_SLAB_SIZE;
    bool idle = h->class_searched[c] != pass, purge = hk_class_size[c] >= HK_PURGE_BLOCK_MIN && (force || !hk_secure_zero);
    for (hk_page *p = h->queues[c].first; p != NULL; p = p->next) {
      hk_page_trim_tail(p);
      if (idle || (timed && small && p != h->queues[c].first)) lend_free_slabs(p);
      if (purge) hk_page_purge_free_blocks(p);
    }
  }
  /* (a page of one block is full; the walk only where a page may be
   * untrimmed: a heap of hundreds of thousands of full pages would read
   * them all at every pass) */
  if (timed && h->trim_due) {
    h->trim_due = 0;
    for (hk_page *p = h->full.first; p != NULL; p = p->next) hk_page_trim_tail(p);
  }
}


/* If p is marked untrimmed, give back its span beyond the blocks carved. */
bool hk_page_trim_tail(hk_page *p) {
  if (!p->untrimmed) return false;
  p->untrimmed = 0;
  uintptr_t end = hk_page_span_start(p) + hk_page_span_bytes(p);
  uintptr_t from = (p->start + hk_page_area(p) + hk_os_page - 1) & ~(uintptr_t)(hk_os_page - 1);
  if (end <= from) return false;
  hk_os_purge((void *)from, end - from);
  return true;
}
