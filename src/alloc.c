/* Allocation entry points beyond the fast path: calloc, realloc, aligned
 * allocation, trim, and the hak_ API. */
#include "internal.h"
#include "fastpath.h"

#include <errno.h>
#include <string.h>

#include "hakmem.h"

static bool is_pow2(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

#define HK_REALLOC_SPAN_MIN (2 * HK_SLAB_SIZE) /* a first growth to this (with its room) takes a span block */
/* realloc_small's blocks and sizes are below this: half a slab, where a
 * span block's resize in place starts, and with its room (a quarter more)
 * below HK_REALLOC_SPAN_MIN */
#define HK_REALLOC_SMALL (HK_SLAB_SIZE / 2)
_Static_assert(HK_REALLOC_SMALL + HK_REALLOC_SMALL / 4 < HK_REALLOC_SPAN_MIN, "realloc_small never takes a span block");
#define HK_SECURE_ROOM_MIN ((size_t)4 << 10) /* hardened mode gives a growing block room from this size */

void *hk_calloc(size_t n, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(n, size, &total)) {
    errno = ENOMEM;
    return NULL;
  }
  if (total > HK_MEDIUM_MAX && hk_tls.use == NULL) return hk_alloc_large(total, 16, true);
  /* from a slab up, a block whose untouched slabs need no clearing
   * (queue.c); not where malloc must see the request (a heap the thread
   * uses, the profiler), nor in hardened mode (canary and trailer). (The
   * heap first: it initialises hakmem, whose switches are read next.) */
  if (total >= HK_SLAB_SIZE && hk_tls.use == NULL) {
    hk_heap *h = hk_heap_get();
    void *p = h != NULL && !hk_profile_on && !hk_secure ? hk_heap_calloc_span_block(h, total) : NULL;
    if (p != NULL) return p;
  }
  void *p = hk_malloc_fast(total); /* (a heap the thread uses: hak_heap_use) */
  if (p != NULL) memset(p, 0, total);
  return p;
}

/* Alignment <= 64 KiB: a size class whose block size is a multiple of the
 * alignment gives naturally aligned blocks, because pages start on 64 KiB
 * boundaries; coloured classes (one block per page, at a cache-line offset:
 * page.c) only for alignments up to a cache line, and where no class fits,
 * a block at the start of a span does. Larger alignments get a large
 * block. */
static HK_NOINLINE void *alloc_aligned_class(size_t align, size_t size, bool zero) {
  if (size > HK_MAX_REQUEST) {
    errno = ENOMEM;
    return NULL;
  }
  if (align <= HK_MAX_ALIGN_CLASS) {
    size_t need = hk_secure ? size + HK_SECURE_EXTRA : size;
    size_t req = (need + align - 1) & ~(align - 1);
    if (req < align) req = align;
    if (req <= HK_MEDIUM_MAX) {
      hk_init_check();
      unsigned cls = hk_size_class(req);
      while (cls < HK_NSIZES && ((hk_class_size[cls] & (align - 1)) != 0 || (align > 64 && hk_class_colored[cls])))
        cls++;
      /* (e.g. 64 KiB-aligned 256 KiB: the next uncoloured multiple is 1 MiB) */
      if (cls < HK_NSIZES && hk_class_size[cls] <= 2 * req) {
        /* padded blocks are only 64-aligned: their twin's are not padded */
        bool twin = align > HK_CLASS_PAD && hk_class_twin[cls];
        if (twin) cls = hk_class_twin[cls];
        void *p = hk_secure || twin ? hk_alloc_class(size, cls) : hk_malloc_fast(hk_class_size[cls]);
        if (p != NULL && zero) memset(p, 0, size);
        return p;
      }
      /* no class: a block at the start of its span, where the alignment
       * is at most a slab's (not where malloc must see the request: a heap
       * the thread uses, the profiler; nor in hardened mode, whose blocks
       * carry a canary and a trailer) */
      hk_heap *h = hk_tls.use == NULL && !hk_profile_on && !hk_secure && align <= HK_SLAB_SIZE ? hk_heap_get() : NULL;
      void *p = h != NULL ? hk_heap_aligned_span_block(h, req) : NULL;
      if (p != NULL) {
        if (zero) memset(p, 0, size);
        return p;
      }
    }
  }
  return hk_alloc_large(size, align, zero);
}

void *hk_alloc_aligned(size_t align, size_t size, bool zero) {
  if (align <= 16 && (align <= 8 || size > 8)) {
    /* the blocks of every class above 8 B are 16-aligned */
    return zero ? hk_calloc(1, size) : hk_malloc_fast(size);
  }
  if (align <= 64 && size <= HK_LUT_MAX - 64 && !hk_secure && !zero) {
    /* the class of a multiple of 32 or 64 up to HK_LUT_MAX has a size that
     * is a multiple of it too (init.c checks), and its blocks lie that far
     * apart from their slab's start: malloc's fast path, as it is */
    return hk_malloc_fast(size <= align ? align : (size + align - 1) & ~(align - 1));
  }
  return alloc_aligned_class(align, size, zero);
}

void *hk_realloc(void *p, size_t size) { return hk_realloc_in(p, size, NULL); }

/* Resize page's block, one of h's, in place to size bytes if it is alone
 * in its span (or shrinks in a span its class colours), by taking or
 * returning the slabs after it (queue.c, hk_heap_resize_span_block); false
 * where that does not apply or cannot be done. Not in hardened mode. (A
 * sampled block moves instead: its sample, of the size first asked for,
 * ends with its free, and the new block is sampled or not anew.) */
HK_INLINE bool span_resized(hk_heap *h, hk_page *page, size_t size, size_t usable) {
  if (size <= HK_SLAB_SIZE / 2 || size > HK_MEDIUM_MAX ||
      !(hk_span_block(page) || (size < usable && hk_colored_in_span(page))) || hk_load_relaxed(&page->sampled) ||
      !hk_heap_resize_span_block(h, page, size))
    return false;
  hk_purger_poke(); /* a shrink gave slabs back */
  return true;
}

/* realloc of a small block of the thread's own (below HK_REALLOC_SMALL,
 * before and after), as free's fast path finds it: of the rest of realloc
 * only the room applies to it (no span, no resize in place), so it stays
 * where it is or moves, with one page lookup; and of a bigger block of the
 * thread's own that stays where it is. Returns false, having
 * done nothing, for anything else (another thread's block, a program
 * heap's, hardened mode, a block that looks freed, a misaligned or invalid
 * pointer: all checked by the general path). */
HK_INLINE bool realloc_small(void *p, size_t size, void **out) {
  uintptr_t slab = hk_arena_slab((uintptr_t)p);
  if (HK_UNLIKELY(slab >= HK_ARENA_SLABS || hk_secure)) return false;
  hk_page *page = hk_arena_page(slab);
  hk_heap *h = hk_tls_heap;
  /* (a page's heap is untagged outside hardened mode; hk_heap_empty owns
   * none, and a thread heap's blocks belong to no program heap) */
  if (!hk_is_carved_block(page, (uintptr_t)p) || hk_load_relaxed(&page->heap) != h ||
      hk_looks_free(page, (hk_block *)p) || ((uintptr_t)p & 15) != 0)
    return false;
  size_t usable = hk_page_usable(page);
  if (usable >= HK_REALLOC_SMALL || size >= HK_REALLOC_SMALL) {
    /* a bigger block that does not grow past its room stays, as in the
     * general path: where its span resizes in place, or where it fits
     * without wasting more than half */
    if (size > usable || (!span_resized(h, page, size, usable) && size < usable / 2)) return false;
    *out = p;
    return true;
  }
  if (size <= usable && (size >= usable / 2 || usable <= 16)) {
    *out = p;
    return true;
  }
  void *q = hk_malloc_fast(size > usable ? size + size / 4 : size); /* (room: see below) */
  if (q != NULL) {
    if (size > usable) h->grown[h->grown_next++ % HK_GROWN_RING] = q;
    memcpy(q, p, size < usable ? size : usable);
    h->moving = 1; /* (as below) */
    hk_free_fast(p);
    h->moving = 0;
  }
  *out = q; /* (NULL: errno is ENOMEM, p is untouched) */
  return true;
}

/* realloc; heap: NULL, or the heap the program named (hak_heap_realloc),
 * which p must belong to. */
void *hk_realloc_in(void *p, size_t size, hk_heap *heap) {
  if (p == NULL) return hk_malloc_fast(size);
  if (size == 0 && heap == NULL) { /* glibc: free and return NULL */
    hk_free_fast(p);
    return NULL;
  }
  void *q;
  if (heap == NULL && realloc_small(p, size, &q)) return q;
  hk_region *r = hk_region_lookup(p);
  if (r != NULL && r->kind == HK_KIND_LARGE && heap == NULL && hk_large_resize_in_pages(r, p, size)) return p;
  if (r != NULL && r->kind != HK_KIND_LARGE) {
    /* a freed block first: its size (hardened mode: the trailer) is gone.
     * The owner confirms with the block's foreign tag (a freed block held
     * off the page's lists, as in the stash) or on its lists; another
     * thread may not walk them and, as free() does, takes a block that
     * looks free for a freed one (a live block's first word is 0 or user
     * data, which matches only by chance of the page's random key). */
    hk_page *page = hk_page_of(r, p);
    if (hk_is_carved_block(page, (uintptr_t)p) && hk_looks_free(page, (hk_block *)p) &&
        (hk_load_relaxed(&page->heap) != hk_owner_tag(hk_tls_heap) || hk_foreign_tagged(page, (hk_block *)p) ||
         hk_page_contains_free(page, (hk_block *)p)))
      hk_fatal("realloc() of a freed block", p);
  }
  size_t usable = hk_block_size_in(r, p, "realloc()"); /* also validates p */
  hk_heap *in = hk_user_heap_of(r, p); /* a block of a heap the program made stays in it */
  if (heap != NULL && in != heap) hk_fatal_in("hak_heap_realloc()", "a block of another heap (or of none)", p);
  if (size == 0) {
    hk_free_fast(p);
    return NULL;
  }
  /* A large block stays one down to a slab's worth (64 KiB): it shrinks in
   * place, its mapping's tail given back, and may grow again by mremap.
   * Moving it to a size class would copy it, and copy it again when it
   * grows back past 1 MiB. */
  if (r->kind == HK_KIND_LARGE && (size > HK_MEDIUM_MAX || size >= usable / 2 || size >= HK_SLAB_SIZE)) {
    void *q = hk_large_realloc(r, p, size);
    if (q != NULL) return q;
  }
  /* A block alone in its span grows or shrinks in place where it can. */
  if (r->kind != HK_KIND_LARGE && !hk_secure) {
    hk_page *page = hk_page_of(r, p);
    hk_heap *h = hk_tls_heap;
    if (hk_load_relaxed(&page->heap) == h && span_resized(h, page, size, usable)) return p;
  }
  /* The block stays where it is only if it is as aligned as malloc(size)
   * would be: 16 bytes, unless size fits the 8-byte class. */
  bool aligned_enough = ((uintptr_t)p & 15) == 0 || size <= 8;
  if (r->kind != HK_KIND_LARGE && hk_secure) {
    hk_page *page = hk_page_of(r, p);
    uint32_t bs = page->block_size;
    if (size <= bs - HK_SECURE_EXTRA && size + HK_SECURE_EXTRA >= bs / 2 && aligned_enough) {
      hk_secure_set_size(page, (hk_block *)p, size); /* new canary position */
      return p;
    }
  } else if (r->kind != HK_KIND_LARGE && size <= usable && (size >= usable / 2 || usable <= 16) && aligned_enough) {
    return p; /* fits, and not wasting more than half */
  }
  /* A block that grows is likely to grow again: give it room for another
   * quarter, so the next steps of a buffer growing by small amounts stay in
   * place instead of moving through every size class. (In hardened mode
   * from 4 KiB only: there the canary follows the room, not the request.) */
  size_t want = size;
  if (size > usable && size <= HK_MEDIUM_MAX && (!hk_secure || size >= HK_SECURE_ROOM_MIN)) {
    want = size + size / 4;
    if (want > HK_MEDIUM_MAX) want = HK_MEDIUM_MAX;
  }
  /* From a slab's worth up, a block that keeps growing moves into a span of
   * its own, with free slabs after it where possible, so its next steps are
   * in place. "Keeps growing": this thread's realloc grew it before (one of
   * the last HK_GROWN_RING blocks it grew). A block resized to random sizes
   * would otherwise take such a span from the regions, and give it back, on
   * every growth past 64 KiB. A first growth to HK_REALLOC_SPAN_MIN or more
   * takes one too: the classes there hold at most four blocks a page, each
   * class's page a span of its own that a buffer growing through the
   * classes would leave behind, and beside the two slabs or more that the
   * block then writes, taking its span from the regions costs little. */
  q = NULL;
  hk_heap *gh = size > usable && in == NULL ? hk_heap_get() : NULL;
  bool again = gh != NULL && r->kind != HK_KIND_LARGE && hk_span_block(hk_page_of(r, p));
  if (gh != NULL) {
    for (unsigned i = 0; i < HK_GROWN_RING; i++)
      if (gh->grown[i] == p) {
        again = true;
        gh->grown[i] = NULL;
      }
  }
  bool span = again ? want >= HK_SLAB_SIZE : gh != NULL && r->kind != HK_KIND_LARGE && want >= HK_REALLOC_SPAN_MIN;
  if (span && want <= HK_MEDIUM_MAX && !hk_secure) q = hk_heap_alloc_span_block(gh, want);
  if (q == NULL) q = in != NULL ? hk_user_heap_alloc(in, want) : hk_malloc_fast(want);
  if (q == NULL) return NULL; /* errno is ENOMEM; p is untouched */
  if (gh != NULL) gh->grown[gh->grown_next++ % HK_GROWN_RING] = q;
  memcpy(q, p, size < usable ? size : usable);
  if (in != NULL && r->kind != HK_KIND_LARGE && !hk_secure) {
    hk_user_heap_free_own(in, hk_page_of(r, p), p); /* (its own page's list: no remote free) */
    return q;
  }
  /* the page p empties, if it does, is not held (queue.c): the buffer moved
   * on; a sampled block's page is the thread's sample heap's (profile.c) */
  hk_heap *h = hk_tls_heap, *samples = h != &hk_heap_empty ? h->sample_heap : NULL;
  if (h != &hk_heap_empty) h->moving = 1; /* (a thread at exit may have none) */
  if (samples != NULL) samples->moving = 1;
  hk_free_fast(p);
  if (h != &hk_heap_empty) h->moving = 0;
  if (samples != NULL) samples->moving = 0;
  return q;
}

/* A block of a heap the program made resized as realloc() would (realloc
 * keeps every block in its heap); p must be NULL or one of heap's blocks. */
HK_API void *hak_heap_realloc(hak_heap_t *heap, void *p, size_t size) {
  if (p == NULL) return hak_heap_malloc(heap, size);
  return hk_realloc_in(p, size, hk_user_heap_named(heap, "hak_heap_realloc()"));
}

/* ---- the hak_ API ---- */
HK_API HK_HOT void *hak_malloc(size_t size) { return hk_malloc_fast(size); }
HK_API void *hak_calloc(size_t n, size_t size) { return hk_calloc(n, size); }
HK_API void *hak_realloc(void *p, size_t size) { return hk_realloc(p, size); }

HK_API void *hak_reallocarray(void *p, size_t n, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(n, size, &total)) {
    errno = ENOMEM;
    return NULL;
  }
  return hk_realloc(p, total);
}

HK_API int hak_posix_memalign(void **out, size_t align, size_t size) {
  if (!is_pow2(align) || align % sizeof(void *) != 0) return EINVAL;
  int saved = errno;
  void *p = hk_alloc_aligned(align, size, false);
  if (p == NULL) {
    errno = saved;
    return ENOMEM;
  }
  *out = p;
  return 0;
}

/* glibc's memalign: any alignment is accepted and rounded up to a power of
 * two (0 and 1 mean none); only one above 2^63 is EINVAL. */
HK_API void *hak_memalign(size_t align, size_t size) {
  if (align > SIZE_MAX / 2 + 1) {
    errno = EINVAL;
    return NULL;
  }
  if (align < 2) align = 1;
  if (!is_pow2(align)) align = (size_t)1 << (64 - __builtin_clzll((unsigned long long)align));
  return hk_alloc_aligned(align, size, false);
}

/* C11 and glibc >= 2.38: the alignment must be a power of two (EINVAL). */
HK_API void *hak_aligned_alloc(size_t align, size_t size) {
  if (!is_pow2(align)) {
    errno = EINVAL;
    return NULL;
  }
  return hk_alloc_aligned(align, size, false);
}
HK_API void *hak_valloc(size_t size) { return hk_alloc_aligned(hk_os_page, size, false); }

HK_API void *hak_pvalloc(size_t size) {
  if (size > SIZE_MAX - hk_os_page) {
    errno = ENOMEM;
    return NULL;
  }
  size_t rounded = (size + hk_os_page - 1) & ~(size_t)(hk_os_page - 1);
  return hk_alloc_aligned(hk_os_page, rounded ? rounded : hk_os_page, false);
}

HK_API int hak_malloc_trim(size_t pad) {
  (void)pad;
  return hk_pressure_trim();
}

/* mallopt (docs/OPTIONS.md, "At run time"): glibc's parameters that have
 * a meaning here change the option they mean; those that name something
 * hakmem does not have (arenas, fastbins, a heap top) are accepted with no
 * effect, as glibc accepts them; those hakmem cannot honour fail (0). */
HK_API int hak_mallopt(int param, int value) {
  hk_init();
  switch (param) {
  case -1: /* M_TRIM_THRESHOLD: free bytes kept before giving back: empty regions kept per list */
    return value >= 0 && hk_option_set("REGION_RESERVE", ((long)value + HK_REGION_SIZE - 1) / HK_REGION_SIZE) == 0;
  case -3: /* M_MMAP_THRESHOLD: blocks above 1 MiB have mappings of their own, and a cache of them */
  case 1:  /* M_MXFAST */
  case -2: /* M_TOP_PAD */
  case -5: /* M_CHECK_ACTION: hakmem's errors always abort */
  case -7: /* M_ARENA_TEST */
  case -8: /* M_ARENA_MAX: a heap per thread, no arenas */
    return 1;
  case -4: /* M_MMAP_MAX: 0 (no mappings of their own) cannot be had */
    return value != 0;
  default: /* M_PERTURB (-6) and the unknown */
    return 0;
  }
}

/* Options at run time (docs/OPTIONS.md): 0, or -1 and errno. */
HK_API int hak_option_get(const char *name, long *value) {
  hk_init();
  int err = value != NULL ? hk_option_get(name, value) : EINVAL;
  if (err != 0) errno = err;
  return err != 0 ? -1 : 0;
}

HK_API int hak_option_set(const char *name, long value) {
  hk_init();
  int err = hk_option_set(name, value);
  if (err != 0) errno = err;
  return err != 0 ? -1 : 0;
}

/* Memory back to the system now: 0, what has waited a purge delay; 1,
 * everything free (malloc_trim). The RSS given back, in bytes. */
HK_API size_t hak_release(int level) {
  hk_init();
  size_t before = hk_os_current_rss_kb();
  if (level <= 0) hk_pressure_purge_pass();
  else hk_pressure_trim();
  size_t after = hk_os_current_rss_kb();
  return before > after ? (before - after) << 10 : 0;
}

HK_API void hak_cfree(void *p) { hk_free_fast(p); }

/* The handler a crossed soft limit calls (docs/OPTIONS.md, memory limits). */
HK_API void hak_set_pressure_handler(void (*handler)(void *arg), void *arg) {
  hk_init();
  hk_pressure_handler_arg = arg;
  hk_pressure_handler = handler;
}

HK_API const char *hak_version(void) { return HK_VERSION_STRING; }
