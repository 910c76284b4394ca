/* replay: runs a harness's LLVMFuzzerTestOneInput once on every file of
 * its corpus, tests/fuzz/corpus/FUZZ_NAME (or the files named on the
 * command line), in name order, without libFuzzer: `make test` replays the
 * corpus so that every input once found stays fixed. Deterministic, no
 * mutation. Counts as one test; a failed check aborts. */
#define _POSIX_C_SOURCE 200809L
#include "fuzz.h"

#include <dirent.h>

#ifndef FUZZ_NAME
#define FUZZ_NAME "graph"
#endif

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The corpus files, sorted; NULL-terminated, malloc'd. */
static char **corpus(int *n)
{
    const char *dir = "tests/fuzz/corpus/" FUZZ_NAME;
    DIR *d = opendir(dir);
    char **v = calloc(4096, sizeof *v);
    *n = 0;
    if (!d || !v) {
        fprintf(stderr, "%s: cannot open\n", dir);
        exit(1);
    }
    for (struct dirent *e; (e = readdir(d)) != NULL && *n < 4095;) {
        if (e->d_name[0] == '.') continue;
        v[*n] = malloc(strlen(dir) + strlen(e->d_name) + 2);
        sprintf(v[*n], "%s/%s", dir, e->d_name);
        (*n)++;
    }
    closedir(d);
    qsort(v, (size_t)*n, sizeof *v, cmp_str);
    return v;
}

static void run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    FUZZ_CHECK(f != NULL);
    size_t cap = 1 << 16, len = 0;
    uint8_t *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + len, 1, cap - len, f)) > 0;) {
        len += got;
        if (len == cap) {
            uint8_t *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    fclose(f);
    FUZZ_CHECK(buf != NULL);
    LLVMFuzzerTestOneInput(buf, len);
    free(buf);
}

int main(int argc, char **argv)
{
    int n = argc - 1;
    char **files = argc > 1 ? argv + 1 : corpus(&n);
    for (int i = 0; i < n; i++) run_file(files[i]);
    /* one test: the whole corpus (a failed check has aborted already) */
    printf("fuzz_%s: %d inputs replayed\nfuzz_%s: 1 passed, 0 failed\n", FUZZ_NAME, n, FUZZ_NAME);
    if (argc == 1) {
        for (int i = 0; i < n; i++) free(files[i]);
        free(files);
    }
    return 0;
}
