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
/* arena/uordblks/fordblks: bytes in small/medium regions, in use, free;
 * hblks/hblkhd: live large blocks and their bytes. */
struct mallinfo2 hak_mallinfo2(void);
#endif

#ifdef __cplusplus
}
#endif

#endif /* HAKMEM_H */
