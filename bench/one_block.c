/* one_block
 * A program that allocates a single 16-byte block: what the allocator adds
 * to a small program's memory (its library, its tables, its first region).
 * Reports the peak RSS (VmHWM) read right after the malloc, without stdio
 * or any other allocation before the reading. ops = 1. */
#include "bench_util.h" /* first: it defines _GNU_SOURCE */
#include <fcntl.h>

static char status[16384];

int main(void) {
  double t0 = bu_now();
  volatile char *p = malloc(16);
  if (p == NULL) return 3;
  p[0] = 1;
  double t = bu_now() - t0;
  long kb = -1;
  int fd = open("/proc/self/status", O_RDONLY);
  if (fd >= 0) {
    ssize_t n = 0, r;
    while (n < (ssize_t)sizeof status - 1 && (r = read(fd, status + n, sizeof status - 1 - (size_t)n)) > 0) n += r;
    close(fd);
    status[n] = 0;
    char *hwm = strstr(status, "VmHWM:");
    if (hwm) kb = strtol(hwm + 6, NULL, 10);
  }
  if (kb < 0) return 4;
  /* (bu_result reads the peak again, through stdio: after this figure) */
  printf("RESULT name=one_block ops=1 seconds=%.9f ops_per_sec=%.1f peak_rss_kb=%ld\n", t, t > 0 ? 1.0 / t : 0.0, kb);
  return p[0] - 1;
}
