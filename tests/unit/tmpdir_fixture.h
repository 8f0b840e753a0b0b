/* tmpdir_fixture.h: a fresh temporary directory for each CMocka test, removed
 * with the files in it afterwards (one level deep: tests write flat files). */
#ifndef TANDEM_TESTS_TMPDIR_FIXTURE_H
#define TANDEM_TESTS_TMPDIR_FIXTURE_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct tmpdir_fixture {
    char dir[64];
};

/* CMocka setup body: *state becomes a struct tmpdir_fixture whose dir is a
 * new /tmp/<prefix>_XXXXXX. */
static inline int tmpdir_fixture_setup(void **state, const char *prefix)
{
    struct tmpdir_fixture *f = calloc(1, sizeof(*f));
    if (!f)
        return -1;
    snprintf(f->dir, sizeof(f->dir), "/tmp/%s_XXXXXX", prefix);
    if (!mkdtemp(f->dir)) {
        free(f);
        return -1;
    }
    *state = f;
    return 0;
}

static inline int tmpdir_fixture_teardown(void **state)
{
    struct tmpdir_fixture *f = *state;
    DIR *d = opendir(f->dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char p[512];
            snprintf(p, sizeof(p), "%s/%s", f->dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(f->dir);
    free(f);
    return 0;
}

#endif
