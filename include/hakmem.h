/* hakmem: a general-purpose memory allocator.
 *
 * Two ways to use it:
 *  - libhakmem.so / libhakmem.a replace malloc, free, ... and C++ new/delete
 *    (LD_PRELOAD=libhakmem.so program, or link with -lhakmem).
 *  - libhakmem-api.so / libhakmem-api.a export only the hak_ functions below,
 *    so a program can keep the system malloc and call hakmem explicitly.
 *
 * Every hak_ function behaves like its C library namesake. A pointer that
 * hakmem did not hand out, or a block freed twice, is reported on stderr
 * ("hakmem: ...") followed by abort().
 */
#ifndef HAKMEM_H
#define HAKMEM_H

#include <stddef.h>
#include <stdio.h>
#if defined(__linux__) && defined(__has_include)
#if __has_include(<malloc.h>)
#include <malloc.h> /* struct mallinfo2 (glibc >= 2.33) */
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define HAKMEM_VERSION_MAJOR 0
#define HAKMEM_VERSION_MINOR 1
#define HAKMEM_VERSION_PATCH 0

#if defined(__GNUC__)
#define HAK_MALLOC_ATTR __attribute__((malloc, warn_unused_result))
#else
#define HAK_MALLOC_ATTR
#endif

/* the library's version, "MAJOR.MINOR.PATCH" */
const char *hak_version(void);

void *hak_malloc(size_t size) HAK_MALLOC_ATTR;
void *hak_calloc(size_t count, size_t size) HAK_MALLOC_ATTR;
void *hak_realloc(void *ptr, size_t size);
void *hak_reallocarray(void *ptr, size_t count, size_t size);
void hak_free(void *ptr);
void hak_free_sized(void *ptr, size_t size);
void hak_free_aligned_sized(void *ptr, size_t alignment, size_t size);

int hak_posix_memalign(void **out, size_t alignment, size_t size);
void *hak_aligned_alloc(size_t alignment, size_t size) HAK_MALLOC_ATTR;
void *hak_memalign(size_t alignment, size_t size) HAK_MALLOC_ATTR;
void *hak_valloc(size_t size) HAK_MALLOC_ATTR;
void *hak_pvalloc(size_t size) HAK_MALLOC_ATTR;

size_t hak_malloc_usable_size(const void *ptr);

/* Returns free memory to the OS now (empty slabs, empty regions, the large
 * block cache). Returns 1 if any memory was released, else 0. */
int hak_malloc_trim(size_t pad);

/* Prints hakmem's counters to stderr (same as HAKMEM_STATS=1 at exit). */
void hak_malloc_stats(void);

/* cfree: the old name of free. */
void hak_cfree(void *ptr);

/* Accepted and ignored (hakmem is configured through HAKMEM_* environment
 * variables, docs/OPTIONS.md); returns 1 like glibc for a known parameter. */
int hak_mallopt(int param, int value);

#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
/* arena: bytes of small/medium regions; uordblks: their live blocks' bytes
 * (at their classes' sizes) plus hblkhd; fordblks: the rest of the regions
 * plus cached large mappings; ordblks: free blocks carved in pages;
 * hblks/hblkhd: live large blocks and their mapped bytes. Exact as
 * hak_stats_get's figures are. */
struct mallinfo2 hak_mallinfo2(void);
#endif

/* ---- statistics a program can read (docs/STATS.md) ----
 *
 * hak_stats_get(&s, sizeof s) fills s with what hakmem holds now and its
 * counters since start. The size argument keeps programs built against an
 * older header working: the library fills only the first `size` bytes
 * (fields are only ever added at the end) and sets s.size to the bytes it
 * filled. Returns 0, or -1 with errno EINVAL if size is below
 * HAK_STATS_MIN_SIZE. It allocates nothing and takes no lock that a
 * malloc or free of the caller's holds.
 *
 * Live figures are exact when no other thread allocates or frees during
 * the call, whichever threads allocated and freed the blocks before; a
 * call racing with other threads' mallocs and frees gets each page's
 * figures as of some moment during the call. A block counts at its size
 * class's size (what malloc_usable_size returns), a large block at the
 * size asked for. */
#define HAK_STATS_VERSION 1
#define HAK_STATS_CLASSES 128 /* entries of classes[]; nclasses says how many are used */

struct hak_stats_class {
  unsigned long long block_size;  /* the most a block of the class holds, bytes */
  unsigned long long live_blocks; /* handed out and not freed */
  unsigned long long live_bytes;  /* live_blocks * block_size */
  unsigned long long free_blocks; /* carved in the class's pages and free (in a thread's cache too) */
  unsigned long long pages;       /* pages of the class in use */
  unsigned long long page_bytes;  /* bytes of those pages' spans */
};

struct hak_stats {
  unsigned version;                /* HAK_STATS_VERSION of the library that filled it */
  unsigned nclasses;               /* entries of classes[] filled */
  unsigned long long size;         /* bytes of this struct the library filled */
  /* now */
  unsigned long long live_bytes;   /* small + large live bytes */
  unsigned long long live_blocks;  /* small + large live blocks */
  unsigned long long small_live_bytes, small_live_blocks; /* blocks of size classes (up to 1 MiB) */
  unsigned long long large_live_bytes, large_live_blocks; /* blocks mapped one by one */
  unsigned long long mapped_bytes;        /* address space mapped for blocks: regions + large mappings */
  unsigned long long region_bytes;        /* 4 MiB regions mapped (small blocks) */
  unsigned long long page_bytes;          /* bytes of regions' spans serving pages now */
  unsigned long long large_mapped_bytes;  /* large mappings, cached ones included */
  unsigned long long large_cached_bytes;  /* freed large blocks kept mapped for reuse */
  unsigned long long resident_bytes;      /* the process's resident memory (RSS) */
  unsigned long long peak_resident_bytes; /* its peak */
  unsigned long long threads;             /* threads with a heap now */
  /* counters since start */
  unsigned long long threads_started;     /* heaps taken by threads */
  unsigned long long threads_exited;
  unsigned long long remote_frees;        /* frees of another thread's block */
  unsigned long long purges;              /* madvise calls that gave memory back */
  unsigned long long purged_bytes;        /* bytes they gave back */
  unsigned long long large_allocs, large_frees, large_cache_hits;
  unsigned long long regions_mapped, regions_unmapped;
  struct hak_stats_class classes[HAK_STATS_CLASSES]; /* by block size, smallest first */
};
#define HAK_STATS_MIN_SIZE 16 /* version, nclasses and size */

int hak_stats_get(struct hak_stats *out, size_t size);

/* The same figures as one JSON object (docs/STATS.md has its schema),
 * written to buf with a terminating NUL if it fits in size bytes. Returns
 * the length of the whole text (without the NUL), as snprintf does: a
 * return of size or more means buf was too small. */
size_t hak_stats_json(char *buf, size_t size);

/* ---- what each thread allocated (docs/STATS.md) ----
 * hak_thread_stats(tid, &t, sizeof t) fills t with the live blocks thread
 * tid (its kernel id, gettid(); 0: the calling thread) allocated and no
 * thread has freed since: from its own heap (a heap of the program's, see
 * hak_heap_use, counts its own blocks). Blocks count as in hak_stats_get.
 * Exact as hak_stats_get's figures are, whichever threads free the blocks,
 * when the program runs with HAKMEM_THREAD_STATS=1 (t.exact is 1), which
 * gives up the thread cache of other threads' freed blocks for it, unless
 * the thread took over pages holding an exited thread's live blocks (done
 * only when more than a few wait: t.exact is then 0). Without it, a block
 * another thread freed may still count for a while (up to 256 KiB of them
 * per freeing thread), and so may an exited thread's blocks in memory this
 * thread took over. Returns 0, or -1 with errno
 * EINVAL (size below sizeof t) or ESRCH (no thread tid with a heap: one
 * that has allocated nothing, or has exited). */
struct hak_thread_stats {
  unsigned long long tid;
  unsigned long long live_blocks, live_bytes;             /* all its live blocks */
  unsigned long long large_live_blocks, large_live_bytes; /* of them, those mapped one by one */
  int exact;                                              /* HAKMEM_THREAD_STATS=1 */
};
int hak_thread_stats(long tid, struct hak_thread_stats *out, size_t size);

/* ---- the sampling heap profiler (docs/PROFILE.md) ----
 * With HAKMEM_PROFILE=1, writes the heap profile now: to `path` (NULL: the
 * file HAKMEM_PROFILE_FILE names; %p: the pid) in the text format
 * google-pprof reads, and to path.json. Returns 0, or -1 with errno ENOSYS
 * if the profiler is off, or the error of the file that failed. */
int hak_profile_dump(const char *path);

/* ---- memory limits (docs/OPTIONS.md: HAKMEM_MEMORY_LIMIT, _SOFT_LIMIT,
 * the cgroup's memory.max and memory.high) ----
 * Sets the function called when a soft limit is crossed, after hakmem has
 * given back every free byte it held: in the thread whose allocation
 * crossed it, inside that malloc, with no hakmem lock held (it may allocate
 * and free), at most every 100 ms. NULL: none. */
void hak_set_pressure_handler(void (*handler)(void *arg), void *arg);

/* ---- control at run time (docs/OPTIONS.md, "At run time") ----
 * An option's value, by its name with or without HAKMEM_ ("PURGE_DELAY_MS").
 * Returns 0, or -1 with errno ENOENT (no such numeric option). */
int hak_option_get(const char *name, long *value);
/* Changes an option that can change while the program runs (the purge
 * delay, the large-block cache's sizes, the regions kept, the memory
 * limits, the timeline's interval). Returns 0, or -1 with errno ENOENT,
 * EPERM (fixed at start-up) or EINVAL (outside its range). */
int hak_option_set(const char *name, long value);
/* Gives memory back now: level 0, what has been free for a purge delay (as
 * the purger's next pass would); 1, everything free hakmem holds (as
 * malloc_trim). Returns the bytes of RSS the process gave back. */
size_t hak_release(int level);

/* ---- heaps (docs/HEAPS.md) ----
 * A heap holds blocks apart from the rest of the program's, in memory of
 * its own, and gives them all back at once: build a structure in it, then
 * destroy the heap instead of freeing block by block. Any thread may
 * allocate from a heap (calls on one heap take its lock, in turn), and any
 * thread may free its blocks with free() or hak_free(), which take no lock.
 * Its blocks are ordinary blocks otherwise: malloc_usable_size and realloc
 * work on them, and realloc keeps a block in its heap.
 * An invalid heap (destroyed, or not made by hak_heap_new) is reported. */
typedef struct hak_heap hak_heap_t;

/* A new, empty heap, or NULL with errno ENOMEM. */
hak_heap_t *hak_heap_new(void);
/* As malloc, calloc and realloc, the block in (or, for realloc, staying
 * in) the heap; hak_heap_realloc's ptr must be NULL or a block of heap. */
void *hak_heap_malloc(hak_heap_t *heap, size_t size) HAK_MALLOC_ATTR;
void *hak_heap_calloc(hak_heap_t *heap, size_t count, size_t size) HAK_MALLOC_ATTR;
void *hak_heap_realloc(hak_heap_t *heap, void *ptr, size_t size);
/* Frees every block of the heap, and the heap. A later free of one of its
 * blocks is a double free (reported while the memory is not reused). No
 * other thread may use the heap or its blocks meanwhile. NULL: nothing. */
void hak_heap_destroy(hak_heap_t *heap);
/* Calls visitor(block, usable size, arg) for each live block of the heap,
 * under the heap's lock, until the visitor returns non-zero. The visitor
 * may read, write and free the blocks it is given; a call on the same
 * heap from the visitor is reported. Blocks that other threads free
 * meanwhile may or may not be visited (their memory is no longer the
 * visitor's to read). Returns 0 (every block visited), the visitor's
 * non-zero value, or -1 with errno ENOMEM or EINVAL (no visitor). */
int hak_heap_visit(hak_heap_t *heap, int (*visitor)(void *block, size_t size, void *arg), void *arg);

/* What a heap holds now, exactly (blocks freed by any thread are gone from
 * it as their free returns): size must be sizeof(struct hak_heap_stats).
 * Returns 0, or -1 with errno EINVAL. */
struct hak_heap_stats {
  char name[48];                 /* its label (hak_label), or "" */
  unsigned long long live_blocks;
  unsigned long long live_bytes; /* their usable sizes (hardened mode: their size classes' less the
                                    canary, where malloc_usable_size says the size asked for) */
  unsigned long long page_bytes; /* its pages' spans and the empty spans it keeps */
  unsigned long long large_bytes; /* the mappings of its blocks above 1 MiB */
};
int hak_heap_stats(hak_heap_t *heap, struct hak_heap_stats *out, size_t size);

/* ---- labels: what a component allocated (docs/HEAPS.md) ----
 * The heap labelled name (at most 47 bytes), made at its first call; NULL
 * with errno EINVAL (no name, or too long) or ENOMEM. Never destroyed but
 * by hak_heap_destroy. HAKMEM_STATS's report lists the labels' figures (16 at most). */
hak_heap_t *hak_label(const char *name);
/* From now on, the calling thread's malloc, calloc, realloc (of NULL, or
 * of a block of no heap that it moves: a heap's block stays in its heap)
 * and operator new take their blocks from heap (NULL: from the thread's
 * own heap again).
 * Returns the heap used before, for scopes:
 *   hak_heap_t *outer = hak_heap_use(hak_label("parser")); ... hak_heap_use(outer); */
hak_heap_t *hak_heap_use(hak_heap_t *heap);

/* glibc's malloc_info: the free blocks of each size class and the memory
 * mapped, as XML in glibc's elements (docs/STATS.md). options must be 0. */
int hak_malloc_info(int options, FILE *fp);

#ifdef __cplusplus
}
#endif

#endif /* HAKMEM_H */
