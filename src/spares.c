/* Spare spans: the empty spans a heap keeps for reuse, and the list of
 * every heap, which the purger walks to give old spares back.
 *
 * An empty page of blocks smaller than a slab leaves its class, and its
 * span stays with the heap as a spare, ready to be re-initialised for any
 * class of its length without a span search, up to HK_SPARE_MAX bytes a
 * heap: a spare keeps a class's committed memory where classes carve.
 * Spans with lent slabs and the spans realloc leaves behind go back to
 * their region at once, and so do spans of blocks of a slab or more beyond
 * HK_SPARE_BYTES plus the heap's spare_grown (queue.c: it grows while the
 * heap keeps taking spans that spares would have saved): kept out of the
 * region's free slabs, they would serve only their exact length and split
 * the free runs that other spans and growing blocks can use. The purger
 * gives back spares unused for a purge delay beyond HK_SPARE_BYTES a heap
 * (hk_spares_expire). A heap's spare_lock is between its owner's slow
 * paths and the purger only. */
#include "internal.h"

pthread_mutex_t hk_heap_lock = PTHREAD_MUTEX_INITIALIZER;
hk_heap *hk_all_heaps; /* hk_heap_lock; never unlinked: heaps are pooled, not freed */

/* spare_bytes of all heaps, for the purger's pending() (64 bits: up to
 * 50 MiB a heap, with hundreds of threads) */
static _Atomic uint64_t spares_total;

bool hk_spares_pending(void) { return hk_load_relaxed(&spares_total) != 0; }

bool hk_spare_put(hk_heap *h, hk_page *page) {
  hk_assert(hk_page_used(page) == 0 && !page->held);
  /* (a spare is re-initialised whole: not with lent slabs) */
  if (h->moving || page->lent) return false;
  uint32_t bytes = hk_page_span_bytes(page);
  /* (zero mode: its free blocks are not purged on time, see page_emptied) */
  if (page->block_size >= HK_SLAB_SIZE && hk_secure_zero) return false;
  uint32_t limit = page->block_size < HK_SLAB_SIZE ? HK_SPARE_MAX : HK_SPARE_BYTES + h->spare_grown;
  pthread_mutex_lock(&h->spare_lock);
  if (h->spare_bytes + bytes > limit) {
    pthread_mutex_unlock(&h->spare_lock);
    return false;
  }
  page->next = h->spare[page->nslabs];
  page->prev = NULL;
  page->idle_ms = hk_os_now_ms(); /* (idle_ms serves abandoned pages otherwise) */
  h->spare[page->nslabs] = page;
  h->spare_bytes += bytes;
  pthread_mutex_unlock(&h->spare_lock);
  hk_add_relaxed(&spares_total, bytes);
  hk_purge_poke = true;
  return true;
}

/* A spare of the same span length, preferably one this class used (its
 * committed memory is where the class carves). Not a longer one cut to
 * length: that costs a growing buffer's realloc its room and more memory.
 * The lists are by length, so that the search passes over no spare of
 * another length (each one passed is a cache miss). */
hk_page *hk_spare_take(hk_heap *h, unsigned cls, unsigned nslabs) {
  hk_page **found = NULL;
  if (hk_load_relaxed(&spares_total) == 0) return NULL; /* no heap has spares */
  pthread_mutex_lock(&h->spare_lock);
  for (hk_page **pp = &h->spare[nslabs]; *pp != NULL; pp = &(*pp)->next) {
    if (found == NULL || (*pp)->cls == cls) found = pp;
    if ((*pp)->cls == cls) break;
  }
  hk_page *p = NULL;
  if (found != NULL) {
    p = *found;
    *found = p->next;
    p->next = NULL;
    h->spare_bytes -= hk_page_span_bytes(p);
    hk_sub_relaxed(&spares_total, hk_page_span_bytes(p));
  }
  pthread_mutex_unlock(&h->spare_lock);
  return p;
}

/* Detach h's spares of blocks of min_block bytes or more unused since
 * `older_than` (all: UINT64_MAX) while more than `keep` bytes of spares
 * remain, for the caller to give back. Under h->spare_lock. */
static hk_page *detach(hk_heap *h, uint64_t older_than, uint32_t keep, uint32_t min_block) {
  hk_page *out = NULL;
  uint32_t bytes = 0;
  for (unsigned n = 1; n < HK_SLABS; n++) {
    for (hk_page **pp = &h->spare[n]; *pp != NULL && h->spare_bytes - bytes > keep;) {
      hk_page *p = *pp;
      if (p->idle_ms < older_than && p->block_size >= min_block) {
        *pp = p->next;
        p->next = out;
        out = p;
        bytes += hk_page_span_bytes(p);
      } else {
        pp = &p->next;
      }
    }
  }
  h->spare_bytes -= bytes;
  hk_sub_relaxed(&spares_total, bytes);
  return out;
}

hk_page *hk_spares_detach(hk_heap *h, uint64_t older_than, uint32_t keep) { return detach(h, older_than, keep, 0); }

/* A block growing by realloc is about to take a span with free slabs after
 * it: h's spares of blocks of a slab or more go back to their regions
 * first (committed, as a released span's slabs), since kept out of the
 * free runs they would leave the growing block only clean slabs, each
 * faulted in, and the growth purge that clean slabs trigger. The spare
 * budget's growth ends with them. */
void hk_spares_release_big(hk_heap *h) {
  h->spare_grown = 0;
  /* (spare_bytes is the purger's too: read under the lock only) */
  if (hk_load_relaxed(&spares_total) == 0) return; /* no heap has spares */
  pthread_mutex_lock(&h->spare_lock);
  hk_page *out = detach(h, UINT64_MAX, 0, HK_SLAB_SIZE);
  pthread_mutex_unlock(&h->spare_lock);
  while (out != NULL) {
    hk_page *next = out->next;
    hk_region_free_span(out);
    out = next;
  }
}

/* Detach, from every heap, the spares unused since `older_than` beyond
 * `keep` bytes a heap. A heap whose lock is busy (its owner is in a slow
 * path, or was when the process forked) is skipped until next time. */
static hk_page *detach_all_heaps(uint64_t older_than, uint32_t keep) {
  hk_page *out = NULL;
  hk_lock(&hk_heap_lock);
  for (hk_heap *h = hk_all_heaps; h != NULL; h = h->all_next) {
    if (pthread_mutex_trylock(&h->spare_lock) != 0) continue;
    hk_page *p = hk_spares_detach(h, older_than, keep);
    pthread_mutex_unlock(&h->spare_lock);
    while (p != NULL) {
      hk_page *next = p->next;
      p->next = out;
      out = p;
      p = next;
    }
  }
  hk_unlock(&hk_heap_lock);
  return out;
}

/* Purger (and malloc_trim, with force: all of them): give back every
 * heap's spares unused for a purge delay beyond the first HK_SPARE_BYTES,
 * which a heap keeps: a program that comes back to its sizes after a pause
 * finds them without a page fault. */
void hk_spares_expire(bool force) {
  if (!hk_spares_pending()) return;
  uint64_t now = hk_os_now_ms();
  uint64_t older_than = force ? UINT64_MAX : (now > (uint64_t)hk_opt.purge_delay_ms ? now - (uint64_t)hk_opt.purge_delay_ms : 0);
  hk_page *out = detach_all_heaps(older_than, force ? 0 : HK_SPARE_BYTES);
  while (out != NULL) {
    hk_page *next = out->next;
    hk_region_free_span(out);
    hk_stat_add(spares_released, 1);
    out = next;
  }
}

/* The program grew (the regions purged their free slabs): spares beyond
 * HK_SPARE_BYTES, of any age, go back to their regions, committed, where
 * any heap's span of any length can take them without page faults; the
 * regions' timed purge (or the next growth purge) gives back those still
 * free a purge delay later. (Purged here, they cost a program whose
 * threads pass big blocks to each other a page fault per page at the next
 * span that lands on them, and its footprint grows meanwhile anyway.) At
 * most once every quarter of a purge delay, because giving them back
 * lowers the live spans that the next growth is measured from, and a
 * program replacing a few big blocks would otherwise trigger a growth
 * purge every few milliseconds. */
void hk_spares_trim(void) {
  if (hk_load_relaxed(&spares_total) <= HK_SPARE_BYTES) return;
  static _Atomic uint64_t next_ms;
  uint64_t now = hk_os_now_ms(), next = hk_load_relaxed(&next_ms);
  /* one thread wins the CAS and trims; the others see the new time */
  if (now < next || !atomic_compare_exchange_strong(&next_ms, &next, now + (uint64_t)hk_opt.purge_delay_ms / 4)) return;
  hk_page *out = detach_all_heaps(UINT64_MAX, HK_SPARE_BYTES);
  while (out != NULL) {
    hk_page *next = out->next;
    hk_region_free_span(out);
    hk_stat_add(spares_released, 1);
    out = next;
  }
}
