/* The C library's malloc family, for libhakmem.so / libhakmem.a. Each
 * entry point inlines the fast path. */
#include "internal.h"
#include "fastpath.h"

#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <string.h>

#include "hakmem.h"


HK_API HK_HOT void *malloc(size_t size) { return hk_malloc_fast(size); }
HK_API HK_HOT void free(void *p) { hk_free_fast(p); }
/* calloc also registers the fork handlers when the process has just become
 * multi-threaded: glibc's pthread_create allocates the new thread's DTV with
 * it before the thread exists (init.c). */
HK_API void *calloc(size_t n, size_t size) {
  hk_fork_handlers_check();
  return hk_calloc(n, size);
}
HK_API void *realloc(void *p, size_t size) { return hk_realloc(p, size); }
HK_API void *reallocarray(void *p, size_t n, size_t size) { return hak_reallocarray(p, n, size); }
HK_API int posix_memalign(void **out, size_t align, size_t size) { return hak_posix_memalign(out, align, size); }
HK_API void *aligned_alloc(size_t align, size_t size) { return hak_aligned_alloc(align, size); }
HK_API void *memalign(size_t align, size_t size) { return hak_memalign(align, size); }
HK_API void *valloc(size_t size) { return hak_valloc(size); }
HK_API void *pvalloc(size_t size) { return hak_pvalloc(size); }
HK_API size_t malloc_usable_size(void *p) { return hk_usable_size(p); }
HK_API HK_HOT void free_sized(void *p, size_t size) { (void)size; hk_free_fast(p); }
HK_API void free_aligned_sized(void *p, size_t align, size_t size) { (void)align; (void)size; hk_free_fast(p); }
HK_API void cfree(void *p) { hk_free_fast(p); }
HK_API int malloc_trim(size_t pad) { return hak_malloc_trim(pad); }
HK_API void malloc_stats(void) { hk_stats_report(); }

/* glibc's internal names, called directly by a few programs and libraries. */
HK_API HK_HOT void *__libc_malloc(size_t size) { return hk_malloc_fast(size); }
HK_API HK_HOT void __libc_free(void *p) { hk_free_fast(p); }
HK_API void *__libc_calloc(size_t n, size_t size) {
  hk_fork_handlers_check();
  return hk_calloc(n, size);
}
HK_API void *__libc_realloc(void *p, size_t size) { return hk_realloc(p, size); }
HK_API void *__libc_memalign(size_t align, size_t size) { return hak_memalign(align, size); }
HK_API void *__libc_valloc(size_t size) { return hak_valloc(size); }
HK_API void *__libc_pvalloc(size_t size) { return hak_pvalloc(size); }
HK_API int __posix_memalign(void **out, size_t align, size_t size) { return hak_posix_memalign(out, align, size); }

HK_API int mallopt(int param, int value) { return hak_mallopt(param, value); }
HK_API struct mallinfo2 mallinfo2(void) { return hak_mallinfo2(); }
HK_API int malloc_info(int options, FILE *fp) { return hak_malloc_info(options, fp); }

HK_API struct mallinfo mallinfo(void) {
  struct mallinfo2 m2 = mallinfo2();
  struct mallinfo mi;
  memset(&mi, 0, sizeof mi);
  mi.arena = (int)m2.arena;
  mi.hblks = (int)m2.hblks;
  mi.hblkhd = (int)m2.hblkhd;
  mi.uordblks = (int)m2.uordblks;
  mi.fordblks = (int)m2.fordblks;
  return mi;
}
