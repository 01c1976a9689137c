/* C++ operator new and delete, every variant, written in C so that
 * libhakmem does not depend on libstdc++.
 *
 * On failure the throwing forms call the program's new_handler and retry;
 * with no handler they throw std::bad_alloc through the C++ runtime's own
 * functions, found by weak reference (a C++ program always has them). A
 * program without a C++ runtime never calls these. */
#include "internal.h"
#include "fastpath.h"

#include <stdlib.h>

typedef void (*new_handler_t)(void);
extern new_handler_t _ZSt15get_new_handlerv(void) __attribute__((weak));           /* std::get_new_handler */
extern void *__cxa_allocate_exception(size_t) __attribute__((weak));
extern void __cxa_throw(void *, void *, void (*)(void *)) __attribute__((weak, noreturn));
extern char _ZTISt9bad_alloc[] __attribute__((weak));                             /* typeinfo */
extern char _ZTVSt9bad_alloc[] __attribute__((weak));                             /* vtable */
extern void _ZNSt9bad_allocD1Ev(void *) __attribute__((weak));                     /* ~bad_alloc */

int hk_call_new_handler_nothrow(new_handler_t handler); /* new_handler.cpp */

HK_COLD static void throw_bad_alloc(void) {
  if (__cxa_allocate_exception && __cxa_throw && _ZTISt9bad_alloc && _ZTVSt9bad_alloc && _ZNSt9bad_allocD1Ev) {
    void **e = __cxa_allocate_exception(sizeof(void *));
    *e = _ZTVSt9bad_alloc + 2 * sizeof(void *); /* vptr: past offset-to-top and typeinfo */
    __cxa_throw(e, _ZTISt9bad_alloc, _ZNSt9bad_allocD1Ev);
  }
  hk_fatal("out of memory in operator new and no C++ runtime to throw std::bad_alloc", NULL);
}

/* Returns NULL only for the nothrow forms. */
HK_COLD static void *new_failed(size_t size, size_t align, bool nothrow) {
  for (;;) {
    new_handler_t h = _ZSt15get_new_handlerv ? _ZSt15get_new_handlerv() : NULL;
    if (h == NULL) {
      if (nothrow) return NULL;
      throw_bad_alloc();
    }
    if (nothrow) {
      /* a throwing handler means "give up": nullptr, not an exception */
      if (!hk_call_new_handler_nothrow(h)) return NULL;
    } else {
      h(); /* may throw, or free memory and return */
    }
    void *p = align ? hk_alloc_aligned(align, size, false) : hk_malloc_fast(size);
    if (p != NULL) return p;
  }
}

HK_INLINE void *new_impl(size_t size, bool nothrow) {
  void *p = hk_malloc_fast(size);
  return HK_LIKELY(p != NULL) ? p : new_failed(size, 0, nothrow);
}

HK_INLINE void *new_aligned(size_t size, size_t align, bool nothrow) {
  if (align == 0 || (align & (align - 1)) != 0) return nothrow ? NULL : (throw_bad_alloc(), NULL);
  void *p = hk_alloc_aligned(align, size, false);
  return HK_LIKELY(p != NULL) ? p : new_failed(size, align, nothrow);
}

typedef struct { char c; } nothrow_t_;

/* new */
HK_API HK_HOT void *_Znwm(size_t n) { return new_impl(n, false); }
HK_API HK_HOT void *_Znam(size_t n) { return new_impl(n, false); }
HK_API void *_ZnwmRKSt9nothrow_t(size_t n, const nothrow_t_ *t) { (void)t; return new_impl(n, true); }
HK_API void *_ZnamRKSt9nothrow_t(size_t n, const nothrow_t_ *t) { (void)t; return new_impl(n, true); }
HK_API void *_ZnwmSt11align_val_t(size_t n, size_t a) { return new_aligned(n, a, false); }
HK_API void *_ZnamSt11align_val_t(size_t n, size_t a) { return new_aligned(n, a, false); }
HK_API void *_ZnwmSt11align_val_tRKSt9nothrow_t(size_t n, size_t a, const nothrow_t_ *t) { (void)t; return new_aligned(n, a, true); }
HK_API void *_ZnamSt11align_val_tRKSt9nothrow_t(size_t n, size_t a, const nothrow_t_ *t) { (void)t; return new_aligned(n, a, true); }

/* delete */
HK_API HK_HOT void _ZdlPv(void *p) { hk_free_fast(p); }
HK_API HK_HOT void _ZdaPv(void *p) { hk_free_fast(p); }
HK_API HK_HOT void _ZdlPvm(void *p, size_t n) { (void)n; hk_free_fast(p); }
HK_API void _ZdaPvm(void *p, size_t n) { (void)n; hk_free_fast(p); }
HK_API void _ZdlPvRKSt9nothrow_t(void *p, const nothrow_t_ *t) { (void)t; hk_free_fast(p); }
HK_API void _ZdaPvRKSt9nothrow_t(void *p, const nothrow_t_ *t) { (void)t; hk_free_fast(p); }
HK_API void _ZdlPvSt11align_val_t(void *p, size_t a) { (void)a; hk_free_fast(p); }
HK_API void _ZdaPvSt11align_val_t(void *p, size_t a) { (void)a; hk_free_fast(p); }
HK_API void _ZdlPvmSt11align_val_t(void *p, size_t n, size_t a) { (void)n; (void)a; hk_free_fast(p); }
HK_API void _ZdaPvmSt11align_val_t(void *p, size_t n, size_t a) { (void)n; (void)a; hk_free_fast(p); }
HK_API void _ZdlPvSt11align_val_tRKSt9nothrow_t(void *p, size_t a, const nothrow_t_ *t) { (void)a; (void)t; hk_free_fast(p); }
HK_API void _ZdaPvSt11align_val_tRKSt9nothrow_t(void *p, size_t a, const nothrow_t_ *t) { (void)a; (void)t; hk_free_fast(p); }
