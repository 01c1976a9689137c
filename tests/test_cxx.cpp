// test_cxx: every replaceable operator new/delete variant through hakmem,
// allocation failure (std::bad_alloc, nothrow -> nullptr, new_handler), and
// an ordinary STL workload. Linked with the override library (hakmem).
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "hakmem.h"

#define CHECK(cond, ...)                                                        \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "%s:%d: CHECK FAILED: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                        \
      std::fputc('\n', stderr);                                                 \
      std::_Exit(1);                                                            \
    }                                                                           \
  } while (0)

static void *launder(void *p) {
  __asm__ volatile("" : "+r"(p) : : "memory");
  return p;
}
static std::size_t opaque(std::size_t x) {
  __asm__ volatile("" : "+r"(x));
  return x;
}

static void check_block(void *p, std::size_t n, std::size_t align, const char *what) {
  CHECK(p != nullptr, "%s(%zu) returned nullptr", what, n);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % align == 0, "%s(%zu) = %p not %zu-aligned", what, n, p, align);
  // the pointer must be one hakmem knows (malloc_usable_size is hakmem's)
  std::size_t u = malloc_usable_size(p);
  CHECK(u >= n, "%s(%zu) = %p: malloc_usable_size %zu < %zu", what, n, p, u, n);
  unsigned char *c = static_cast<unsigned char *>(launder(p));
  for (std::size_t i = 0; i < n; i++) c[i] = static_cast<unsigned char>(i * 13 + n);
  for (std::size_t i = 0; i < n; i++)
    CHECK(c[i] == static_cast<unsigned char>(i * 13 + n), "%s(%zu): byte %zu not retained", what, n, i);
}

static const std::size_t kSizes[] = {0, 1, 8, 24, 100, 128, 129, 1000, 4096, 70000, 1u << 20, (1u << 20) + 1,
                                     3u << 20};

// __STDCPP_DEFAULT_NEW_ALIGNMENT__ (16 on x86-64 and aarch64): clang marks
// operator new's result as aligned to it and zeroes a new 40-byte object
// with 16-byte aligned SSE stores, which fault on an 8-aligned block.
static std::size_t new_align(std::size_t n) { return n > 8 ? __STDCPP_DEFAULT_NEW_ALIGNMENT__ : 8; }

struct Node40 {  // 40 bytes: the shape of clang's own crash
  void *a, *b, *c, *d, *e;
};

static void test_default_alignment() {
  // many live at once, so that blocks at every slot of a page are seen
  static void *live[4096];
  for (std::size_t n = 1; n <= 1024; n++) {
    for (std::size_t i = 0; i < 64; i++) {
      live[i] = ::operator new(n);
      check_block(live[i], n, new_align(n), "operator new");
    }
    for (std::size_t i = 0; i < 64; i++) ::operator delete(live[i], n);
  }
  for (std::size_t i = 0; i < 4096; i++) {
    Node40 *p = new Node40();
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 16 == 0 && p->a == nullptr && p->e == nullptr, "new Node40() = %p",
          static_cast<void *>(p));
    live[i] = p;
  }
  for (std::size_t i = 0; i < 4096; i++) delete static_cast<Node40 *>(live[i]);
}

static void test_plain() {
  for (std::size_t n : kSizes) {
    void *p = ::operator new(n);
    check_block(p, n, new_align(n), "operator new");
    ::operator delete(p);
    p = ::operator new(n);
    check_block(p, n, new_align(n), "operator new");
    ::operator delete(p, n);  // sized
    p = ::operator new[](n);
    check_block(p, n, new_align(n), "operator new[]");
    ::operator delete[](p);
    p = ::operator new[](n);
    check_block(p, n, new_align(n), "operator new[]");
    ::operator delete[](p, n);  // sized
    p = ::operator new(n, std::nothrow);
    check_block(p, n, new_align(n), "operator new(nothrow)");
    ::operator delete(p, std::nothrow);
    p = ::operator new[](n, std::nothrow);
    check_block(p, n, new_align(n), "operator new[](nothrow)");
    ::operator delete[](p, std::nothrow);
  }
  // new(0) returns distinct pointers
  void *a = ::operator new(opaque(0)), *b = ::operator new(opaque(0));
  CHECK(a != nullptr && b != nullptr && a != b, "operator new(0) returned %p and %p", a, b);
  ::operator delete(a);
  ::operator delete(b);
  // delete of nullptr, all forms
  ::operator delete(nullptr);
  ::operator delete[](nullptr);
  ::operator delete(nullptr, std::align_val_t(64));
}

static void test_aligned() {
  const std::size_t aligns[] = {16, 32, 64, 256, 4096, 65536, 1u << 20, 2u << 20};
  for (std::size_t al : aligns) {
    std::align_val_t a{al};
    for (std::size_t n : kSizes) {
      void *p = ::operator new(n, a);
      check_block(p, n, al, "operator new(align)");
      ::operator delete(p, a);
      p = ::operator new(n, a);
      check_block(p, n, al, "operator new(align)");
      ::operator delete(p, n, a);  // sized + aligned
      p = ::operator new[](n, a);
      check_block(p, n, al, "operator new[](align)");
      ::operator delete[](p, a);
      p = ::operator new[](n, a);
      check_block(p, n, al, "operator new[](align)");
      ::operator delete[](p, n, a);
      p = ::operator new(n, a, std::nothrow);
      check_block(p, n, al, "operator new(align, nothrow)");
      ::operator delete(p, a, std::nothrow);
      p = ::operator new[](n, a, std::nothrow);
      check_block(p, n, al, "operator new[](align, nothrow)");
      ::operator delete[](p, a, std::nothrow);
    }
  }
}

struct alignas(64) A64 {
  unsigned char b[100];
};
struct alignas(4096) A4096 {
  unsigned char b[5000];
};

static void test_expressions() {
  int *i = new int(42);
  CHECK(*i == 42 && reinterpret_cast<std::uintptr_t>(i) % alignof(int) == 0, "new int");
  delete i;
  int *arr = new int[1000]();
  for (int k = 0; k < 1000; k++) CHECK(arr[k] == 0, "new int[1000]() not zero-initialised");
  delete[] arr;
  A64 *a = new A64;
  CHECK(reinterpret_cast<std::uintptr_t>(a) % 64 == 0, "new A64 = %p not 64-aligned", static_cast<void *>(a));
  std::memset(a->b, 1, sizeof a->b);
  delete a;
  A64 *aa = new A64[7];
  CHECK(reinterpret_cast<std::uintptr_t>(aa) % 64 == 0, "new A64[7] = %p not 64-aligned", static_cast<void *>(aa));
  std::memset(aa, 2, sizeof(A64) * 7);
  delete[] aa;
  A4096 *b = new A4096;
  CHECK(reinterpret_cast<std::uintptr_t>(b) % 4096 == 0, "new A4096 = %p not 4096-aligned", static_cast<void *>(b));
  std::memset(b->b, 3, sizeof b->b);
  delete b;
  A4096 *bb = new A4096[3];
  CHECK(reinterpret_cast<std::uintptr_t>(bb) % 4096 == 0, "new A4096[3] not 4096-aligned");
  std::memset(bb, 4, sizeof(A4096) * 3);
  delete[] bb;
  A4096 *bn = new (std::nothrow) A4096;
  CHECK(bn != nullptr && reinterpret_cast<std::uintptr_t>(bn) % 4096 == 0, "new (nothrow) A4096");
  delete bn;
  A64 *an = new (std::nothrow) A64[5];
  CHECK(an != nullptr && reinterpret_cast<std::uintptr_t>(an) % 64 == 0, "new (nothrow) A64[5]");
  delete[] an;
}

static void test_failure() {
  volatile std::size_t huge = SIZE_MAX / 2;
  bool caught = false;
  try {
    char *c = new char[huge];
    c[0] = 1;
    std::fprintf(stderr, "new char[SIZE_MAX/2] returned %p\n", static_cast<void *>(c));
    delete[] c;
  } catch (const std::bad_alloc &) {
    caught = true;
  }
  CHECK(caught, "new char[SIZE_MAX/2] did not throw std::bad_alloc");

  caught = false;
  try {
    void *p = ::operator new(opaque(SIZE_MAX));
    ::operator delete(p);
  } catch (const std::bad_alloc &) {
    caught = true;
  }
  CHECK(caught, "operator new(SIZE_MAX) did not throw std::bad_alloc");

  caught = false;
  try {
    void *p = ::operator new[](opaque(SIZE_MAX - 4096), std::align_val_t(4096));
    ::operator delete[](p, std::align_val_t(4096));
  } catch (const std::bad_alloc &) {
    caught = true;
  }
  CHECK(caught, "operator new[](SIZE_MAX-4096, align 4096) did not throw std::bad_alloc");

  char *n = new (std::nothrow) char[huge];
  CHECK(n == nullptr, "new (nothrow) char[SIZE_MAX/2] = %p, expected nullptr", static_cast<void *>(n));
  void *q = ::operator new(opaque(SIZE_MAX), std::nothrow);
  CHECK(q == nullptr, "operator new(SIZE_MAX, nothrow) = %p, expected nullptr", q);
  q = ::operator new[](opaque(SIZE_MAX / 2), std::align_val_t(64), std::nothrow);
  CHECK(q == nullptr, "operator new[](SIZE_MAX/2, align 64, nothrow) = %p, expected nullptr", q);
  q = ::operator new(opaque(SIZE_MAX / 2), std::align_val_t(1u << 20), std::nothrow);
  CHECK(q == nullptr, "operator new(SIZE_MAX/2, align 1 MiB, nothrow) = %p, expected nullptr", q);

  // the new_handler is called on failure; here it gives up by throwing
  static int handler_calls;
  handler_calls = 0;
  std::set_new_handler([] {
    handler_calls++;
    std::set_new_handler(nullptr);  // next failure: throw bad_alloc
  });
  caught = false;
  try {
    void *p = ::operator new(opaque(SIZE_MAX / 2));
    ::operator delete(p);
  } catch (const std::bad_alloc &) {
    caught = true;
  }
  CHECK(caught, "operator new(SIZE_MAX/2) with a new_handler did not throw");
  CHECK(handler_calls == 1, "new_handler was called %d times, expected 1", handler_calls);
  std::set_new_handler(nullptr);

  // nothrow new with a throwing new_handler: nullptr, no exception
  handler_calls = 0;
  std::set_new_handler([] {
    handler_calls++;
    throw std::bad_alloc();
  });
  void *r = ::operator new(opaque(SIZE_MAX / 2), std::nothrow);
  CHECK(r == nullptr, "operator new(nothrow) with a throwing new_handler = %p", r);
  CHECK(handler_calls == 1, "new_handler (nothrow) was called %d times, expected 1", handler_calls);
  std::set_new_handler(nullptr);

  // still works after failures
  std::string s(100000, 'x');
  CHECK(s.size() == 100000 && s[99999] == 'x', "std::string after failures");
}

static void test_workload() {
  std::vector<std::string> v;
  for (int i = 0; i < 100000; i++) v.push_back("item-" + std::to_string(i * 7919 % 100003) + std::string(i % 50, 'z'));
  std::sort(v.begin(), v.end());
  CHECK(std::is_sorted(v.begin(), v.end()), "sort");
  std::map<std::string, int> m;
  for (std::size_t i = 0; i < v.size(); i++) m[v[i]] += static_cast<int>(i % 13);
  std::unordered_map<int, std::vector<int>> um;
  for (int i = 0; i < 50000; i++) um[i % 997].push_back(i);
  long sum = 0;
  for (auto &kv : um)
    for (int x : kv.second) sum += x;
  CHECK(sum == 50000L * 49999L / 2, "unordered_map sum %ld", sum);
  std::size_t total = 0;
  for (auto &kv : m) total += kv.first.size();
  CHECK(total > 100000, "map contents");
  v.clear();
  v.shrink_to_fit();
  // grow a vector through every tier
  std::vector<std::uint64_t> big;
  for (std::uint64_t i = 0; i < (3u << 20); i++) big.push_back(i * 3);
  for (std::uint64_t i = 0; i < big.size(); i += 4097) CHECK(big[i] == i * 3, "vector contents at %llu",
                                                             static_cast<unsigned long long>(i));
  // cross-thread deletes
  std::vector<std::string *> handoff;
  for (int i = 0; i < 20000; i++) handoff.push_back(new std::string(static_cast<std::size_t>(i % 300), 'q'));
  std::thread t([&handoff] {
    for (std::size_t i = 0; i < handoff.size(); i++) {
      CHECK(handoff[i]->size() == i % 300, "string handed to a thread corrupted");
      delete handoff[i];
    }
  });
  t.join();
  std::atomic<long> made{0};
  std::vector<std::thread> ts;
  for (int k = 0; k < 4; k++)
    ts.emplace_back([&made] {
      std::map<int, std::string> local;
      for (int i = 0; i < 20000; i++) local[i] = std::to_string(i);
      made += static_cast<long>(local.size());
    });
  for (auto &th : ts) th.join();
  CHECK(made == 80000, "threads made %ld entries", made.load());
}

int main() {
  std::printf("test_cxx (hakmem %s)\n", hak_version());
  test_plain();
  test_default_alignment();
  test_aligned();
  test_expressions();
  test_failure();
  test_workload();
  std::printf("test_cxx: all passed\n");
  return 0;
}
