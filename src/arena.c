/* The arena: one reservation of address space that small regions are
 * committed in, with the page table below it, which free() reads to find a
 * block's page; and the ownership map, one bit per 4 MiB of address space,
 * which says whether any other address is a mapping of hakmem's (large
 * blocks, regions outside the arena). block.h holds the lookups that read
 * them (hk_arena_page, hk_region_is_ours, hk_region_of). */
#include "internal.h"

/* The arena's slots and the ownership map's leaves; taken inside a region
 * list's lock and the region records' lock, never the other way round. */
static pthread_mutex_t arena_lock = PTHREAD_MUTEX_INITIALIZER;
_Atomic(_Atomic uint64_t *) hk_region_map[HK_MAP_LEAVES];
/* Leaves for the first few TiB-ranges mappings land in (arena_lock): a
 * process's mappings lie in one or two. */
#define MAP_LEAF_WORDS (((size_t)1 << HK_MAP_LEAF_SHIFT) / 64)
#define MAP_STATIC_LEAVES 4
static _Atomic uint64_t map_leaf_pool[MAP_STATIC_LEAVES][MAP_LEAF_WORDS];
static unsigned map_leaves_used;

/* ---- the arena ----
 * Reserved once, at initialisation: HAKMEM_ARENA_MB (64 GiB) of address
 * space, or a quarter as much, and so on, if the system refuses
 * (RLIMIT_AS). Reserving costs no memory and no commit charge; a region
 * slot is committed when a region needs it and decommitted when the region
 * is given back (one system call each, as mapping or unmapping a region
 * would be). Slot 0 stays unused. */
/* Until the arena is reserved, and for good if it never is, the base is
 * the first address of the upper half of the address space: from there no
 * user address p is less than 64 GiB ahead (p - base wraps to at least
 * 2^63), so every lookup (hk_arena_slab) finds p outside the arena and
 * takes the slow path, which reads no table. (A zero table in .bss would
 * do the same at the price of 8 MiB of address space, which counts against
 * RLIMIT_AS and RLIMIT_DATA.) */
char *hk_arena_base = (char *)((uintptr_t)1 << 63);
_Atomic size_t hk_arena_slots;                 /* slots reserved, slot 0 included (read by hk_region_of) */
static size_t arena_next = 1;                  /* slots below this were used once */
_Atomic bool hk_space_tight;
/* The limits are asked at most once a millisecond (two system calls, which
 * a program mapping large blocks in a loop would otherwise make for every
 * mapping), and at once after a mapping failed (force: hk_pressure_release),
 * so a limit set just before its first mapping costs at most that mapping's
 * retry. */
void hk_space_check(bool force) {
  static _Atomic uint64_t asked_ms;
  uint64_t now = hk_os_now_ms() + 1; /* (0: never asked) */
  if (!force && hk_load_relaxed(&asked_ms) == now) return;
  hk_store_relaxed(&asked_ms, now);
  hk_store_relaxed(&hk_space_tight, hk_os_space_tight());
}
_Atomic bool hk_arena_shrunk;                   /* some slots are holes (hk_region_of) */
_Atomic uint64_t hk_arena_holes[HK_ARENA_REGIONS / 64];
static uint64_t arena_free[HK_ARENA_REGIONS / 64]; /* bit i: slot i (< arena_next) is decommitted */

void hk_arena_init(void) {
  size_t want = (size_t)hk_opt.arena_mb / (HK_REGION_SIZE >> 20);
  for (size_t n = want < HK_ARENA_REGIONS ? want : HK_ARENA_REGIONS; n >= 2; n /= 4) {
    char *table = hk_os_reserve(HK_PAGE_TABLE_BYTES + n * HK_REGION_SIZE, HK_REGION_SIZE);
    if (table == NULL) continue;
    char *base = table + HK_PAGE_TABLE_BYTES;
    /* the table (zero: untouched entries take no memory), and slot 0's
     * header, which reads as zeros: the page of every unused table entry */
    if (!hk_os_commit(table, HK_PAGE_TABLE_BYTES) || !hk_os_commit(base, hk_os_page)) {
      hk_os_unmap(table, HK_PAGE_TABLE_BYTES + n * HK_REGION_SIZE);
      return;
    }
    hk_arena_base = base;
    hk_arena_slots = n;
    return;
  }
}

/* A free slot of the arena, or NULL. The caller commits it (after the
 * lock: two threads that grow at once do not wait for each other's
 * commit). */
hk_region *hk_arena_take(void) {
  size_t slot = 0;
  hk_lock(&arena_lock);
  for (size_t w = 0; w < (arena_next + 63) / 64; w++)
    if (arena_free[w]) {
      slot = w * 64 + (size_t)__builtin_ctzll(arena_free[w]);
      arena_free[w] &= arena_free[w] - 1;
      break;
    }
  if (slot == 0 && arena_next < hk_arena_slots) slot = arena_next++;
  hk_unlock(&arena_lock);
  return slot == 0 ? NULL : (hk_region *)(hk_arena_base + slot * HK_REGION_SIZE);
}

/* Slot r is free again (decommitted, or never committed). */
void hk_arena_give(hk_region *r) {
  size_t slot = (size_t)((char *)r - hk_arena_base) / HK_REGION_SIZE;
  hk_lock(&arena_lock);
  arena_free[slot / 64] |= (uint64_t)1 << (slot % 64);
  hk_unlock(&arena_lock);
}

/* Out of memory: unmap the arena's reserved slots that hold no region (the
 * never used and the given back), whose reservation counts against an
 * address-space limit (RLIMIT_AS) as much as a mapping does. They are not
 * committed again (a mapping of the program's may be there by then):
 * regions mapped there later are found as those beyond the arena are. */
bool hk_arena_shrink(void) {
  hk_lock(&arena_lock);
  bool shrunk = false;
  for (size_t w = 0; w < (arena_next + 63) / 64; w++) {
    for (uint64_t m = arena_free[w]; m != 0; m &= m - 1) {
      size_t slot = w * 64 + (size_t)__builtin_ctzll(m);
      /* a hole from now on: whatever lands there keeps its header at its
       * base (hk_region_of), so marked before the unmap */
      hk_store_release(&hk_arena_shrunk, true);
      atomic_fetch_or_explicit(&hk_arena_holes[slot / 64], (uint64_t)1 << (slot % 64), memory_order_release);
      hk_os_unmap(hk_arena_base + slot * HK_REGION_SIZE, HK_REGION_SIZE);
      shrunk = true;
    }
    arena_free[w] = 0;
  }
  /* slot 0 holds no region: only its first page, the zero record every
   * unused table entry leads to, is read (no mapping of ours can start at
   * its base while that page is there) */
  static bool slot0_trimmed;
  if (hk_arena_slots != 0 && !slot0_trimmed) {
    hk_os_unmap(hk_arena_base + hk_os_page, HK_REGION_SIZE - hk_os_page);
    slot0_trimmed = true;
    shrunk = true;
  }
  if (hk_arena_slots > arena_next) {
    size_t old = hk_arena_slots;
    hk_arena_slots = arena_next; /* (before the unmap, as above) */
    hk_os_unmap(hk_arena_base + arena_next * HK_REGION_SIZE, (old - arena_next) * HK_REGION_SIZE);
    shrunk = true;
  }
  hk_unlock(&arena_lock);
  return shrunk;
}

bool hk_arena_contains(const hk_region *r) {
  return hk_arena_slots != 0 && (uintptr_t)((const char *)r - hk_arena_base) < hk_arena_slots * HK_REGION_SIZE;
}

/* Point the table entries of slabs first..first+n-1 of r at page (offset
 * from the base), or at nothing (0). Slabs beyond the table have none. */
void hk_arena_table_set(hk_region *r, unsigned first, unsigned n, const hk_page *page) {
  uintptr_t slab = hk_arena_slab(hk_region_base(r) + (uintptr_t)first * HK_SLAB_SIZE);
  if (slab >= HK_ARENA_SLABS || slab + n > HK_ARENA_SLABS) return;
  uintptr_t v = page ? (uintptr_t)((const char *)page - hk_arena_base) : 0;
  for (unsigned k = 0; k < n; k++) hk_store_relaxed(&hk_page_table()[slab + k], v);
}

bool hk_region_map_prepare(const void *base) {
  uintptr_t idx = (uintptr_t)base >> HK_REGION_SHIFT;
  if (idx >> HK_MAP_BITS) return false; /* above the supported address space */
  _Atomic(_Atomic uint64_t *) *slot = &hk_region_map[idx >> HK_MAP_LEAF_SHIFT];
  if (hk_load_acquire(slot) != NULL) return true;
  hk_lock(&arena_lock);
  if (hk_load_relaxed(slot) == NULL) {
    _Atomic uint64_t *leaf = map_leaves_used < MAP_STATIC_LEAVES
                                 ? map_leaf_pool[map_leaves_used++]
                                 : hk_os_map_aligned(MAP_LEAF_WORDS * sizeof(uint64_t), hk_os_page);
    hk_store_release(slot, leaf);
  }
  hk_unlock(&arena_lock);
  return hk_load_acquire(slot) != NULL;
}

static _Atomic uint64_t *map_word(void *base) {
  uintptr_t idx = (uintptr_t)base >> HK_REGION_SHIFT;
  _Atomic uint64_t *leaf = hk_load_acquire(&hk_region_map[idx >> HK_MAP_LEAF_SHIFT]);
  return leaf + ((idx & (((uintptr_t)1 << HK_MAP_LEAF_SHIFT) - 1)) >> 6);
}

/* (base: a mapping made after hk_region_map_prepare, or moved by mremap,
 * whose new place may need a leaf too) */
void hk_region_register(void *base) {
  if (!hk_region_map_prepare(base)) hk_fatal("out of memory for its map of mappings", base);
  uintptr_t idx = (uintptr_t)base >> HK_REGION_SHIFT;
  atomic_fetch_or_explicit(map_word(base), (uint64_t)1 << (idx & 63), memory_order_release);
}

void hk_region_unregister(void *base) {
  uintptr_t idx = (uintptr_t)base >> HK_REGION_SHIFT;
  atomic_fetch_and_explicit(map_word(base), ~((uint64_t)1 << (idx & 63)), memory_order_release);
}

/* fork: the arena's lock, after the region lists' (region.c) */
void hk_arena_fork_lock(void) { hk_lock(&arena_lock); }
void hk_arena_fork_unlock(void) { hk_unlock(&arena_lock); }
