/* Shared helpers for the hakmem benchmarks: timing, RSS, block stamping,
 * random numbers, argument parsing and the RESULT line.
 *
 * Every benchmark uses plain malloc/free; the allocator under test is chosen
 * with LD_PRELOAD (none = glibc). Each prints exactly one line
 *   RESULT name=NAME ops=N seconds=S ops_per_sec=X peak_rss_kb=K [key=value ...]
 * on stdout and exits 0, or exits non-zero after a message on stderr if a
 * block's contents were wrong (exit 2) or malloc failed (exit 3). */
#ifndef BENCH_UTIL_H
#define BENCH_UTIL_H

#define _GNU_SOURCE
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* ---- time ---- */
static inline double bu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- memory ---- */
/* Peak resident set of the process so far, in KiB: VmHWM from
 * /proc/self/status. (getrusage's ru_maxrss is not used: on Linux it keeps
 * the parent's peak across fork+exec, so a child of a 15 MB Python runner
 * would never report less than 15 MB.) */
static inline long bu_peak_rss_kb(void) {
  char line[256];
  long kb = -1;
  FILE *f = fopen("/proc/self/status", "r");
  if (f) {
    while (fgets(line, sizeof line, f))
      if (strncmp(line, "VmHWM:", 6) == 0) {
        kb = strtol(line + 6, NULL, 10);
        break;
      }
    fclose(f);
  }
  if (kb < 0) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    kb = ru.ru_maxrss;
  }
  return kb;
}

/* Current resident set in KiB, from /proc/self/statm (no malloc). */
static inline long bu_rss_kb(void) {
  /* the page size first: the first call of sysconf faults 64 KiB of libc's
   * text in, and after the reading it counted in the next one (mem_16b's
   * RSS before, under an allocator that had not run sysconf's neighbours) */
  long page_kb = sysconf(_SC_PAGESIZE) / 1024;
  long pages = 0, resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f) {
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    fclose(f);
  }
  return resident * page_kb;
}

/* ---- random numbers: xorshift64*, one state per thread ---- */
typedef struct { uint64_t s; } bu_rng;

static inline void bu_seed(bu_rng *r, uint64_t seed) {
  r->s = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  if (r->s == 0) r->s = 1;
}
static inline uint64_t bu_next(bu_rng *r) {
  r->s ^= r->s >> 12;
  r->s ^= r->s << 25;
  r->s ^= r->s >> 27;
  return r->s * 0x2545F4914F6CDD1Dull;
}
/* Uniform in [lo, hi]. */
static inline size_t bu_range(bu_rng *r, size_t lo, size_t hi) {
  return lo + (size_t)(bu_next(r) % (uint64_t)(hi - lo + 1));
}

/* ---- block stamping ----
 * bu_stamp writes a pattern derived from the block's address and size into
 * its first, middle and last 8 bytes; bu_check verifies it. The pattern is
 * one 8-byte value repeated from the block's start (byte i of the block is
 * byte i % 8 of the value), so the three words may overlap in small blocks.
 * Two live blocks that overlap, or a block the allocator scribbled on (e.g.
 * a free-list link left in a live block), fail the check. Blocks must be at
 * least 8 bytes. (Assumes a little-endian machine: x86-64, aarch64.) */
static inline uint64_t bu_pattern(const void *p, size_t n) {
  uint64_t x = (uint64_t)(uintptr_t)p ^ ((uint64_t)n << 40) ^ 0xA5A5C3C3F0F00F0Full;
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  return x;
}
/* the pattern's 8 bytes as seen from byte offset o */
static inline uint64_t bu_word_at(uint64_t v, size_t o) {
  unsigned s = 8 * (unsigned)(o & 7);
  return s ? (v >> s) | (v << (64 - s)) : v;
}
static inline void bu_stamp(void *p, size_t n) {
  uint64_t v = bu_pattern(p, n), w;
  char *c = p;
  size_t mid = n / 2 - 4;
  memcpy(c, &v, 8);
  w = bu_word_at(v, mid);
  memcpy(c + mid, &w, 8);
  w = bu_word_at(v, n - 8);
  memcpy(c + n - 8, &w, 8);
}
static inline void bu_fail(const char *what, const void *p, size_t n) {
  fprintf(stderr, "VERIFY FAILED: %s: block %p size %zu has wrong contents\n", what, p, n);
  exit(2);
}
static inline void bu_check(const void *p, size_t n, const char *what) {
  uint64_t v = bu_pattern(p, n), a, b, c;
  const char *s = p;
  size_t mid = n / 2 - 4;
  memcpy(&a, s, 8);
  memcpy(&b, s + mid, 8);
  memcpy(&c, s + n - 8, 8);
  if (a != v || b != bu_word_at(v, mid) || c != bu_word_at(v, n - 8)) bu_fail(what, p, n);
}
/* Stamp, and also write one byte in every 4 KiB page so all of the block is
 * resident (for benchmarks that measure RSS or page-fault cost). */
static inline void bu_touch(void *p, size_t n) {
  for (size_t i = 8; i + 16 < n; i += 4096) ((volatile char *)p)[i] = 1;
  bu_stamp(p, n);
}

/* malloc that exits on failure. */
static inline void *bu_malloc(size_t n) {
  void *p = malloc(n);
  if (!p) {
    fprintf(stderr, "malloc(%zu) failed\n", n);
    exit(3);
  }
  return p;
}

/* ---- arguments and output ---- */
/* argv[i] as a number (suffixes k, m, g = *1024^1..3), or def if absent. */
static inline long long bu_arg(int argc, char **argv, int i, long long def) {
  if (i >= argc) return def;
  char *end;
  long long v = strtoll(argv[i], &end, 10);
  if (*end == 'k' || *end == 'K') v <<= 10;
  else if (*end == 'm' || *end == 'M') v <<= 20;
  else if (*end == 'g' || *end == 'G') v <<= 30;
  else if (*end != 0 || end == argv[i]) {
    fprintf(stderr, "bad number: %s\n", argv[i]);
    exit(64);
  }
  return v;
}

/* Prints the RESULT line; extra is "key=value ..." (printf format) or NULL. */
__attribute__((format(printf, 4, 5)))
static inline void bu_result(const char *name, double ops, double seconds, const char *extra, ...) {
  printf("RESULT name=%s ops=%.0f seconds=%.6f ops_per_sec=%.1f peak_rss_kb=%ld", name, ops,
         seconds, seconds > 0 ? ops / seconds : 0.0, bu_peak_rss_kb());
  if (extra) {
    va_list ap;
    va_start(ap, extra);
    putchar(' ');
    vprintf(extra, ap);
    va_end(ap);
  }
  putchar('\n');
  fflush(stdout);
}

#endif
