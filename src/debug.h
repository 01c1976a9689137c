/* The debug build's checks (cmake -DHAKMEM_DEBUG=ON, `make test-debug`).
 * hk_assert states an invariant where a state changes; the validators walk
 * a whole heap or the regions after a slow-path operation and at thread
 * exit. In other builds they compile to nothing. */
#ifndef HK_DEBUG_H
#define HK_DEBUG_H

#pragma GCC visibility push(hidden)

struct hk_page;
struct hk_heap;

#ifdef HAKMEM_DEBUG
__attribute__((cold, noreturn)) void hk_assert_fail(const char *cond, const char *file, int line);
#define hk_assert(cond) (__builtin_expect(!!(cond), 1) ? (void)0 : hk_assert_fail(#cond, __FILE__, __LINE__))
void hk_debug_page(const struct hk_page *page);
void hk_debug_heap(const struct hk_heap *h, _Bool deep);
void hk_debug_regions(void); /* region.c: every region list, under its lock */
#else
#define hk_assert(cond) ((void)0)
#define hk_debug_page(page) ((void)0)
#define hk_debug_heap(h, deep) ((void)0)
#define hk_debug_regions() ((void)0)
#endif

#pragma GCC visibility pop

#endif /* HK_DEBUG_H */
