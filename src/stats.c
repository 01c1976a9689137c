/* Statistics: global counters updated on slow paths only (page, region and
 * large-block events), per-thread counters merged when a thread exits.
 * HAKMEM_STATS=1 prints them at exit; malloc_stats() prints them on demand. */
#include "internal.h"

#include <string.h>

#include "hakmem.h"

hk_stats_t hk_stats;
static hk_heap_stats exited; /* merged from exited threads, under hk_heap_lock */

void hk_stat_peak(_Atomic uint64_t *peak, uint64_t v) {
  uint64_t cur = atomic_load_explicit(peak, memory_order_relaxed);
  while (v > cur && !atomic_compare_exchange_weak_explicit(peak, &cur, v, memory_order_relaxed, memory_order_relaxed)) {
  }
}

void hk_stats_merge_heap(hk_heap *h) {
  hk_lock(&hk_heap_lock);
  exited.pages_acquired += h->stats.pages_acquired;
  exited.pages_released += h->stats.pages_released;
  exited.remote_frees += h->stats.remote_frees;
  exited.pages_adopted += h->stats.pages_adopted;
  exited.cache_reused += h->stats.cache_reused;
  hk_unlock(&hk_heap_lock);
}

static void line(const char *name, uint64_t v, const char *unit) {
  char buf[160];
  size_t n = 0, len = strlen(name);
  memcpy(buf, "hakmem:   ", 10); n = 10;
  memcpy(buf + n, name, len); n += len;
  do buf[n++] = ' '; while (n < 50);
  n += hk_fmt_dec(buf + n, v);
  if (unit) { size_t u = strlen(unit); buf[n++] = ' '; memcpy(buf + n, unit, u); n += u; }
  buf[n++] = '\n';
  hk_os_write_stderr(buf, n);
}

#define LOAD(f) atomic_load_explicit(&hk_stats.f, memory_order_relaxed)

void hk_stats_print(void) {
  hk_heap_stats t = exited;
  hk_heap *h = hk_tls_heap;
  if (h != &hk_heap_empty) {
    t.pages_acquired += h->stats.pages_acquired;
    t.pages_released += h->stats.pages_released;
    t.remote_frees += h->stats.remote_frees;
    t.pages_adopted += h->stats.pages_adopted;
    t.cache_reused += h->stats.cache_reused;
  }
  static const char head[] = "hakmem: statistics (hakmem 0.1.0)\n";
  hk_os_write_stderr(head, sizeof head - 1);
  hk_os_write_stderr("hakmem: small/medium tier (size classes)\n", 41);
  line("regions mapped", LOAD(regions_mapped), NULL);
  line("regions unmapped", LOAD(regions_unmapped), NULL);
  line("regions peak", LOAD(regions_peak), "x 4 MiB");
  size_t mapped, in_use, peak;
  hk_region_usage(&mapped, &in_use, &peak);
  line("slabs in use", in_use / HK_SLAB_SIZE, "x 64 KiB");
  line("slabs peak (the lists' peaks summed)", peak / HK_SLAB_SIZE, "x 64 KiB");
  line("slabs purged", LOAD(slabs_purged), "x 64 KiB");
  line("purge calls (madvise)", LOAD(purge_calls), NULL);
  line("growth purges", LOAD(growth_purges), NULL);
  line("free medium blocks purged (madvise)", LOAD(blocks_purged), NULL);
  line("bytes purged inside free medium blocks", LOAD(block_purge_bytes), "B");
  line("free slabs lent back by pages in use", LOAD(slabs_lent), "x 64 KiB");
  line("spans given back while their list was busy", LOAD(spans_deferred), NULL);
  line("pages acquired (this+exited threads)", t.pages_acquired, NULL);
  line("pages released", t.pages_released, NULL);
  line("pages adopted from exited threads", t.pages_adopted, NULL);
  line("empty pages of exited threads kept now", hk_abandoned_empty(), NULL);
  line("empty pages of exited threads given back", LOAD(abandoned_released), NULL);
  line("empty pages of exited threads trimmed", LOAD(abandoned_trimmed), NULL);
  line("spare spans given back after a purge delay", LOAD(spares_released), NULL);
  line("full pages emptied remotely, given back", LOAD(pages_reclaimed), NULL);
  line("remote frees sent back to their pages", t.remote_frees, NULL);
  line("freed blocks reused from the thread cache", t.cache_reused, NULL);
  hk_os_write_stderr("hakmem: large tier (direct mappings)\n", 37);
  line("large allocations", LOAD(large_allocs), NULL);
  line("large frees", LOAD(large_frees), NULL);
  line("large cache hits", LOAD(large_cache_hits), NULL);
  line("large mremap calls", LOAD(large_remaps), NULL);
  line("large unmaps", LOAD(large_unmaps), NULL);
  line("large bytes mapped now", LOAD(large_mapped_bytes), "B");
  line("large bytes mapped peak", LOAD(large_peak_bytes), "B");
  hk_os_write_stderr("hakmem: process\n", 16);
  line("heaps created", LOAD(heaps_created), NULL);
  line("threads exited", LOAD(threads_exited), NULL);
  line("heaps of exited threads reaped", LOAD(heaps_reaped), NULL);
  line("peak RSS", hk_os_peak_rss_kb(), "KiB");
  line("current RSS", hk_os_current_rss_kb(), "KiB");
  hk_os_write_stderr("hakmem: options\n", 16);
  hk_options_print();
}

__attribute__((destructor)) static void stats_at_exit(void) {
  if (hk_opt.stats) hk_stats_print();
}

/* mallinfo2: small/medium regions are the arena; large mappings are hblkhd,
 * except those held by the large-block cache, which count as free. */
HK_API struct mallinfo2 hak_mallinfo2(void) {
  struct mallinfo2 mi;
  size_t mapped, in_use, peak;
  memset(&mi, 0, sizeof mi);
  hk_region_usage(&mapped, &in_use, &peak);
  size_t large, cached;
  hk_large_usage(&large, &cached);
  size_t live_large = large > cached ? large - cached : 0;
  mi.arena = mapped;                      /* bytes in small/medium regions */
  mi.hblkhd = live_large;                 /* bytes in live large mappings */
  mi.hblks = atomic_load_explicit(&hk_stats.large_allocs, memory_order_relaxed) -
             atomic_load_explicit(&hk_stats.large_frees, memory_order_relaxed);
  mi.uordblks = in_use + live_large;      /* bytes in pages in use + live large blocks */
  mi.fordblks = (mapped > in_use ? mapped - in_use : 0) + cached;
  return mi;
}

/* mallopt: hakmem is configured through HAKMEM_* variables; every request is
 * accepted and has no effect, like glibc's answer for a known parameter. */
HK_API int hak_mallopt(int param, int value) {
  (void)param;
  (void)value;
  return 1;
}
