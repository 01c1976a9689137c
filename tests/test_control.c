/* Control at run time (docs/OPTIONS.md, "At run time"): hak_option_get and
 * hak_option_set, their errors, options changed while running taking
 * effect (a memory limit, the large-block cache, the purge delay),
 * mallopt's parameters, and hak_release giving memory back. */
#include "api.h"

#include <malloc.h>

static long get(const char *name) {
  long v = -12345;
  CHECK(hak_option_get(name, &v) == 0, "hak_option_get(%s): %s", name, strerror(errno));
  return v;
}

int main(void) {
  const size_t MiB = (size_t)1 << 20;
  /* get and set, with or without the prefix */
  long delay = get("PURGE_DELAY_MS");
  CHECK(get("HAKMEM_PURGE_DELAY_MS") == delay, "the HAKMEM_ prefix");
  CHECK(hak_option_set("PURGE_DELAY_MS", delay + 1) == 0 && get("PURGE_DELAY_MS") == delay + 1, "set the purge delay");
  /* errors */
  long v;
  errno = 0;
  CHECK(hak_option_get("NO_SUCH_OPTION", &v) == -1 && errno == ENOENT, "an unknown option: ENOENT");
  errno = 0;
  CHECK(hak_option_set("SECURE", 1) == -1 && errno == EPERM, "SECURE at run time: EPERM");
  errno = 0;
  CHECK(hak_option_set("ARENA_MB", 1024) == -1 && errno == EPERM, "ARENA_MB at run time: EPERM");
  errno = 0;
  CHECK(hak_option_set("PURGE_DELAY_MS", -5) == -1 && errno == EINVAL, "out of range: EINVAL");
  errno = 0;
  CHECK(hak_option_set("STATS_FILE", 1) == -1 && errno == ENOENT, "a text option: ENOENT");

  /* a memory limit set while running: 256 KiB blocks run into NULL */
  CHECK(hak_option_set("MEMORY_LIMIT", 32 * (long)MiB) == 0, "set MEMORY_LIMIT");
  static void *b[1024];
  int n = 0;
  while (n < 1024 && (b[n] = malloc(256 << 10)) != NULL) n++;
  CHECK(n < 1024 && errno == ENOMEM, "MEMORY_LIMIT=32M at run time: %d blocks of 256 KiB, no NULL", n);
  CHECK((size_t)n * (256 << 10) <= 32 * MiB, "MEMORY_LIMIT=32M: %d blocks of 256 KiB", n);
  CHECK(hak_option_set("MEMORY_LIMIT", 0) == 0, "MEMORY_LIMIT back to none");
  void *more = malloc(64 * MiB);
  CHECK(more != NULL, "without the limit again");
  free(more);
  for (int i = 0; i < n; i++) free(b[i]);
  printf("test_control: MEMORY_LIMIT=32M at run time: NULL after %d blocks of 256 KiB\n", n);

  /* the large-block cache off while running: a freed large block is unmapped */
  CHECK(hak_option_set("LARGE_CACHE_MB", 0) == 0, "set LARGE_CACHE_MB");
  void *big = malloc(8 * MiB);
  CHECK(big != NULL, "malloc(8 MiB)");
  free(big);
  struct hak_stats s;
  CHECK(hak_stats_get(&s, sizeof s) == 0 && s.large_cached_bytes == 0, "LARGE_CACHE_MB=0: %llu bytes cached",
        s.large_cached_bytes);

  /* mallopt */
  CHECK(mallopt(M_TRIM_THRESHOLD, 12 << 20) == 1 && get("REGION_RESERVE") == 3, "M_TRIM_THRESHOLD: regions kept");
  CHECK(mallopt(M_MMAP_MAX, 0) == 0, "M_MMAP_MAX 0 cannot be honoured");
  CHECK(mallopt(M_ARENA_MAX, 2) == 1 && mallopt(M_MMAP_THRESHOLD, 1 << 20) == 1, "M_ARENA_MAX, M_MMAP_THRESHOLD");
  CHECK(mallopt(M_PERTURB, 0x5a) == 0, "M_PERTURB is not supported");

  /* hak_release: 64 MiB of freed 64 KiB blocks, kept by a long purge delay, go back */
  CHECK(hak_option_set("PURGE_DELAY_MS", 1000000) == 0, "a long purge delay");
  static void *m[1024];
  for (int i = 0; i < 1024; i++) {
    m[i] = malloc(64 << 10);
    CHECK(m[i] != NULL, "malloc(64 KiB)");
    memset(m[i], 1, 64 << 10);
  }
  for (int i = 0; i < 1024; i++) free(m[i]);
  size_t back = hak_release(1);
  printf("test_control: hak_release(1) gave back %zu KiB of 64 MiB freed\n", back >> 10);
  CHECK(back >= 32 * MiB, "hak_release(1) gave back %zu bytes of 64 MiB freed", back);
  printf("test_control: OK\n");
  return 0;
}
