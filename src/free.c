/* free() beyond the fast path: NULL, large blocks, other threads' pages,
 * and every kind of invalid pointer, each reported with a hakmem message. */
#include "internal.h"
#include "fastpath.h"
#include "secure.h"

#include <errno.h>

/* The header of the mapping p lies in, or NULL if hakmem did not map it. */
hk_region *hk_region_lookup(const void *p) {
  if (hk_region_is_ours((uintptr_t)p)) return hk_region_of(p);
  return hk_large_find_detached(p);
}

/* p is no block: say what it is. */
static HK_NOINLINE void free_invalid(void *p) {
  hk_region *r = hk_region_lookup(p);
  if (r == NULL || r->kind != HK_KIND_SMALL)
    hk_fatal("free() of a pointer not allocated by hakmem (invalid pointer, or already freed and unmapped)", p);
  hk_page *page = hk_page_of(r, p);
  uintptr_t off = (uintptr_t)p - page->start;
  /* not carved (no live page, or a block start past the carved ones) */
  if (hk_load_relaxed(&page->carved_bound) == 0 ||
      (off < (uintptr_t)page->reserved * page->block_size && hk_is_block_start(page, (uint32_t)off)))
    hk_fatal("free() of a pointer that is not an allocated block (double free, or never allocated)", p);
  hk_fatal("free() of a pointer into the middle of a block", p);
}

void hk_free_slow(void *p) {
  if (p == NULL) return;
  hk_region *r = hk_region_lookup(p);
  if (r != NULL && r->kind == HK_KIND_LARGE) {
    int saved = errno;
    hk_large_free(r, p);
    errno = saved;
    return;
  }
  /* a small region beyond the page table's range: find the page from the
   * region header instead */
  if (r != NULL && hk_arena_slab((uintptr_t)p) >= HK_ARENA_SLABS) {
    hk_free_to_page(hk_page_of(r, p), p, free_invalid);
    return;
  }
  free_invalid(p);
}

/* Usable size of a live block (r: hk_region_lookup(p)); `who` names the
 * caller in error reports. */
size_t hk_block_size_in(hk_region *r, const void *p, const char *who) {
  uintptr_t a = (uintptr_t)p;
  if (r == NULL) hk_fatal_in(who, "pointer not allocated by hakmem", p);
  if (r->kind == HK_KIND_LARGE) {
    if (r->large_state != HK_LARGE_LIVE || (char *)p != (char *)r + r->user_offset)
      hk_fatal_in(who, "pointer that is not a live block", p);
    return hk_large_usable(r);
  }
  hk_page *page = hk_page_of(r, p);
  if (!hk_is_carved_block(page, a))
    hk_fatal_in(who, "pointer that is not a block", p);
  if (hk_secure) {
    if (!hk_secure_live(page, (hk_block *)p)) hk_fatal_in(who, "pointer to a freed block", p);
    return hk_secure_size_of(page, (hk_block *)p);
  }
  return hk_page_usable(page);
}

size_t hk_usable_size(const void *p) {
  return p == NULL ? 0 : hk_block_size_in(hk_region_lookup(p), p, "malloc_usable_size()");
}

HK_API HK_HOT void hak_free(void *p) { hk_free_fast(p); }
HK_API void hak_free_sized(void *p, size_t size) { (void)size; hk_free_fast(p); }
HK_API void hak_free_aligned_sized(void *p, size_t align, size_t size) { (void)align; (void)size; hk_free_fast(p); }
HK_API size_t hak_malloc_usable_size(const void *p) { return hk_usable_size(p); }
