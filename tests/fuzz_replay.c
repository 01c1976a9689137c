/* fuzz_replay: runs fuzz_api's LLVMFuzzerTestOneInput once on each input
 * file, without libFuzzer, so any compiler can build the regression test.
 *   fuzz_replay [FILE|DIR ...]   (a directory: every regular file in it, sorted;
 *                                none: the corpus the build names, HKT_FUZZ_CORPUS_DIR,
 *                                as tests/options_matrix.sh runs it)
 * ctest runs it on tests/fuzz_corpus/: every input that ever crashed the
 * fuzzer goes there and is replayed by every build (docs/SAFETY.md). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    perror(path);
    return 1;
  }
  size_t cap = 4096, n = 0;
  uint8_t *buf = malloc(cap);
  size_t got;
  while (buf != NULL && (got = fread(buf + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n == cap) {
      uint8_t *nb = realloc(buf, cap *= 2);
      if (nb == NULL) free(buf);
      buf = nb;
    }
  }
  int err = buf == NULL || ferror(f);
  fclose(f);
  if (err) {
    fprintf(stderr, "%s: read error\n", path);
    free(buf);
    return 1;
  }
  printf("replay %s (%zu bytes)\n", path, n);
  fflush(stdout);
  LLVMFuzzerTestOneInput(buf, n);
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  int failed = 0, count = 0;
#ifdef HKT_FUZZ_CORPUS_DIR
  char *corpus[] = {argv[0], (char *)HKT_FUZZ_CORPUS_DIR, NULL};
  if (argc == 1) {
    argc = 2;
    argv = corpus;
  }
#endif
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      perror(argv[i]);
      return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
      failed |= replay_file(argv[i]);
      count++;
      continue;
    }
    struct dirent **names;
    int n = scandir(argv[i], &names, NULL, alphasort);
    if (n < 0) {
      perror(argv[i]);
      return 1;
    }
    for (int k = 0; k < n; k++) {
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", argv[i], names[k]->d_name);
      if (names[k]->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
        failed |= replay_file(path);
        count++;
      }
      free(names[k]);
    }
    free(names);
  }
  printf("fuzz_replay: %d inputs, %s\n", count, failed ? "errors" : "all passed");
  return failed || count == 0;
}
