/* What a program and a person read about the heap: hak_stats_get and
 * hak_stats_json, malloc_info (glibc's XML) and mallinfo2, the report of
 * HAKMEM_STATS (text or JSON, to stderr or HAKMEM_STATS_FILE) at exit and
 * from malloc_stats(). The counters are stats.c's; the live figures, which
 * no counter holds, are gathered on demand from the pages' own counts (see
 * tally_page), so the fast paths pay nothing for them. */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "hakmem.h"

#define LOAD(f) hk_load_relaxed(&hk_stats.f)

/* ---- the live figures ----
 * A page's `used` counts the blocks it handed out and has not had back on
 * its free list (block.h, hk_page_used). Some of those the program has
 * freed: the blocks on the page's remote stack (counted in its top bits),
 * and those waiting in a heap's thread cache, stash or quarantine (counted
 * per heap and class). The rest are live. The counts are the owners' plain
 * fields, read here without their owners' knowledge: exact when no other
 * thread allocates or frees meanwhile, each page's as of some moment of
 * the walk otherwise. */
typedef struct class_tally {
  int64_t live[HK_NSIZES];     /* blocks */
  uint64_t carved[HK_NSIZES];  /* blocks carved in the class's pages */
  uint64_t pages[HK_NSIZES], page_bytes[HK_NSIZES];
} class_tally;

/* A twin class (aligned allocation's unpadded blocks) counts as its class. */
static unsigned size_of_class(unsigned c) { return c < HK_NCLASSES ? hk_class_base[c] : HK_NSIZES; }

#define PEEK(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)

/* The blocks of page that are live, and its class (*cls: HK_NSIZES, none):
 * -1 for a page with no count yet or all free. */
static int64_t page_live(const hk_page *page, unsigned *cls, uint32_t *capacity) {
  *cls = size_of_class(PEEK(page->cls));
  *capacity = PEEK(page->capacity);
  uintptr_t remote = hk_load_acquire(&((hk_page *)page)->remote);
  /* a span just taken (`used` not set yet), or a page whose blocks all came
   * back by remote frees and that its last freer gives back (remote.c) */
  if (*cls >= HK_NSIZES || *capacity == 0 || (remote & HK_REMOTE_STATE_MASK) == HK_PAGE_RECLAIMED) return -1;
  hk_page copy;
  copy.used = PEEK(page->used);
  int64_t live = (int64_t)hk_page_used(&copy) - (int64_t)(remote >> HK_REMOTE_COUNT_SHIFT);
  if (live < 0) live = 0;
  if (live > *capacity) live = *capacity;
  return live;
}

static void tally_page(const hk_page *page, void *arg) {
  class_tally *t = arg;
  unsigned c;
  uint32_t capacity;
  int64_t live = page_live(page, &c, &capacity);
  if (c >= HK_NSIZES) return;
  t->pages[c]++;
  t->page_bytes[c] += (uint64_t)PEEK(page->nslabs) << HK_SLAB_SHIFT;
  if (live < 0) return;
  t->live[c] += live;
  t->carved[c] += capacity;
}

/* The page of the block in slot i of h's quarantine, NULL if the slot is
 * free (read as the walks read everything: see above). */
static const hk_page *quarantined_page(const hk_heap *h, unsigned i) {
  const hk_page *page = (const hk_page *)(PEEK(h->quarantine[i].page) & ~(uintptr_t)1); /* (bit 0: remote.c's) */
  return PEEK(h->quarantine[i].block) != NULL ? page : NULL;
}

/* Freed blocks that heaps hold for reuse (their pages count them as handed
 * out); also the threads with a heap. */
static uint64_t tally_heaps(class_tally *t) {
  uint64_t threads = 0;
  hk_lock(&hk_heap_lock);
  for (hk_heap *h = hk_all_heaps; h != NULL; h = h->all_next) {
    /* (tid 0: the late heap, the profiler's, a forked child's copies of
     * its parent's other threads' heaps: no thread of this process's) */
    if (hk_load_relaxed(&h->live) != 0 && hk_load_relaxed(&h->tid) != 0) threads++;
    for (unsigned c = 0; c < HK_NCLASSES; c++) {
      unsigned s = size_of_class(c);
      uint32_t room = PEEK(h->cache_room[c]);
      /* (a heap being set up has its rooms still zero for a moment) */
      if (room <= hk_class_cache_max[c]) t->live[s] -= hk_class_cache_max[c] - room;
      t->live[s] -= PEEK(h->stash_count[c]);
    }
    for (unsigned i = 0; i < HK_QUARANTINE; i++) {
      const hk_page *page = quarantined_page(h, i);
      if (page != NULL) t->live[size_of_class(PEEK(page->cls)) % HK_NSIZES]--;
    }
  }
  hk_unlock(&hk_heap_lock);
  return threads;
}

/* Every reader below holds the purger's pass off (hk_pressure_hold): the
 * pass moves blocks between the counts added up here (it collects the
 * remote frees of exited threads' pages and reaps heaps). The same hold
 * guards the struct and tally they fill, kept off the stack (11 KiB). */
static struct hak_stats stats;
static class_tally tally;

/* Every figure of struct hak_stats, into `stats`. The walks take locks (the
 * heap list, the region lists, the large cache), never a caller's. */
static void collect(void) {
  struct hak_stats *s = &stats;
  memset(s, 0, sizeof *s);
  s->version = HAK_STATS_VERSION;
  s->size = sizeof *s;
  memset(&tally, 0, sizeof tally);
  s->threads = tally_heaps(&tally);
  hk_region_each_page(tally_page, &tally);
  unsigned n = 0;
  for (unsigned c = 0; c < HK_NSIZES && n < HAK_STATS_CLASSES; c++) {
    uint64_t live = tally.live[c] > 0 ? (uint64_t)tally.live[c] : 0;
    struct hak_stats_class *k = &s->classes[n++];
    k->block_size = hk_class_size[c];
    k->live_blocks = live;
    k->live_bytes = live * hk_class_size[c];
    k->free_blocks = tally.carved[c] > live ? tally.carved[c] - live : 0;
    k->pages = tally.pages[c];
    k->page_bytes = tally.page_bytes[c];
    s->small_live_blocks += live;
    s->small_live_bytes += k->live_bytes;
  }
  s->nclasses = n;
  s->large_live_blocks = LOAD(large_allocs) - LOAD(large_frees);
  s->large_live_bytes = hk_large_live_bytes();
  s->live_blocks = s->small_live_blocks + s->large_live_blocks;
  s->live_bytes = s->small_live_bytes + s->large_live_bytes;
  size_t mapped, in_use, peak, large, cached;
  hk_region_usage(&mapped, &in_use, &peak);
  hk_large_usage(&large, &cached);
  s->region_bytes = mapped;
  s->page_bytes = in_use;
  s->large_mapped_bytes = large;
  s->large_cached_bytes = cached;
  s->mapped_bytes = mapped + large;
  s->resident_bytes = (uint64_t)hk_os_current_rss_kb() << 10;
  s->peak_resident_bytes = (uint64_t)hk_os_peak_rss_kb() << 10;
  s->threads_started = LOAD(heaps_created) - LOAD(sample_heaps) - LOAD(user_heaps);
  s->threads_exited = LOAD(threads_exited);
  hk_heap_stats mine = {0};
  if (hk_tls_heap != &hk_heap_empty) mine = hk_tls_heap->stats;
  hk_stats_add_exited(&mine);
  s->remote_frees = mine.remote_frees;
  s->purges = LOAD(purge_calls) + LOAD(blocks_purged);
  s->purged_bytes = LOAD(slabs_purged) * HK_SLAB_SIZE + LOAD(block_purge_bytes);
  s->large_allocs = LOAD(large_allocs);
  s->large_frees = LOAD(large_frees);
  s->large_cache_hits = LOAD(large_cache_hits);
  s->regions_mapped = LOAD(regions_mapped);
  s->regions_unmapped = LOAD(regions_unmapped);
}

/* ---- what each thread allocated (hak_thread_stats) ----
 * A thread's live blocks are the live blocks of the pages its heap owns
 * and of those of its sample heap (profile.c), counted as tally_page
 * counts them, less the freed blocks of its pages that its stash holds and
 * that any heap's quarantine holds; plus its live large blocks, which
 * large.c counts per heap. Blocks it allocated from a heap of the
 * program's (hak_heap_use) are that heap's. The pages' counts are exact
 * when every block another thread frees goes straight back to its page,
 * and no page or sample heap with live blocks passes to another thread:
 * with HAKMEM_THREAD_STATS (no thread cache of other heaps' blocks;
 * abandoned.c and heap.c hand an exited thread's pages in use and sample
 * heaps with samples on only when many wait, and mark the taker
 * `inherited`: its figures are inexact from then on). Without it, a block that another thread freed and
 * keeps in its cache (HK_CACHE_BYTES at most, per thread) still counts to
 * its allocating thread, and so do an exited thread's live blocks in a
 * page or sample heap another thread took over. */
static uint64_t thread_walk; /* the walk's number (under the statistics' hold) */

static void tally_add(hk_heap *h, int64_t blocks, int64_t bytes) {
  if (h->tally_walk != thread_walk) {
    h->tally_walk = thread_walk;
    h->tally_blocks = h->tally_bytes = 0;
  }
  h->tally_blocks += blocks;
  h->tally_bytes += bytes;
}

static void tally_thread_page(const hk_page *page, void *arg) {
  (void)arg;
  hk_heap *owner = hk_owner_untag(hk_load_relaxed(&((hk_page *)page)->heap));
  unsigned c;
  uint32_t capacity;
  int64_t live = page_live(page, &c, &capacity);
  if (owner != NULL && live > 0) tally_add(owner, live, live * (int64_t)hk_class_size[c]);
}

/* Every heap's sums, of a new walk. */
static void tally_threads(void) {
  thread_walk++;
  hk_region_each_page(tally_thread_page, NULL);
  hk_lock(&hk_heap_lock);
  for (hk_heap *h = hk_all_heaps; h != NULL; h = h->all_next) {
    for (unsigned c = 0; c < HK_NCLASSES; c++) {
      int64_t n = PEEK(h->stash_count[c]);
      if (n != 0) tally_add(h, -n, -n * (int64_t)hk_class_size[size_of_class(c)]);
    }
    for (unsigned i = 0; i < HK_QUARANTINE; i++) {
      const hk_page *page = quarantined_page(h, i);
      if (page == NULL) continue;
      hk_heap *owner = hk_owner_untag(hk_load_relaxed(&((hk_page *)page)->heap));
      unsigned c = size_of_class(PEEK(page->cls));
      if (owner != NULL && c < HK_NSIZES) tally_add(owner, -1, -(int64_t)hk_class_size[c]);
    }
  }
  hk_unlock(&hk_heap_lock);
}

/* h's thread's figures from the walk's sums (under hk_heap_lock): h is a
 * thread's heap. */
static void thread_figures(hk_heap *h, struct hak_thread_stats *t) {
  memset(t, 0, sizeof *t);
  /* (the caller's own heap: its tid now; a child forked while the process
   * had one thread keeps its parent's in the heap, see init.c's fork
   * handlers) */
  t->tid = h == hk_tls_heap ? (unsigned long long)hk_os_tid() : (unsigned long long)hk_load_relaxed(&h->tid);
  int64_t blocks = 0, bytes = 0;
  hk_heap *sample = PEEK(h->sample_heap);
  const hk_heap *of[2] = {h, sample};
  for (unsigned i = 0; i < 2; i++)
    if (of[i] != NULL && of[i]->tally_walk == thread_walk) {
      blocks += of[i]->tally_blocks;
      bytes += of[i]->tally_bytes;
    }
  uint64_t large_blocks, large_bytes;
  hk_large_thread_sum(h, &large_blocks, &large_bytes);
  t->large_live_blocks = large_blocks;
  t->large_live_bytes = large_bytes;
  t->live_blocks = (blocks > 0 ? (uint64_t)blocks : 0) + large_blocks;
  t->live_bytes = (bytes > 0 ? (uint64_t)bytes : 0) + large_bytes;
  t->exact = hk_thread_stats && !PEEK(h->inherited) && (sample == NULL || !PEEK(sample->inherited));
}

/* Is h a thread's of this process now? (tid 0: the late heap, sample heaps,
 * heaps of the program's, a forked child's copies of its parent's other
 * threads' heaps) */
static bool thread_heap(const hk_heap *h) {
  return PEEK(h->kind) == HK_HEAP_THREAD && hk_load_relaxed(&h->live) != 0 && hk_load_relaxed(&h->tid) != 0;
}

HK_API int hak_thread_stats(long tid, struct hak_thread_stats *out, size_t size) {
  if (out == NULL || size < sizeof *out || tid < 0) {
    errno = EINVAL;
    return -1;
  }
  hk_init();
  long me = hk_os_tid();
  bool self = tid == 0 || tid == me;
  if (tid == 0) tid = me;
  bool found = false;
  hk_pressure_hold();
  tally_threads();
  hk_lock(&hk_heap_lock);
  hk_heap *mine = hk_tls_heap != &hk_heap_empty ? hk_tls_heap : NULL;
  for (hk_heap *h = hk_all_heaps; h != NULL && !found; h = h->all_next)
    if (self ? h == mine : thread_heap(h) && hk_load_relaxed(&h->tid) == tid) {
      thread_figures(h, out);
      found = true;
    }
  hk_unlock(&hk_heap_lock);
  hk_pressure_unhold();
  if (!found && self) { /* a thread that has not allocated yet */
    memset(out, 0, sizeof *out);
    out->tid = (unsigned long long)tid;
    out->exact = hk_thread_stats;
    found = true;
  }
  if (!found) errno = ESRCH;
  return found ? 0 : -1;
}

/* The threads with the most live bytes, most first (for the reports). */
#define THREADS_LISTED 16
typedef struct {
  struct hak_thread_stats of[THREADS_LISTED];
  size_t n;
} thread_list;

static void threads_get(thread_list *l) {
  l->n = 0;
  tally_threads();
  hk_lock(&hk_heap_lock);
  for (hk_heap *h = hk_all_heaps; h != NULL; h = h->all_next) {
    if (!thread_heap(h)) continue;
    struct hak_thread_stats t;
    thread_figures(h, &t);
    size_t i = l->n < THREADS_LISTED ? l->n++ : THREADS_LISTED;
    if (i == THREADS_LISTED && t.live_bytes <= l->of[THREADS_LISTED - 1].live_bytes) continue;
    if (i == THREADS_LISTED) i--;
    for (; i > 0 && l->of[i - 1].live_bytes < t.live_bytes; i--) l->of[i] = l->of[i - 1];
    l->of[i] = t;
  }
  hk_unlock(&hk_heap_lock);
}

HK_API int hak_stats_get(struct hak_stats *out, size_t size) {
  if (out == NULL || size < HAK_STATS_MIN_SIZE) {
    errno = EINVAL;
    return -1;
  }
  hk_init();
  hk_pressure_hold();
  collect();
  size_t n = size < sizeof stats ? size : sizeof stats;
  stats.size = n;
  memcpy(out, &stats, n);
  hk_pressure_unhold();
  return 0;
}

/* ---- text into a buffer (no stdio: it may allocate) ---- */
typedef struct text {
  char *buf;
  size_t size, len; /* len may pass size: what the whole text would take */
} text;

static void put(text *o, const char *s, size_t n) {
  if (o->len < o->size) memcpy(o->buf + o->len, s, o->len + n <= o->size ? n : o->size - o->len);
  o->len += n;
}
static void puts_(text *o, const char *s) { put(o, s, strlen(s)); }
static void put_dec(text *o, uint64_t v) {
  char d[24];
  put(o, d, hk_fmt_dec(d, v));
}
/* a JSON string's content (the program's name: any bytes) */
static void put_escaped(text *o, const char *s) {
  char e[6];
  for (; *s; s++) put(o, e, hk_fmt_json_char(e, (unsigned char)*s));
}
static void field(text *o, const char *name, uint64_t v) {
  puts_(o, ",\"");
  puts_(o, name);
  puts_(o, "\":");
  put_dec(o, v);
}

static const char *program_name(void) {
  extern char *program_invocation_short_name; /* (glibc and musl; no allocation) */
  return program_invocation_short_name != NULL ? program_invocation_short_name : "";
}

/* The labelled heaps' figures (hak_label), gathered before the statistics'
 * hold: a heap's lock is taken before every other. */
#define LABELS_MAX 16
typedef struct {
  struct hak_heap_stats of[LABELS_MAX];
  size_t n;
} labels;

static void labels_get(labels *l) { l->n = hk_user_heap_labels(l->of, LABELS_MAX); }

static void write_json(text *o, const struct hak_stats *s, const labels *l, const thread_list *t) {
  puts_(o, "{\"hakmem\":\"" HK_VERSION_STRING "\"");
  field(o, "version", s->version);
  field(o, "pid", (uint64_t)hk_os_pid());
  puts_(o, ",\"program\":\"");
  put_escaped(o, program_name());
  puts_(o, "\"");
#define F(name) field(o, #name, s->name)
  F(live_bytes); F(live_blocks); F(small_live_bytes); F(small_live_blocks);
  F(large_live_bytes); F(large_live_blocks); F(mapped_bytes); F(region_bytes); F(page_bytes);
  F(large_mapped_bytes); F(large_cached_bytes); F(resident_bytes); F(peak_resident_bytes); F(threads);
  F(threads_started); F(threads_exited); F(remote_frees); F(purges); F(purged_bytes);
  F(large_allocs); F(large_frees); F(large_cache_hits); F(regions_mapped); F(regions_unmapped);
#undef F
  puts_(o, ",\"classes\":[");
  bool first = true;
  for (unsigned i = 0; i < s->nclasses; i++) {
    const struct hak_stats_class *k = &s->classes[i];
    if (k->pages == 0 && k->live_blocks == 0) continue; /* (classes never used: left out) */
    puts_(o, first ? "{" : ",{");
    first = false;
    puts_(o, "\"block_size\":");
    put_dec(o, k->block_size);
    field(o, "live_blocks", k->live_blocks);
    field(o, "live_bytes", k->live_bytes);
    field(o, "free_blocks", k->free_blocks);
    field(o, "pages", k->pages);
    field(o, "page_bytes", k->page_bytes);
    puts_(o, "}");
  }
  puts_(o, "],\"labels\":[");
  for (size_t i = 0; i < l->n; i++) {
    const struct hak_heap_stats *k = &l->of[i];
    puts_(o, i == 0 ? "{\"name\":\"" : ",{\"name\":\"");
    put_escaped(o, k->name);
    puts_(o, "\"");
    field(o, "live_blocks", k->live_blocks);
    field(o, "live_bytes", k->live_bytes);
    field(o, "page_bytes", k->page_bytes);
    field(o, "large_bytes", k->large_bytes);
    puts_(o, "}");
  }
  puts_(o, "],\"thread_stats_exact\":");
  puts_(o, hk_thread_stats ? "true" : "false");
  puts_(o, ",\"thread_live\":[");
  for (size_t i = 0; i < t->n; i++) {
    const struct hak_thread_stats *k = &t->of[i];
    puts_(o, i == 0 ? "{\"tid\":" : ",{\"tid\":");
    put_dec(o, k->tid);
    field(o, "live_blocks", k->live_blocks);
    field(o, "live_bytes", k->live_bytes);
    field(o, "large_live_blocks", k->large_live_blocks);
    field(o, "large_live_bytes", k->large_live_bytes);
    puts_(o, k->exact ? ",\"exact\":true}" : ",\"exact\":false}");
  }
  puts_(o, "]}\n");
}

HK_API size_t hak_stats_json(char *buf, size_t size) {
  hk_init();
  labels l;
  labels_get(&l);
  hk_pressure_hold();
  collect();
  thread_list t;
  threads_get(&t);
  text o = {buf, size, 0};
  write_json(&o, &stats, &l, &t);
  hk_pressure_unhold();
  /* the terminating NUL, and no newline: one object */
  size_t len = o.len - 1;
  if (buf != NULL && size > 0) buf[len < size ? len : size - 1] = 0;
  return len;
}

/* ---- the text report ---- */
static void line(int fd, const char *name, uint64_t v, const char *unit) {
  char buf[160];
  size_t n = 0, len = strlen(name);
  memcpy(buf, "hakmem:   ", 10); n = 10;
  memcpy(buf + n, name, len); n += len;
  do buf[n++] = ' '; while (n < 50);
  n += hk_fmt_dec(buf + n, v);
  if (unit) { size_t u = strlen(unit); buf[n++] = ' '; memcpy(buf + n, unit, u); n += u; }
  buf[n++] = '\n';
  hk_os_write(fd, buf, n);
}

static void say(int fd, const char *s) { hk_os_write(fd, s, strlen(s)); }

static void print_text(int fd, const hk_usage *u, const struct hak_stats *s, const labels *l, const thread_list *tl) {
  hk_heap_stats t = u->self;
  hk_stats_add_exited(&t);
  char head[200];
  text o = {head, sizeof head, 0};
  puts_(&o, "hakmem: statistics (hakmem " HK_VERSION_STRING ") of process ");
  put_dec(&o, (uint64_t)hk_os_pid());
  puts_(&o, " (");
  puts_(&o, program_name());
  puts_(&o, ")\n");
  hk_os_write(fd, head, o.len < o.size ? o.len : o.size);
  say(fd, "hakmem: live now\n");
  line(fd, "live bytes (at their size classes' sizes)", s->live_bytes, "B");
  line(fd, "live blocks", s->live_blocks, NULL);
  line(fd, "live large blocks", s->large_live_blocks, NULL);
  line(fd, "live large bytes (asked for)", s->large_live_bytes, "B");
  say(fd, "hakmem: small/medium tier (size classes)\n");
  line(fd, "regions mapped", LOAD(regions_mapped), NULL);
  line(fd, "regions unmapped", LOAD(regions_unmapped), NULL);
  line(fd, "regions peak", LOAD(regions_peak), "x 4 MiB");
  line(fd, "slabs in use", u->region_in_use / HK_SLAB_SIZE, "x 64 KiB");
  line(fd, "slabs peak (the lists' peaks summed)", u->region_peak / HK_SLAB_SIZE, "x 64 KiB");
  line(fd, "slabs purged", LOAD(slabs_purged), "x 64 KiB");
  line(fd, "purge calls (madvise)", LOAD(purge_calls), NULL);
  line(fd, "growth purges", LOAD(growth_purges), NULL);
  line(fd, "span searches", LOAD(span_searches), NULL);
  line(fd, "regions read by span searches", LOAD(span_search_reads), NULL);
  line(fd, "free medium blocks purged (madvise)", LOAD(blocks_purged), NULL);
  line(fd, "bytes purged inside free medium blocks", LOAD(block_purge_bytes), "B");
  line(fd, "free slabs lent back by pages in use", LOAD(slabs_lent), "x 64 KiB");
  line(fd, "spans given back while their list was busy", LOAD(spans_deferred), NULL);
  line(fd, "pages acquired (this+exited threads)", t.pages_acquired, NULL);
  line(fd, "pages released", t.pages_released, NULL);
  line(fd, "pages adopted from exited threads", t.pages_adopted, NULL);
  line(fd, "empty pages of exited threads kept now", u->abandoned_empty, NULL);
  line(fd, "empty pages of exited threads given back", LOAD(abandoned_released), NULL);
  line(fd, "empty pages of exited threads trimmed", LOAD(abandoned_trimmed), NULL);
  line(fd, "spare spans given back after a purge delay", LOAD(spares_released), NULL);
  line(fd, "full pages emptied remotely, given back", LOAD(pages_reclaimed), NULL);
  line(fd, "remote frees sent back to their pages", t.remote_frees, NULL);
  line(fd, "freed blocks reused from the thread cache", t.cache_reused, NULL);
  say(fd, "hakmem: large tier (direct mappings)\n");
  line(fd, "large allocations", LOAD(large_allocs), NULL);
  line(fd, "large frees", LOAD(large_frees), NULL);
  line(fd, "large cache hits", LOAD(large_cache_hits), NULL);
  line(fd, "large mremap calls", LOAD(large_remaps), NULL);
  line(fd, "large unmaps", LOAD(large_unmaps), NULL);
  line(fd, "live large blocks' tails unmapped", LOAD(large_tails_trimmed), NULL);
  line(fd, "large bytes mapped now", LOAD(large_mapped_bytes), "B");
  line(fd, "large bytes mapped peak", LOAD(large_peak_bytes), "B");
  say(fd, "hakmem: process\n");
  line(fd, "threads with a heap now", s->threads, NULL);
  line(fd, "heaps created", LOAD(heaps_created), NULL);
  line(fd, "heaps made by the program", LOAD(user_heaps), NULL);
  line(fd, "threads exited", LOAD(threads_exited), NULL);
  line(fd, "heaps of exited threads reaped", LOAD(heaps_reaped), NULL);
  line(fd, "peak RSS", s->peak_resident_bytes >> 10, "KiB");
  line(fd, "current RSS", s->resident_bytes >> 10, "KiB");
  uint64_t hard, soft;
  hk_limits_get(&hard, &soft);
  if (hard != 0 || soft != 0) {
    say(fd, "hakmem: memory limits (0: none)\n");
    line(fd, "hard limit", hard, "B");
    line(fd, "soft limit", soft, "B");
    line(fd, "held now (regions and large mappings)", hk_limit_held(), "B");
    line(fd, "mappings refused", LOAD(limit_refusals), NULL);
    line(fd, "soft-limit releases", LOAD(soft_limit_passes), NULL);
  }
  for (size_t i = 0; i < l->n; i++) {
    const struct hak_heap_stats *k = &l->of[i];
    if (i == 0) say(fd, "hakmem: labels (hak_label)\n");
    char buf[200];
    text o = {buf, sizeof buf, 0};
    puts_(&o, "hakmem:   ");
    puts_(&o, k->name);
    puts_(&o, ": ");
    put_dec(&o, k->live_bytes);
    puts_(&o, " B live in ");
    put_dec(&o, k->live_blocks);
    puts_(&o, " blocks, ");
    put_dec(&o, k->page_bytes + k->large_bytes);
    puts_(&o, " B held\n");
    hk_os_write(fd, buf, o.len < o.size ? o.len : o.size);
  }
  for (size_t i = 0; i < tl->n; i++) {
    const struct hak_thread_stats *k = &tl->of[i];
    if (i == 0)
      say(fd, hk_thread_stats ? "hakmem: live by thread (the most first)\n"
                              : "hakmem: live by thread (the most first; inexact without HAKMEM_THREAD_STATS=1)\n");
    char buf[200];
    text o = {buf, sizeof buf, 0};
    puts_(&o, "hakmem:   thread ");
    put_dec(&o, k->tid);
    puts_(&o, ": ");
    put_dec(&o, k->live_bytes);
    puts_(&o, " B live in ");
    put_dec(&o, k->live_blocks);
    puts_(&o, " blocks (");
    put_dec(&o, k->large_live_bytes);
    puts_(&o, hk_thread_stats && !k->exact ? " B in large blocks; inexact: it took over an exited thread's)\n"
                                           : " B in large blocks)\n");
    hk_os_write(fd, buf, o.len < o.size ? o.len : o.size);
  }
  say(fd, "hakmem: options\n");
  hk_options_print(fd);
}

/* malloc_stats() and HAKMEM_STATS at exit: text, or JSON with
 * HAKMEM_STATS=json. */
static void stats_print(const hk_usage *u) {
  labels l;
  labels_get(&l);
  hk_pressure_hold();
  collect();
  thread_list t;
  threads_get(&t);
  int fd = hk_stats_report_fd();
  if (hk_opt.stats == 2) {
    static char buf[32 << 10]; /* (enough for every class; a longer text is cut) */
    text o = {buf, sizeof buf, 0};
    write_json(&o, &stats, &l, &t);
    hk_os_write(fd, buf, o.len < o.size ? o.len : o.size);
  } else {
    print_text(fd, u, &stats, &l, &t);
  }
  hk_stats_report_done(fd);
  hk_pressure_unhold();
}

/* the heap profile now (profile.c) */
HK_API int hak_profile_dump(const char *path) {
  hk_init();
  hk_profile_poll();
  return hk_profile_dump(path);
}

/* the counters, and what the tiers hold now */
void hk_stats_report(void) {
  hk_usage u;
  hk_pressure_usage(&u);
  stats_print(&u);
}

HK_API void hak_malloc_stats(void) { hk_stats_report(); }

/* HAKMEM_STATS: the statistics at exit */
__attribute__((destructor)) static void stats_at_exit(void) {
  if (hk_opt.stats) hk_stats_report();
}

/* ---- the timeline (HAKMEM_TIMELINE_FILE, docs/REPORT.md) ----
 * A thread of its own appends a line every HAKMEM_TIMELINE_MS: the
 * milliseconds since the timeline started, RSS, live bytes and mapped
 * bytes, from the same walk as hak_stats_get (the allocator's own figures:
 * no ptrace), and with the heap profiler on, a profile at each new peak of
 * the live bytes (hk_profile_peak). The first line is a JSON header naming
 * the process; the last is written at exit. A forked child starts a timeline of its own (the
 * name's %p is its pid); an exec'd program, from its own start-up. */
static int timeline_fd = -1;
static uint64_t timeline_t0_us;

static void timeline_line(void) {
  hk_pressure_hold();
  collect();
  uint64_t v[4] = {(hk_os_now_us() - timeline_t0_us) / 1000, stats.resident_bytes, stats.live_bytes,
                   stats.mapped_bytes};
  hk_pressure_unhold();
  char line[96];
  size_t n = 0;
  for (int i = 0; i < 4; i++) {
    if (i) line[n++] = ' ';
    n += hk_fmt_dec(line + n, v[i]);
  }
  line[n++] = '\n';
  hk_os_write(timeline_fd, line, n);
  hk_profile_peak(v[2]);
}

static void *timeline_main(void *arg) {
  (void)arg;
  for (;;) {
    hk_os_sleep_ms(hk_opt.timeline_ms);
    timeline_line();
  }
  return NULL;
}

/* At load, once hakmem is initialised (pthread_create allocates), and in
 * a forked child (hk_fork_child_done). */
static void timeline_start(void) {
  char name[1100];
  if (hk_opt.timeline_file == NULL) return;
  if (timeline_fd >= 0) hk_os_close(timeline_fd); /* (the parent's, in a forked child) */
  timeline_fd = -1;
  if (!hk_fmt_path(name, sizeof name, hk_opt.timeline_file, "") || (timeline_fd = hk_os_create(name)) < 0) {
    hk_warning("cannot create the HAKMEM_TIMELINE_FILE");
    return;
  }
  timeline_t0_us = hk_os_now_us();
  text o = {name, sizeof name, 0};
  puts_(&o, "{\"hakmem_timeline\":1,\"pid\":");
  put_dec(&o, (uint64_t)hk_os_pid());
  puts_(&o, ",\"program\":\"");
  put_escaped(&o, program_name());
  puts_(&o, "\",\"interval_ms\":");
  put_dec(&o, (uint64_t)hk_opt.timeline_ms);
  puts_(&o, ",\"columns\":[\"ms\",\"rss\",\"live\",\"mapped\"]}\n");
  if (o.len <= sizeof name) hk_os_write(timeline_fd, name, o.len);
  timeline_line();
  if (!hk_os_start_thread(timeline_main)) hk_warning("cannot start the timeline thread");
}

__attribute__((constructor)) static void timeline_at_load(void) {
  hk_init();
  if (hk_opt.timeline_file == NULL) return;
  hk_fork_child_done = timeline_start;
  timeline_start();
}

__attribute__((destructor)) static void timeline_at_exit(void) {
  if (timeline_fd >= 0) timeline_line();
}

/* ---- glibc's malloc_info: XML, in glibc's elements ----
 * One <heap> for the size classes, its <size> elements one per class with
 * free blocks (from/to: the sizes the class serves; total, count: its free
 * bytes and blocks, as glibc lists free chunks); "mmap" for large blocks. */
static void xml_total(text *o, const char *type, uint64_t count, uint64_t size) {
  puts_(o, "<total type=\"");
  puts_(o, type);
  puts_(o, "\" count=\"");
  put_dec(o, count);
  puts_(o, "\" size=\"");
  put_dec(o, size);
  puts_(o, "\"/>\n");
}
static void xml_system(text *o, const char *elem, const char *type, uint64_t size) {
  puts_(o, "<");
  puts_(o, elem);
  puts_(o, " type=\"");
  puts_(o, type);
  puts_(o, "\" size=\"");
  put_dec(o, size);
  puts_(o, "\"/>\n");
}

/* (the caller's FILE: stdio may allocate, which is allowed here: no lock of
 * hakmem's is held while it runs) */
HK_API int hak_malloc_info(int options, FILE *fp) {
  if (options != 0 || fp == NULL) {
    errno = EINVAL;
    return -1;
  }
  hk_init();
  struct hak_stats copy; /* (stdio below may allocate: not under the hold) */
  hk_pressure_hold();
  collect();
  copy = stats;
  hk_pressure_unhold();
  const struct hak_stats *s = &copy;
  char buf[256];
  text o = {buf, sizeof buf, 0};
  fputs("<malloc version=\"1\">\n<heap nr=\"0\">\n<sizes>\n", fp);
  uint64_t free_blocks = 0, free_bytes = 0;
  for (unsigned i = 0; i < s->nclasses; i++) {
    const struct hak_stats_class *k = &s->classes[i];
    if (k->free_blocks == 0) continue;
    o.len = 0;
    puts_(&o, "<size from=\"");
    put_dec(&o, i == 0 ? 1 : s->classes[i - 1].block_size + 1);
    puts_(&o, "\" to=\"");
    put_dec(&o, k->block_size);
    puts_(&o, "\" total=\"");
    put_dec(&o, k->free_blocks * k->block_size);
    puts_(&o, "\" count=\"");
    put_dec(&o, k->free_blocks);
    puts_(&o, "\"/>\n");
    fwrite(buf, 1, o.len, fp);
    free_blocks += k->free_blocks;
    free_bytes += k->free_blocks * k->block_size;
  }
  o.len = 0;
  puts_(&o, "</sizes>\n");
  xml_total(&o, "fast", 0, 0);
  xml_total(&o, "rest", free_blocks, free_bytes);
  xml_system(&o, "system", "current", s->region_bytes);
  fwrite(buf, 1, o.len, fp);
  o.len = 0;
  xml_system(&o, "system", "max", (uint64_t)LOAD(regions_peak) * HK_REGION_SIZE);
  xml_system(&o, "aspace", "total", s->region_bytes);
  xml_system(&o, "aspace", "mprotect", s->page_bytes);
  puts_(&o, "</heap>\n");
  fwrite(buf, 1, o.len, fp);
  o.len = 0;
  xml_total(&o, "fast", 0, 0);
  xml_total(&o, "rest", free_blocks, free_bytes);
  xml_total(&o, "mmap", s->large_live_blocks, s->large_mapped_bytes - s->large_cached_bytes);
  fwrite(buf, 1, o.len, fp);
  o.len = 0;
  xml_system(&o, "system", "current", s->mapped_bytes);
  xml_system(&o, "system", "max", (uint64_t)LOAD(regions_peak) * HK_REGION_SIZE + LOAD(large_peak_bytes));
  xml_system(&o, "aspace", "total", s->mapped_bytes);
  xml_system(&o, "aspace", "mprotect", s->page_bytes + s->large_mapped_bytes);
  puts_(&o, "</malloc>\n");
  fwrite(buf, 1, o.len, fp);
  return 0;
}

/* mallinfo2: small/medium regions are the arena, their live blocks (at
 * their classes' sizes) in use and the rest free; large mappings are
 * hblkhd, except those held by the large-block cache, which count as free.
 * uordblks counts both tiers' live bytes, as it always has here. */
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
HK_API struct mallinfo2 hak_mallinfo2(void) {
  struct mallinfo2 mi;
  memset(&mi, 0, sizeof mi);
  hk_init();
  hk_pressure_hold();
  collect();
  const struct hak_stats s = stats;
  uint64_t live_large = s.large_mapped_bytes > s.large_cached_bytes ? s.large_mapped_bytes - s.large_cached_bytes : 0;
  uint64_t free_blocks = 0;
  for (unsigned i = 0; i < s.nclasses; i++) free_blocks += s.classes[i].free_blocks;
  mi.arena = s.region_bytes;
  mi.ordblks = free_blocks;
  mi.hblks = s.large_live_blocks;
  mi.hblkhd = live_large;
  mi.uordblks = s.small_live_bytes + live_large;
  mi.fordblks = (s.region_bytes > s.small_live_bytes ? s.region_bytes - s.small_live_bytes : 0) + s.large_cached_bytes;
  hk_pressure_unhold();
  return mi;
}
#endif
