/* Error reports: one line on stderr naming hakmem, the error and the
 * address, then abort() so crash handlers and core dumps still work.
 * Formatting is done by hand: printf may allocate. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

size_t hk_fmt_hex(char *buf, uintptr_t v) {
  char tmp[2 * sizeof v];
  size_t n = 0;
  do { tmp[n++] = "0123456789abcdef"[v & 15]; v >>= 4; } while (v);
  buf[0] = '0'; buf[1] = 'x';
  for (size_t i = 0; i < n; i++) buf[2 + i] = tmp[n - 1 - i];
  return n + 2;
}

size_t hk_fmt_dec(char *buf, uint64_t v) {
  char tmp[24];
  size_t n = 0;
  do { tmp[n++] = (char)('0' + v % 10); v /= 10; } while (v);
  for (size_t i = 0; i < n; i++) buf[i] = tmp[n - 1 - i];
  return n;
}

/* The byte ch inside a JSON string: itself, a backslash escape, or \u00XX
 * for control characters and bytes above ASCII (a program's name can hold
 * any). Returns the bytes written to buf (at most 6). */
size_t hk_fmt_json_char(char *buf, unsigned char ch) {
  static const char hex[] = "0123456789abcdef";
  if (ch == '"' || ch == '\\') {
    buf[0] = '\\';
    buf[1] = (char)ch;
    return 2;
  }
  if (ch < 0x20 || ch >= 0x7f) {
    memcpy(buf, "\\u00", 4);
    buf[4] = hex[ch >> 4];
    buf[5] = hex[ch & 15];
    return 6;
  }
  buf[0] = (char)ch;
  return 1;
}

/* "hakmem: error: <who>: <what> (address 0x...)" then abort(). */
void hk_fatal_in(const char *who, const char *what, const void *p) {
  char line[320];
  size_t n = 0;
  static const char prefix[] = "hakmem: error: ";
  memcpy(line, prefix, sizeof prefix - 1);
  n += sizeof prefix - 1;
  const char *parts[2] = {who, what};
  for (int i = 0; i < 2; i++) {
    if (parts[i] == NULL) continue;
    size_t len = strlen(parts[i]);
    if (len > 140) len = 140;
    memcpy(line + n, parts[i], len);
    n += len;
    if (i == 0) { line[n++] = ' '; line[n++] = 'o'; line[n++] = 'f'; line[n++] = ' '; }
  }
  if (p != NULL) {
    memcpy(line + n, " (address ", 10);
    n += 10;
    n += hk_fmt_hex(line + n, (uintptr_t)p);
    line[n++] = ')';
  }
  line[n++] = '\n';
  hk_os_write_stderr(line, n);
  abort();
}

void hk_fatal(const char *what, const void *p) { hk_fatal_in(NULL, what, p); }

/* hk_cache_next's report: out of line, so the check adds no call setup to
 * the paths it guards. */
void hk_cache_corrupted(const hk_block *b) {
  hk_fatal("free list corrupted (a freed block's link in the thread's cache was overwritten)", b);
}

/* A file name from a pattern: each %p replaced by the pid, then suffix
 * added (false: it does not fit in size). */
bool hk_fmt_path(char *name, size_t size, const char *pattern, const char *suffix) {
  char d[24];
  size_t dn = hk_fmt_dec(d, (uint64_t)hk_os_pid()), n = 0;
  for (const char *s = pattern; *s; s++) {
    if (s[0] == '%' && s[1] == 'p') {
      if (n + dn >= size) return false;
      memcpy(name + n, d, dn);
      n += dn;
      s++;
    } else {
      if (n + 1 >= size) return false;
      name[n++] = *s;
    }
  }
  size_t sn = strlen(suffix);
  if (n + sn >= size) return false;
  memcpy(name + n, suffix, sn + 1);
  return true;
}
