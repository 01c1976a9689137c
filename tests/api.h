/* Shared helpers for the hakmem tests.
 *
 * API(name): with HAK_API_PREFIX defined the tests call hakmem's explicit
 * API (hak_malloc, hak_free, ...; link with hakmem-api / hakmem-api_static);
 * otherwise they call the plain C library names (malloc, free, ...), which
 * resolve to hakmem when the test is linked with the override library
 * (hakmem / hakmem_static) or run under LD_PRELOAD.
 *
 * CHECK(cond, fmt, ...): on failure prints file:line, the condition and a
 * formatted message to stderr and exits with status 1 (_exit, so it is safe
 * in threads, forked children and destructors).
 */
#ifndef HAKMEM_TESTS_API_H
#define HAKMEM_TESTS_API_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <malloc.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/wait.h>

#include "hakmem.h"
#include "test_util.h" /* hkt_rand */

#ifdef HAK_API_PREFIX
#define API(f) hak_##f
#define API_MODE "hak_ API"
#else
#define API(f) f
#define API_MODE "plain libc names"
#ifdef __cplusplus
extern "C" {
#endif
/* Not declared by glibc 2.36 headers. Weak, so a missing export is reported
 * by the test at run time instead of breaking the link. */
extern void free_sized(void *ptr, size_t size) __attribute__((weak));
extern void free_aligned_sized(void *ptr, size_t alignment, size_t size) __attribute__((weak));
extern void cfree(void *ptr) __attribute__((weak));
#ifdef __cplusplus
}
#endif
#endif

#if defined(__GNUC__) || defined(__clang__)
#define HKT_UNUSED __attribute__((unused))
#define HKT_NORETURN __attribute__((noreturn))
#define HKT_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define HKT_UNUSED
#define HKT_NORETURN
#define HKT_PRINTF(a, b)
#endif

/* Write head, the formatted message and a newline to stderr in one
 * write(2): no stdio buffering (this may run in a forked child, a
 * destructor, or a fuzzer about to abort). */
static HKT_UNUSED void hkt_vreport(const char *head, const char *fmt, va_list ap) {
  char buf[1024];
  size_t n = strlen(head);
  if (n > sizeof buf - 2) n = sizeof buf - 2;
  memcpy(buf, head, n);
  int m = vsnprintf(buf + n, sizeof buf - n - 1, fmt, ap);
  if (m > 0) n += (size_t)m;
  if (n > sizeof buf - 2) n = sizeof buf - 2;
  buf[n++] = '\n';
  ssize_t w = write(2, buf, n);
  (void)w;
}

static HKT_UNUSED HKT_NORETURN HKT_PRINTF(4, 5) void
hkt_fail(const char *file, int line, const char *cond, const char *fmt, ...) {
  char head[512];
  fflush(stdout); /* keep what the test printed so far (stdout may be a pipe) */
  snprintf(head, sizeof head, "%s:%d: CHECK FAILED: %s: ", file, line, cond);
  va_list ap;
  va_start(ap, fmt);
  hkt_vreport(head, fmt, ap);
  va_end(ap);
  _exit(1);
}

#define CHECK(cond, ...)                                                     \
  do {                                                                       \
    if (!(cond)) hkt_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);          \
  } while (0)

/* Hide a value from the optimiser, so calls like malloc(SIZE_MAX) or
 * free(&local) are neither folded nor warned about at compile time. */
static inline size_t hkt_opaque(size_t x) {
#if defined(__GNUC__) || defined(__clang__)
  __asm__ volatile("" : "+r"(x));
#endif
  return x;
}
static inline void *hkt_opaque_ptr(void *p) {
#if defined(__GNUC__) || defined(__clang__)
  __asm__ volatile("" : "+r"(p) : : "memory");
#endif
  return p;
}

/* Run fn(arg) in a forked child whose stderr goes into msg (size bytes,
 * NUL-terminated); the child's wait status (fn returning: exit 0). */
static HKT_UNUSED int hkt_run_child(void (*fn)(void *), void *arg, char *msg, size_t size) {
  int fds[2];
  CHECK(pipe(fds) == 0, "pipe failed");
  fflush(stdout);
  pid_t pid = fork();
  CHECK(pid >= 0, "fork failed");
  if (pid == 0) {
    dup2(fds[1], 2);
    fn(arg);
    _exit(0);
  }
  close(fds[1]);
  memset(msg, 0, size);
  ssize_t n = 0, r;
  while (n < (ssize_t)size - 1 && (r = read(fds[0], msg + n, size - 1 - (size_t)n)) > 0) n += r;
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

static HKT_UNUSED void hkt_free_in_child(void *p) { API(free)(hkt_opaque_ptr(p)); }

/* Free p in a forked child: the child must abort (SIGABRT) with a message
 * naming hakmem and the double free; `what` says what p is. */
static HKT_UNUSED void hkt_expect_double_free(void *p, const char *what) {
  char msg[512];
  int status = hkt_run_child(hkt_free_in_child, p, msg, sizeof msg);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "freeing %s again did not abort (status %#x)", what,
        status);
  CHECK(strstr(msg, "hakmem") != NULL && strstr(msg, "double free") != NULL, "unexpected message: %s", msg);
}

/* Deterministic pattern: byte i of a block stamped with `seed` is byte
 * (i % 8) of the 64-bit word hkt_word(i / 8, seed). Filled and checked a
 * word at a time where the address allows (fast also under -O0 + ASan). */
static inline uint64_t hkt_word(size_t k, uint64_t seed) {
  uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)k * 0xD6E8FEB86659FD93ull;
  return x ^ (x >> 29);
}
static inline unsigned char hkt_pat(size_t i, uint64_t seed) {
  return (unsigned char)(hkt_word(i >> 3, seed) >> ((i & 7) * 8));
}
static HKT_UNUSED void hkt_fill(void *p, size_t n, uint64_t seed) {
  unsigned char *c = (unsigned char *)p;
  size_t i = 0;
  if (((uintptr_t)c & 7) == 0) {
    uint64_t *w = (uint64_t *)p;
    for (; i + 8 <= n; i += 8) w[i >> 3] = hkt_word(i >> 3, seed);
  }
  for (; i < n; i++) c[i] = hkt_pat(i, seed);
}
/* Returns the index of the first mismatching byte, or HKT_OK. */
static HKT_UNUSED size_t hkt_verify(const void *p, size_t n, uint64_t seed) {
  const unsigned char *c = (const unsigned char *)p;
  size_t i = 0;
  if (((uintptr_t)c & 7) == 0) {
    const uint64_t *w = (const uint64_t *)p;
    for (; i + 8 <= n; i += 8)
      if (w[i >> 3] != hkt_word(i >> 3, seed)) break; /* find the byte below */
  }
  for (; i < n; i++)
    if (c[i] != hkt_pat(i, seed)) return i;
  return (size_t)-1;
}
#define HKT_OK ((size_t)-1)

/* A block written with hkt_fill's pattern, to be checked later. */
typedef struct {
  unsigned char *p;
  size_t n;
  uint64_t seed;
} hkt_blk;
static HKT_UNUSED void hkt_blk_alloc(hkt_blk *b, size_t n, uint64_t seed) {
  b->n = n;
  b->p = (unsigned char *)malloc(n);
  CHECK(b->p != NULL, "malloc(%zu) failed", n);
  b->seed = seed;
  hkt_fill(b->p, n, seed);
}
static HKT_UNUSED void hkt_blk_check(const hkt_blk *b, const char *what) {
  size_t bad = hkt_verify(b->p, b->n, b->seed);
  CHECK(bad == HKT_OK, "%s: block %p of %zu bytes changed at byte %zu", what, (void *)b->p, b->n, bad);
}

static HKT_UNUSED int hkt_is_pow2(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

/* The process's resident set, in bytes, read with plain system calls:
 * fopen would allocate, and an allocator call could itself do the purging
 * a test is waiting for. */
static HKT_UNUSED size_t hkt_rss_bytes(void) {
  char buf[128];
  int fd = open("/proc/self/statm", O_RDONLY);
  CHECK(fd >= 0, "cannot open /proc/self/statm: %s", strerror(errno));
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  CHECK(n > 0, "cannot read /proc/self/statm");
  buf[n] = 0;
  unsigned long size = 0, resident = 0;
  CHECK(sscanf(buf, "%lu %lu", &size, &resident) == 2, "cannot parse /proc/self/statm");
  return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}

/* Is hardened mode on? It rounds usable sizes up past the canary
 * (docs/SAFETY.md) and carves blocks in random order, so tests of the
 * plain layout skip it. */
static HKT_UNUSED int hkt_hardened(void) {
  void *probe = API(malloc)(1000);
  CHECK(probe != NULL, "malloc failed");
  int hardened = API(malloc_usable_size)(probe) != 1024;
  API(free)(probe);
  return hardened;
}

/* A counter of malloc_stats() (the number after `name` on its line), read
 * through a pipe. */
static HKT_UNUSED long hkt_stat(const char *name) {
  int fds[2];
  CHECK(pipe(fds) == 0, "pipe: %s", strerror(errno));
  fflush(stderr);
  int saved = dup(2);
  CHECK(saved >= 0 && dup2(fds[1], 2) == 2, "dup2: %s", strerror(errno));
  API(malloc_stats)(); /* (a few KiB: within the pipe's buffer) */
  dup2(saved, 2);
  close(saved);
  close(fds[1]);
  static char buf[16384];
  size_t n = 0;
  ssize_t r;
  while (n < sizeof buf - 1 && (r = read(fds[0], buf + n, sizeof buf - 1 - n)) > 0) n += (size_t)r;
  close(fds[0]);
  buf[n] = 0;
  const char *line = strstr(buf, name);
  CHECK(line != NULL, "malloc_stats() printed no \"%s\":\n%s", name, buf);
  return strtol(line + strlen(name), NULL, 10);
}

/* Does freed memory go back on its own while a test waits (up to a few
 * seconds)? Not with the purger thread off (HAKMEM_PURGE_THREAD=0: only
 * allocator calls purge then) nor with a purge delay over half a second:
 * tests skip their timed checks in such runs (docs/OPTIONS.md). */
static HKT_UNUSED int hkt_short_purge_delay(void) {
  const char *delay = getenv("HAKMEM_PURGE_DELAY_MS");
  return delay == NULL || atol(delay) <= 500;
}
static HKT_UNUSED int hkt_timed_purges(void) {
  const char *thread = getenv("HAKMEM_PURGE_THREAD");
  return !(thread != NULL && atoi(thread) == 0) && hkt_short_purge_delay();
}

/* Is a freed large block of `size` bytes cached (HAKMEM_LARGE_CACHE_MB,
 * _ENTRIES)? The cache counts whole mappings: the block, its header page
 * and its colour (under 64 KiB more). Zero mode (HAKMEM_SECURE=2) caches
 * none. */
static HKT_UNUSED int hkt_large_cache(size_t size) {
  const char *mb = getenv("HAKMEM_LARGE_CACHE_MB"), *entries = getenv("HAKMEM_LARGE_CACHE_ENTRIES");
  const char *secure = getenv("HAKMEM_SECURE");
  return !(mb != NULL && (size_t)atol(mb) << 20 < size + (64 << 10)) && !(entries != NULL && atol(entries) == 0) &&
         !(secure != NULL && atoi(secure) >= 2);
}

/* A block of the 4 KiB class (4000 bytes asked: with hardened mode's
 * canary, still that class) at offset `at` of its 4 MiB region (the first
 * of slab 1: 64 KiB; the last: 4 MiB - 4 KiB), from up to 16 MiB of them,
 * which fill whole regions; NULL if none turned up. */
static HKT_UNUSED char *hkt_block_at_region_offset(uintptr_t at) {
  for (int i = 0; i < 4096; i++) {
    char *p = (char *)API(malloc)(4000);
    CHECK(p != NULL, "malloc failed");
    if (((uintptr_t)p & (((uintptr_t)4 << 20) - 1)) == at) return p;
  }
  return NULL;
}

/* The kernel's page size as hakmem sees it: a simulated-page build's
 * (HAKMEM_SIMULATED_PAGE, src/os.c), or the kernel's. */
static HKT_UNUSED size_t hkt_page(void) {
#ifdef HAKMEM_SIMULATED_PAGE
  return HAKMEM_SIMULATED_PAGE;
#else
  return (size_t)sysconf(_SC_PAGESIZE);
#endif
}

/* Where a 4 MiB region's blocks may lie (src/region.c, the slabs that
 * serve pages): from slab 1, or from slab 2 where pages of 64 KiB leave
 * slab 0 to the header and slab 1 is the guard below the blocks; to the
 * region's end, or to slab 63's start where slab 63 holds the guard at the
 * end (hardened mode, and pages of 32 KiB or more). */
static HKT_UNUSED size_t hkt_region_blocks_start(void) {
  return hkt_page() >= ((size_t)64 << 10) ? (size_t)128 << 10 : (size_t)64 << 10;
}
static HKT_UNUSED size_t hkt_region_blocks_end(int hardened) {
  return hardened || hkt_page() >= ((size_t)32 << 10) ? ((size_t)4 << 20) - ((size_t)64 << 10) : (size_t)4 << 20;
}

/* How many OS pages of [lo, hi) are resident (at most 64 pages). */
static HKT_UNUSED size_t hkt_resident_pages(uintptr_t lo, uintptr_t hi) {
  uintptr_t ps = (uintptr_t)sysconf(_SC_PAGESIZE);
  lo &= ~(ps - 1);
  size_t n = (size_t)((hi - lo + ps - 1) / ps), count = 0;
  unsigned char vec[64];
  CHECK(n <= sizeof vec, "range too long: %zu pages", n);
  CHECK(mincore((void *)lo, n * ps, vec) == 0, "mincore: %s", strerror(errno));
  for (size_t i = 0; i < n; i++) count += vec[i] & 1;
  return count;
}

/* Read fd (a forked child's stderr) to its end or until buf is full, close
 * it, and terminate buf; the length read. */
static inline size_t hkt_read_all(int fd, char *buf, size_t cap) {
  size_t len = 0;
  for (;;) {
    ssize_t n = read(fd, buf + len, cap - 1 - len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    len += (size_t)n;
    if (len >= cap - 1) break;
  }
  buf[len] = 0;
  close(fd);
  return len;
}

#endif /* HAKMEM_TESTS_API_H */
