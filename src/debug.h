/* The debug build's checks (cmake -DHAKMEM_DEBUG=ON, `make test-debug`).
 * hk_assert states an invariant where a state changes; the validators walk
 * a whole heap or the regions after a slow-path operation and at thread
 * exit. In other builds they compile to nothing. */
#ifndef HK_DEBUG_H
#define HK_DEBUG_H

#pragma GCC visibility push(hidden)

#ifdef HAKMEM_DEBUG
__attribute__((cold, noreturn)) void hk_assert_fail(const char *cond, const char *file, int line);
#define hk_assert(cond) (__builtin_expect(!!(cond), 1) ? (void)0 : hk_assert_fail(#cond, __FILE__, __LINE__))
#define HK_DEBUG_ON 1
#else
#define hk_assert(cond) ((void)0)
#define HK_DEBUG_ON 0
#endif

#pragma GCC visibility pop

#endif /* HK_DEBUG_H */
