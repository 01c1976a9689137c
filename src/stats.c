/* Statistics: global counters updated on slow paths only (page, region and
 * large-block events), per-thread counters merged when a thread exits.
 * HAKMEM_STATS=1 prints them at exit; malloc_stats() prints them on demand. */
#include "internal.h"

#include <string.h>

#include "hakmem.h"

hk_stats_t hk_stats;
/* merged from exited threads (relaxed adds: a print reads a consistent
 * enough sum, and a thread exiting needs no lock here) */
static struct {
  _Atomic uint64_t pages_acquired, pages_released, pages_adopted, remote_frees, cache_reused;
} exited;

void hk_stat_peak(_Atomic uint64_t *peak, uint64_t v) {
  uint64_t cur = hk_load_relaxed(peak);
  while (v > cur && !atomic_compare_exchange_weak_explicit(peak, &cur, v, memory_order_relaxed, memory_order_relaxed)) {
  }
}

void hk_stats_merge_heap(const hk_heap_stats *s) {
  hk_add_relaxed(&exited.pages_acquired, s->pages_acquired);
  hk_add_relaxed(&exited.pages_released, s->pages_released);
  hk_add_relaxed(&exited.remote_frees, s->remote_frees);
  hk_add_relaxed(&exited.pages_adopted, s->pages_adopted);
  hk_add_relaxed(&exited.cache_reused, s->cache_reused);
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

#define LOAD(f) hk_load_relaxed(&hk_stats.f)

void hk_stats_print(const hk_usage *u) {
  hk_heap_stats t = u->self;
  t.pages_acquired += hk_load_relaxed(&exited.pages_acquired);
  t.pages_released += hk_load_relaxed(&exited.pages_released);
  t.remote_frees += hk_load_relaxed(&exited.remote_frees);
  t.pages_adopted += hk_load_relaxed(&exited.pages_adopted);
  t.cache_reused += hk_load_relaxed(&exited.cache_reused);
  static const char head[] = "hakmem: statistics (hakmem " HK_VERSION_STRING ")\n";
  hk_os_write_stderr(head, sizeof head - 1);
  hk_os_write_stderr("hakmem: small/medium tier (size classes)\n", 41);
  line("regions mapped", LOAD(regions_mapped), NULL);
  line("regions unmapped", LOAD(regions_unmapped), NULL);
  line("regions peak", LOAD(regions_peak), "x 4 MiB");
  line("slabs in use", u->region_in_use / HK_SLAB_SIZE, "x 64 KiB");
  line("slabs peak (the lists' peaks summed)", u->region_peak / HK_SLAB_SIZE, "x 64 KiB");
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
  line("empty pages of exited threads kept now", u->abandoned_empty, NULL);
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

