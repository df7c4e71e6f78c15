/* file.c - mmap and whole-file helpers. */
#include "lm_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int lm_mmap_open(lm_mmap *m, const char *path, lm_err *e) {
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return lm_errf(e, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return lm_errf(e, "%s: cannot stat: %s", path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return lm_errf(e, "%s: not a regular file", path);
    }
    m->size = (size_t)st.st_size;
    if (m->size > 0) {
        void *p = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int err = errno;
            close(fd);
            return lm_errf(e, "%s: cannot mmap: %s", path, strerror(err));
        }
        m->data = p;
    }
    close(fd);
    m->path = lm_xstrdup(path);
    if (m->data) lm_mmap_guard_add(m->data, m->size, path);
    return 0;
}

void lm_mmap_close(lm_mmap *m) {
    if (m->data) lm_mmap_guard_remove(m->data);
    if (m->data) munmap((void *)m->data, m->size);
    free(m->path);
    memset(m, 0, sizeof *m);
}

char *lm_read_file(const char *path, size_t *len, lm_err *e) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        lm_errf(e, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = lm_xmalloc(cap);
    for (;;) {
        if (n + 1 >= cap) buf = lm_xrealloc(buf, cap *= 2);
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    int bad = ferror(f), err = errno;
    fclose(f);
    if (bad) {
        free(buf);
        lm_errf(e, "%s: cannot read: %s", path, strerror(err));
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

bool lm_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

bool lm_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

char *lm_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    while (a > 1 && dir[a - 1] == '/') a--;
    char *p = lm_xmalloc(a + b + 2);
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}
