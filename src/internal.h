/* hakmem's internal declarations: every module's functions and globals, by
 * layer, lowest first. A module calls only modules above it in this file
 * (tools/layers.py checks the object files against the same order).
 *
 *   types.h  the structures and the geometry's constants
 *   sync.h   locks (fork-aware) and the named atomic operations
 *   list.h   the intrusive doubly linked list
 *   block.h  inline operations on blocks, pages and regions
 */
#ifndef HK_INTERNAL_H
#define HK_INTERNAL_H

#include "types.h"
#include "sync.h"
#include "list.h"
#include "block.h"
#include "debug.h"

#if defined(__has_include)
#if __has_include(<sys/single_threaded.h>)
#include <sys/single_threaded.h>
#define HK_HAVE_SINGLE_THREADED 1
#endif
#endif

#pragma GCC visibility push(hidden)

/* HK_VERSION_STRING, the library's version, is defined by the build
 * (CMakeLists.txt's project version): the one place it is written. */

/* ==== services ==== */

/* ---- os.c: every system call hakmem makes ---- */
void *hk_os_map_aligned(size_t size, size_t align);   /* NULL on failure */
void *hk_os_reserve(size_t size, size_t align);       /* PROT_NONE address space; NULL on failure */
bool hk_os_commit(void *p, size_t size);
void hk_os_decommit(void *p, size_t size);
void hk_os_unmap(void *p, size_t size);
void hk_os_guard(void *p, size_t size);                /* PROT_NONE */
bool hk_os_guard_light(void *p, size_t size);         /* a guard without a mapping of its own (false: none) */
bool hk_os_has_guard_light(void);                     /* false once the kernel refused hk_os_guard_light */
size_t hk_os_page_size(void);                          /* the kernel's */
bool hk_os_unguard(void *p, size_t size);              /* back to read-write, contents kept */
void hk_os_purge(void *p, size_t size);               /* MADV_DONTNEED */
void *hk_os_remap(void *p, size_t old_size, size_t new_size, size_t align); /* NULL on failure */
void *hk_os_remap_headed(void *p, size_t old_size, size_t new_size, size_t align, size_t head, size_t header);
bool hk_os_shrink(void *p, size_t old_size, size_t new_size);
bool hk_os_space_limited(size_t need); /* an RLIMIT_AS that a mapping of need bytes fits under */
bool hk_os_space_tight(void);            /* an RLIMIT_AS or RLIMIT_DATA holds */
int hk_os_tid(void);                     /* the calling thread's kernel id */
int hk_os_pid(void);
void hk_os_sleep_ms(long ms);
uint64_t hk_os_now_us(void);             /* the monotonic clock, in microseconds */
unsigned hk_os_cpu_count(void);          /* CPUs this process may run on (1 if unknown) */
bool hk_os_thread_gone(int tid, int pid); /* that thread of process pid has exited (pid: this process) */
uint64_t hk_os_now_ms(void);
bool hk_os_random(uint64_t *v);      /* 64 bits from the kernel; false if it gives none */
size_t hk_os_peak_rss_kb(void);
size_t hk_os_current_rss_kb(void);
void hk_os_write_stderr(const char *s, size_t n);
void hk_os_write(int fd, const char *s, size_t n);
int hk_os_open_locked(const char *path); /* for writing, created if need be, with an exclusive flock held
                                            by this process (-1: another one holds it, or no such file) */
int hk_os_create(const char *path);      /* for writing, created or truncated (-1: failed) */
long hk_os_read_file(const char *path, char *buf, size_t size); /* NUL-terminated; -1: not readable */
void hk_os_huge(void *p, size_t size, bool on); /* MADV_HUGEPAGE / MADV_NOHUGEPAGE */
bool hk_os_start_thread(void *(*main)(void *)); /* detached, signals blocked (false: not started) */
void hk_os_truncate(int fd);             /* to empty, writing from the start */
void hk_os_close(int fd);
void hk_os_copy_file(const char *path, int fd);  /* path's contents written to fd */
void hk_os_on_signal(int sig, void (*handler)(int));
extern bool hk_verbose;            /* HAKMEM_VERBOSE */
void hk_warning(const char *msg);  /* to stderr, with HAKMEM_VERBOSE only */

/* ---- error.c ---- */
HK_COLD __attribute__((noreturn)) void hk_fatal(const char *what, const void *p);
HK_COLD __attribute__((noreturn)) void hk_fatal_in(const char *who, const char *what, const void *p);

/* ---- keys.c ---- */
extern uintptr_t hk_key, hk_key2; /* the secret keys derive from */
void hk_keys_init(void);
uintptr_t hk_derive_key(uint64_t a, uint64_t b); /* keyed hash of (a, b), bits 48-63 >= 0x100 */
uintptr_t hk_page_key(uint64_t page);            /* a page's key, from its thread's seed */
void hk_derive_list_keys(uint64_t a, uint64_t b, uintptr_t *add, uintptr_t *mul, uintptr_t *inv); /* hk_cache_link's */
uint64_t hk_random_gap(uint64_t mean);           /* exponentially distributed, this thread's generator */
double hk_neg_log_uniform(uint64_t r);          /* -ln(u), u uniform in (0, 1) from r's top 53 bits */
size_t hk_fmt_hex(char *buf, uintptr_t v);
size_t hk_fmt_dec(char *buf, uint64_t v);
size_t hk_fmt_json_char(char *buf, unsigned char ch); /* ch escaped for a JSON string (1-6 bytes) */
bool hk_fmt_path(char *name, size_t size, const char *pattern, const char *suffix); /* %p: the pid */

/* ---- options.c ---- */
extern hk_options hk_opt;
void hk_options_init(void);
void hk_options_print(int fd);

/* ---- stats.c: counters, updated on slow paths only ---- */
extern hk_stats_t hk_stats;
#define hk_stat_add(field, n) hk_add_relaxed(&hk_stats.field, (n))
void hk_stat_peak(_Atomic uint64_t *peak, uint64_t v);
void hk_stats_merge_heap(const hk_heap_stats *s); /* an exiting thread's counters */
/* What the counters do not hold, gathered for the text report (inspect.c). */
typedef struct hk_usage {
  size_t region_mapped, region_in_use, region_peak; /* bytes of small/medium regions */
  size_t large_mapped, large_cached;                /* bytes of large mappings, and of those cached */
  uint32_t abandoned_empty;                         /* empty pages of exited threads kept now */
  hk_heap_stats self;                               /* the calling thread's heap's counters */
} hk_usage;
void hk_stats_add_exited(hk_heap_stats *s); /* the exited threads' counters added to *s */
void hk_stats_init(void);                   /* at start: HAKMEM_STATS_FILE's lock */
int hk_stats_report_fd(void);               /* where this process's report goes (opened now) */
void hk_stats_report_done(int fd);

/* ---- purger.c: a background thread that runs the purge pass it is given ---- */
/* pass: give back what is due; pending: whether anything may become due */
void hk_purger_init(void (*pass)(void), bool (*pending)(void));
void hk_purger_notify(void);      /* malloc's slow path, realloc, thread exit, malloc_trim */
void hk_purger_notify_free(void); /* free(): may only note that the purger is wanted */
void hk_purger_start(void);       /* a second thread's first malloc, thread exit: start it if it never was */
extern _Atomic int hk_purger_wanted; /* a free released memory before the purger ran */
extern __thread bool hk_purge_poke __attribute__((tls_model("initial-exec")));
/* Wake the purger if this thread released slabs, or start it if a free
 * wanted it; call only with no allocator lock held and the heap consistent
 * (starting the thread may call malloc). Not from free: hk_purger_poke_free. */
HK_INLINE void hk_purger_poke(void) {
  if (HK_UNLIKELY(hk_purge_poke || hk_load_relaxed(&hk_purger_wanted))) {
    hk_purge_poke = false;
    hk_purger_notify();
  }
}
HK_INLINE void hk_purger_poke_free(void) {
  if (HK_UNLIKELY(hk_purge_poke)) {
    hk_purge_poke = false;
    hk_purger_notify_free();
  }
}
void hk_purger_fork_prepare(void);
void hk_purger_fork_parent(void);
void hk_purger_fork_child(void);

/* ==== geometry and address space ==== */

/* ---- sizeclass.c ---- */
void hk_sizeclass_init(void);

/* ---- arena.c: the arena reservation, its page table, the ownership map ---- */
void hk_arena_init(void);
hk_region *hk_arena_take(void);          /* a free slot, or NULL (arena_lock inside) */
void hk_arena_give(hk_region *r);        /* slot r is free again */
bool hk_arena_contains(const hk_region *r);
bool hk_arena_shrink(void);              /* unmap the arena's never-used slots */
/* point the page table's entries of slabs first..first+n-1 of r at page (NULL: none) */
void hk_arena_table_set(hk_region *r, unsigned first, unsigned n, const hk_page *page);
bool hk_region_map_prepare(const void *base);   /* the map can take base (false: out of memory) */
void hk_region_register(void *base);
void hk_region_unregister(void *base);
/* A limit on address space or data holds (asked again whenever a region
 * or a large block is mapped). Every byte mapped counts against such a limit, used or
 * not, so while one holds, blocks from HK_TIGHT_LARGE_MIN up are mapped to
 * their size in the large tier instead of taking a class's rounding, a
 * span's slack and a region's room: from 64 KiB, and from 4 pages with
 * pages of 64 KiB, where rounding the block and its header up to whole
 * pages wastes less than those do. */
extern _Atomic bool hk_space_tight;
void hk_space_check(bool force); /* ask again (before a region or large mapping) */
#define HK_TIGHT_LARGE_MIN (4 * hk_os_page > ((size_t)64 << 10) ? 4 * hk_os_page : ((size_t)64 << 10))
void hk_arena_fork_lock(void);
void hk_arena_fork_unlock(void);

/* ---- region.c: slab spans, shared by all threads (a lock per region list, off the fast path) ---- */
void hk_region_init(void); /* the number of region lists */
void hk_region_fork_lock(void);   /* every region lock, in order */
void hk_region_fork_unlock(void);
/* NULL on OOM; dirty: bit k set if the span's slab k may hold committed
 * memory (0: the span is clean); room: prefer a run followed by this many
 * free slabs; home: the heap's region list; *grew: the program grew and
 * the regions' free slabs were purged (the heaps' spares are next) */
hk_page *hk_region_alloc_span(unsigned nslabs, unsigned cls, hk_slabmask *dirty, unsigned room,
                              unsigned home, bool *grew);
extern _Atomic uint32_t hk_growth_epoch; /* moves when the program has grown */
void hk_region_free_span(hk_page *page);
void hk_region_free_span_purged(hk_page *page); /* purge the span's memory, then free it */
void hk_region_lend_slabs(hk_page *page, unsigned lend); /* bit k: the span's slab k (k > 0) */
bool hk_region_grow_span(hk_page *page, unsigned nslabs);   /* take the free slabs after it, if free */
void hk_region_shrink_span(hk_page *page, unsigned nslabs); /* give back its tail slabs */
bool hk_region_purge(bool force);                 /* true if memory was released */
bool hk_region_pending(void);                     /* dirty slabs or spare regions left */
void hk_region_usage(size_t *mapped, size_t *in_use, size_t *peak);
void hk_region_each_page(void (*fn)(const hk_page *page, void *arg), void *arg); /* every live page */

/* ==== pages ==== */

/* ---- page.c: carving and collecting one page's blocks ---- */
void hk_page_init(hk_page *page, unsigned cls);
size_t hk_color_offset(void);
bool hk_page_extend(hk_page *page);
uint32_t hk_page_collect(hk_page *page, unsigned new_state);
#define HK_COLLECT_RECLAIMED UINT32_MAX
bool hk_page_contains_free(hk_page *page, hk_block *b);
/* A parked page that a remote freer found free and gave back (remote.c)
 * starts over as a new page of its class, nothing carved (RECLAIMED). BUSY:
 * that freer is still at it. */
enum { HK_PAGE_KEPT, HK_PAGE_WAS_RECLAIMED, HK_PAGE_BUSY };
int hk_page_reclaimed(hk_page *page);

/* ---- secure.c: hardened mode's checks ---- */
void hk_secure_on_alloc(hk_page *page, hk_block *b, size_t size);
void hk_secure_clear_span(const hk_page *page);
void hk_secure_assert_clear(const hk_page *page); /* (debug build) */
void hk_secure_set_size(hk_page *page, hk_block *b, size_t size);
void hk_secure_shuffle_extend(hk_page *page, uint32_t n);

/* ==== a heap's pages ==== */

/* ---- spares.c: empty spans a heap keeps; the list of every heap ---- */
extern pthread_mutex_t hk_heap_lock;  /* the list of every heap, the heap pool */
extern hk_heap *hk_all_heaps;         /* every heap ever made (hk_heap_lock to walk) */
bool hk_spare_put(hk_heap *h, hk_page *page); /* false: over the heap's limit, release it */
hk_page *hk_spare_take(hk_heap *h, unsigned cls, unsigned nslabs);
hk_page *hk_spares_detach(hk_heap *h, uint64_t older_than, uint32_t keep); /* under h->spare_lock */
void hk_spares_release_big(hk_heap *h); /* before a span block with room: spares of blocks >= a slab go back */
void hk_spares_expire(bool force);  /* give back spare spans unused for a purge delay */
void hk_spares_trim(void);          /* the program grew: give back spares beyond HK_SPARE_BYTES */
bool hk_spares_pending(void);

/* ---- lend.c: free medium blocks purged, free slabs lent back ---- */
#define HK_PURGE_BLOCK_MIN (16u << 10)
void hk_page_purge_free_blocks(hk_page *page);
uint64_t hk_block_purge_inside(void *b, uint32_t bs); /* a freed block but its first OS page: bytes given back */
bool hk_page_trim_tail(hk_page *p);
void hk_heap_purge_blocks(hk_heap *h, bool force);
/* Whether hk_heap_purge_blocks(h, false) may have work: the program grew,
 * or this is every 8th call (the clock is read then only). */
HK_INLINE bool hk_heap_purge_blocks_due(hk_heap *h) {
  return h->growth_epoch != hk_load_relaxed(&hk_growth_epoch) || (++h->purge_calls % 8) == 0 ||
         hk_opt.purge_delay_ms == 0;
}

/* ---- abandoned.c: pages of exited threads ---- */
extern _Atomic uint32_t hk_abandoned_hint;         /* a remote free reached an abandoned page */
void hk_abandon_page(hk_page *page);
hk_page *hk_abandoned_adopt(hk_heap *h, unsigned cls, bool used_only);
void hk_abandoned_unfull(hk_page *page);
void hk_abandoned_sweep(bool trim, bool force);
uint32_t hk_abandoned_empty(void);                 /* empty pages of exited threads kept now */
void hk_abandoned_fork_lock(void);
void hk_abandoned_fork_unlock(void);

/* ---- queue.c: a heap's page queues, full pages, the page search ---- */
extern hk_page hk_page_empty;
extern hk_heap hk_heap_empty;     /* every thread starts here: direct[] -> hk_page_empty */
/* What malloc's fast path reads of its thread, in one thread-local block
 * (one address computation for both fields). */
typedef struct hk_tls_state {
  hk_heap *heap;  /* the thread's heap (hk_heap_empty: none yet, or gone) */
  uint64_t budget; /* bytes malloc's fast path may hand out before it calls hk_malloc_gated,
                      which it does when the budget's top bit is set: every time while
                      it is HK_BUDGET_SHUT (no heap, cache mode, hardened mode); with the
                      profiler on, it holds the bytes until the next sample (profile.c);
                      HK_BUDGET_OPEN otherwise. A request of 2^62 bytes or more can move
                      it across the top bit either way; hk_malloc_slow, which serves
                      those, sets it again. Shut too while `use` is set. */
  hk_heap *use;   /* the heap the thread's mallocs take blocks from (hak_heap_use), or NULL:
                     its own */
} hk_tls_state;
#define HK_BUDGET_OPEN ((uint64_t)1 << 62)
#define HK_BUDGET_SHUT ((uint64_t)3 << 62)
extern __thread hk_tls_state hk_tls __attribute__((tls_model("initial-exec")));
#define hk_tls_heap (hk_tls.heap)
void hk_tls_arm(void); /* the budget for the thread's heap as it is now (queue.c) */
extern bool hk_profile_on;       /* HAKMEM_PROFILE: the profiler samples (profile.c) */
void hk_heap_set_direct(hk_heap *h, unsigned cls, hk_page *page);
void hk_heap_set_current(hk_heap *h, unsigned cls);
void hk_heap_release_page(hk_heap *h, hk_page *page);
void hk_heap_full_remove(hk_heap *h, hk_page *p);
void hk_heap_rescue_full(hk_heap *h);
void *hk_heap_alloc(hk_heap *h, size_t size, unsigned cls); /* a block of class cls, NULL: ENOMEM */
void hk_heap_page_emptied(hk_heap *heap, hk_page *page);
/* held pages' and stashed blocks' bytes within the held budget (the stash's
 * blocks of parked pages of several blocks have a bound of their own) */
HK_INLINE uint32_t hk_heap_held_bytes(const hk_heap *h) { return h->held_bytes + h->stash_bytes - h->stash_parked_bytes; }
/* The stash (queue.c) keeps freed blocks of parked pages of several blocks
 * in two kinds: of 16 B to HK_STASH_PARKED_SIZE, outside the held budget,
 * and above that in pages of at most HK_STASH_FEW_BLOCKS, within it. */
#define HK_STASH_PARKED_SIZE 8192 /* pages of one slab, 8 blocks or more */
#define HK_STASH_FEW_BLOCKS 4
HK_INLINE bool hk_stash_medium(const hk_page *page) {
  return page->reserved != 1 && page->reserved <= HK_STASH_FEW_BLOCKS && page->block_size > HK_STASH_PARKED_SIZE;
}
void *hk_heap_stash_malloc(hk_heap *h, unsigned cls); /* the first stashed block of class cls (there
                                    is one), live again */
void *hk_heap_next_page_malloc(hk_heap *h, hk_page *page); /* page's list ended: the next
                                    page's block, or NULL (the slow path's turn) */
void hk_heap_stash_flush(hk_heap *h); /* the stashed blocks back to their pages */
void hk_heap_stash_purge_idle(void);  /* the purger: idle stashes' memory back to the OS */
bool hk_heap_stash_pending(void);     /* a stash waits for that */
void hk_free_local_checked(hk_heap *heap, hk_page *page, hk_block *b);
void hk_free_local_push(hk_heap *heap, hk_page *page, hk_block *b);
bool hk_heap_resize_span_block(hk_heap *heap, hk_page *page, size_t size);
void *hk_heap_alloc_span_block(hk_heap *heap, size_t size);
void *hk_heap_calloc_span_block(hk_heap *heap, size_t size); /* calloc from a slab up: zeroed, or NULL */
void *hk_heap_aligned_span_block(hk_heap *heap, size_t size); /* 64 KiB-aligned, at its span's start */
/* The owner's clock (active_ms), read by every thread that frees one of
 * its blocks: written only when the millisecond changed, since each write
 * takes the line from all their caches. */
HK_INLINE void hk_heap_note_active(hk_heap *h) {
  uint64_t now = hk_os_now_ms();
  if (hk_load_relaxed(&h->active_ms) != now) hk_store_relaxed(&h->active_ms, now);
}

/* ---- remote.c: frees of other heaps' blocks, the thread cache ---- */
void hk_free_to_cache(hk_block *b, hk_page *page, hk_heap *self); /* (the order free() has them in) */
void hk_secure_free(hk_block *b, hk_page *page, hk_heap *self);   /* hardened mode's free of a carved block */
void hk_secure_quarantine_flush(hk_heap *h); /* hardened mode's quarantine, back to the pages */
void *hk_secure_cache_pop(hk_heap *h, unsigned cls, hk_block *b, size_t size); /* ... its cache's block b */
/* A cached (or stashed) block links to the next through its second word
 * (blocks of 16 bytes and more); its first word is the foreign tag. The
 * link is (next + list_add) * list_mul mod 2^64, with the heap's two keys
 * (list_mul odd, list_inv its inverse): decoding multiplies by list_inv and
 * subtracts list_add, and an address above HK_VA_BITS (48) bits, where no
 * block lies (the ownership map covers no more), is a link the program
 * overwrote in a freed block. A changed link decodes to an address whose
 * top 16 bits are spread by the multiply: it passes with odds of 2^-16,
 * a zeroed one never (list_add lies in [2^62, 2^63): -list_add has its top
 * bit set). One multiply each way, where a separate keyed hash of the
 * address took a multiply and four masks. */
HK_INLINE uintptr_t hk_cache_link(const hk_heap *h, const hk_block *next) {
  return ((uintptr_t)next + h->list_add) * h->list_mul;
}
HK_NOINLINE HK_COLD __attribute__((noreturn)) void hk_cache_corrupted(const hk_block *b);
HK_INLINE hk_block *hk_cache_next(const hk_heap *h, const hk_block *b) {
  uintptr_t a = (&b->link)[1] * h->list_inv - h->list_add;
  if (HK_UNLIKELY(a >> HK_VA_BITS != 0)) hk_cache_corrupted(b);
  return (hk_block *)a;
}
/* Take b, the class's first cached block, as a live block. */
HK_INLINE void *hk_cache_pop(hk_heap *h, size_t cls, hk_block *b) {
  h->cache_first[cls] = hk_cache_next(h, b);
  h->cache_room[cls]++;
  h->cache_bytes -= hk_class_size[cls];
  b->link = 0; /* a live block must not look free */
  (&b->link)[1] = 0;
  h->stats.cache_reused++;
  return b;
}
HK_NOINLINE void *hk_cache_pop_noting_time(hk_heap *h, size_t cls, hk_block *b);
void hk_reclaim_fork_prepare(void);
void hk_reclaim_fork_done(void);
void hk_cache_flush_all(hk_heap *h);

/* ==== heaps, large blocks ==== */

/* ---- heap.c: heaps' life cycle ---- */
hk_heap *hk_heap_new(bool for_thread);            /* NULL: out of memory */
void hk_heap_abandon(hk_heap *h);                 /* its thread exits: pages abandoned, heap pooled */
void *hk_heap_alloc_late(size_t size, unsigned cls); /* from the shared heap of threads past their own */
void hk_heap_collect(hk_heap *heap, bool release_all);
void hk_heap_reap(void);          /* abandon the heaps whose thread has exited without doing so */
void hk_heap_fork_lock(void);
void hk_heap_fork_child(void);
void hk_heap_fork_unlock(void);
hk_heap *hk_heap_new_user(const char *name);      /* a heap for the program (user_heap.c), labelled
                                                     name (NULL: none, else <= HK_LABEL_MAX bytes); NULL: ENOMEM */
hk_heap *hk_heap_find_user(const char *name);     /* the live user heap of that label, or NULL */
size_t hk_heap_labelled(hk_heap **out, size_t max); /* the live user heaps with a label */
void hk_heap_recycle_user(hk_heap *h);            /* ... destroyed, its pages given back */
void hk_heap_trim_users(void);                    /* malloc_trim: their free pages given back */
void hk_heap_fork_lock_users(void);               /* fork: the program's heaps' locks, first */
void hk_heap_fork_unlock_users(void);

/* ---- large.c ---- */
extern pthread_mutex_t hk_large_lock;
void *hk_large_alloc(size_t size, size_t align, bool zero);
void hk_large_free(hk_region *r, void *p);
void *hk_large_realloc(hk_region *r, void *p, size_t size);
bool hk_large_resize_in_pages(hk_region *r, void *p, size_t size); /* realloc's lock-free step: the same pages */
bool hk_large_trim(bool force);
bool hk_large_pending(void);
void hk_large_fork_child(void); /* (hk_large_lock held) */
size_t hk_large_usable(hk_region *r);
hk_region *hk_large_find_detached(const void *p);
void hk_large_set_sampled(void *p);                  /* the heap profiler sampled this large block */
void hk_large_join_heap(void *p, hk_heap *h);        /* a new large block becomes a user heap's */
hk_heap *hk_large_heap_of(const hk_region *r);       /* its user heap, or NULL */
void hk_large_free_heap(hk_heap *h);                 /* free a user heap's large blocks */
size_t hk_large_heap_blocks(hk_heap *h, void **out, size_t max); /* its live ones */
void hk_large_heap_sum(hk_heap *h, unsigned long long *blocks, unsigned long long *bytes, unsigned long long *mapped); /* ... added up */
void hk_large_thread_sum(hk_heap *h, uint64_t *blocks, uint64_t *bytes); /* ... its thread's live large blocks */

/* ---- profile.c: the sampling heap profiler ---- */
void hk_profile_init(void);        /* at start-up: HAKMEM_PROFILE */
void hk_profile_load(void);        /* then, malloc working: the unwinder; sampling starts */
void *hk_profile_malloc(hk_heap *h, size_t size, unsigned cls); /* a sampled block of class cls from h's
                                                                 sample heap (NULL: allocate as usual) */
hk_heap *hk_sample_heap_take(void); /* a heap for a thread's sampled blocks (heap.c) */
bool hk_profile_large(void *p, size_t size);        /* sample the large block p (false: not sampled) */
/* The sampled block p is freed: it leaves the profile. heap: its page's
 * (where its sample is first looked for), NULL for a large block. */
void hk_profile_forget(void *p, const hk_heap *heap);
extern void (*hk_sample_freed)(void *block, const hk_heap *heap); /* = hk_profile_forget, for the files below
                                                                     profile.c (page.c) */
void hk_page_mark_sampled(hk_page *page);    /* its one block is a live sample (queue.c) */
/* A block of the page is being freed, by any thread: if it is a page of
 * one block and that block a sample (hk_page_mark_sampled), the sample
 * goes. The page's owner calls it when the free empties the page
 * (hk_heap_page_emptied), every other free path before it
 * hands the block on (hk_free_to_cache); both only with hk_free_checks. */
HK_INLINE void hk_page_sample_freed(hk_page *page) {
  if (HK_LIKELY(!hk_load_relaxed(&page->sampled))) return;
  hk_store_relaxed(&page->sampled, 0);
  hk_sample_freed((void *)page->start, hk_owner_untag(hk_load_relaxed(&page->heap)));
}
void hk_profile_poll(void);        /* write the profile if the signal asked for it */
int hk_profile_dump(const char *path);
void hk_profile_peak(uint64_t live_bytes); /* the timeline's live bytes: a new peak writes a profile */
void hk_profile_fork_prepare(void);
void hk_profile_fork_parent(void);
void hk_profile_fork_child(void);
/* ---- memory limits (limits.c) ---- */
void hk_limits_fork_child(void);
bool hk_limit_allows(size_t more);    /* may hakmem map `more` bytes? (a soft limit crossed: noted) */
uint64_t hk_limit_held(void);         /* bytes hakmem holds: regions and large mappings */
int hk_thp_advice(size_t size, bool region); /* HAKMEM_THP's advice for a new mapping: 1, -1 or 0 */
void hk_limits_get(uint64_t *hard, uint64_t *soft);
extern _Atomic bool hk_limit_soft_crossed;
void hk_pressure_soft(void);          /* a soft limit was crossed: give back, call the handler (pressure.c) */
extern void (*hk_pressure_handler)(void *arg);
extern void *hk_pressure_handler_arg;

extern void (*hk_fork_child_done)(void);
int hk_option_get(const char *name, long *value); /* 0 or an errno (options.c) */
int hk_option_set(const char *name, long value); /* init.c calls it last in a forked child: set by inspect.c
                                        (the timeline, HAKMEM_TIMELINE_FILE), above init.c */
void hk_large_usage(size_t *mapped, size_t *cached); /* all large mappings, and the cached ones, at one time */
size_t hk_large_live_bytes(void);                    /* bytes asked for by the live large blocks */

/* ==== memory pressure, initialisation, threads ==== */

/* ---- pressure.c: giving memory back when it is short, or asked for ---- */
void hk_pressure_release(size_t need); /* a mapping of need bytes failed: give back the caches, then retry once */
int hk_pressure_trim(void);            /* malloc_trim */
void hk_pressure_purge_pass(void);     /* the purger's pass */
bool hk_pressure_pending(void);
void hk_pressure_usage(hk_usage *u);
void hk_pressure_hold(void);          /* no purger pass runs until hk_pressure_unhold (statistics) */
void hk_pressure_unhold(void);
void hk_pressure_fork_child(void);   /* what hk_stats_print and mallinfo report beside the counters */

/* ---- init.c ---- */
extern _Atomic int hk_init_state;   /* 0 none, 1 running, 2 done */
void hk_init(void);
HK_INLINE void hk_init_check(void) {
  if (hk_load_acquire(&hk_init_state) != 2) hk_init();
}
void hk_fork_prepare(void);
void hk_fork_parent(void);
void hk_fork_child(void);
/* Could another thread exist? glibc says (2.32+); without it, assume so. */
HK_INLINE bool hk_maybe_threaded(void) {
#ifdef HK_HAVE_SINGLE_THREADED
  return !__libc_single_threaded;
#else
  return true;
#endif
}
/* The fork handlers, registered once the process may have a second thread.
 * calloc checks, for glibc's pthread_create calls it before the new thread
 * exists. */
extern _Atomic int hk_fork_handlers; /* registered (or being registered) */
void hk_fork_handlers_register(void);
HK_INLINE void hk_fork_handlers_check(void) {
  if (HK_UNLIKELY(!hk_load_relaxed(&hk_fork_handlers)) && hk_maybe_threaded()) hk_fork_handlers_register();
}

/* ---- thread.c: a thread's heap, and the malloc slow path ---- */
hk_heap *hk_heap_get(void);                       /* this thread's heap, created if needed */
typedef void (*hk_heap_maker)(void);
extern _Atomic(hk_heap_maker) hk_make_heap_for_frees; /* the same from free(), which starts no thread (set by thread.c) */
void *hk_malloc_slow(size_t size, hk_heap *heap);
void *hk_malloc_no_head(size_t size, hk_heap *heap, hk_page *page); /* list ended: the slow path; else reported */
void *hk_alloc_class(size_t size, unsigned cls);
void *hk_malloc_cached(size_t size, hk_heap *h); /* malloc in cache mode (h->free_owner != h) */
void *hk_malloc_gated(size_t size, hk_heap *h);  /* malloc whose budget ran out (hk_tls_state) */
extern void *(*hk_heap_use_alloc)(size_t size);  /* a malloc while hk_tls.use is set (user_heap.c) */
void *hk_secure_malloc(size_t size, hk_heap *h); /* hardened mode's malloc */
void *hk_alloc_large(size_t size, size_t align, bool zero); /* hk_large_alloc, retried once */

/* ==== the front: the malloc family ==== */

/* ---- alloc.c / free.c ---- */
void *hk_alloc_aligned(size_t align, size_t size, bool zero);
void *hk_calloc(size_t n, size_t size);
void *hk_realloc(void *p, size_t size);
void *hk_realloc_in(void *p, size_t size, hk_heap *heap); /* heap: hak_heap_realloc's, or NULL */
void hk_free_slow(void *p);
size_t hk_usable_size(const void *p);
size_t hk_block_size_in(hk_region *r, const void *p, const char *who);
hk_region *hk_region_lookup(const void *p);
void hk_stats_report(void); /* HAKMEM_STATS's report now (malloc_stats) */

/* ---- user_heap.c: heaps the program makes (hak_heap_new) ---- */
hk_heap *hk_user_heap_of(hk_region *r, const void *p); /* a live block's heap (r: its header); NULL: a thread's */
void *hk_user_heap_alloc(hk_heap *h, size_t size);     /* realloc's new block in the old one's heap */
void hk_user_heap_free_own(hk_heap *h, hk_page *page, void *p); /* ... and the old one, freed by its owner */
hk_heap *hk_user_heap_check(void *heap, const char *who); /* heap, reported if it is none */
hk_heap *hk_user_heap_named(void *heap, const char *who); /* the same, without its lock */
struct hak_heap_stats;
size_t hk_user_heap_labels(struct hak_heap_stats *out, size_t max); /* the labelled heaps' figures */

#pragma GCC visibility pop

#endif /* HK_INTERNAL_H */
