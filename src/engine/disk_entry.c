/* disk_entry.c - one disk-tier entry as a file: its name, header and
 * checksums, the atomic write and the checked read (disk_internal.h).
 *
 * A file is the header (lm_dc_header) followed by the payload (tokens, then
 * K/V or state bytes). The header carries an XXH3 of itself and of the
 * payload, so a torn write, a truncation or a flipped bit anywhere is seen
 * before anything is served. Files are written as "tmp-<name>" with
 * O_EXCL, fsynced, renamed onto the name and the directory fsynced: a crash
 * at any point leaves the old state or the new one, plus at most a temp
 * file. Byte order is the host's (little-endian on every target lumen
 * builds for). The directory is fsynced by the writer (disk_writer.c) in
 * batches: until then a power loss may lose a renamed entry, never tear it. */
#include "disk_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#define LM_DC_MAGIC 0x4350444cu /* "LDPC" */

_Static_assert(sizeof(lm_dc_header) == 72, "lm_dc_header has no padding");

/* Each op runs on one thread only (writes on the writer, reads on the
 * engine), so its counters need no lock, only atomics for the injector. */
int lm_dc_fault(lm_dc_faults *f, lm_dc_op op) {
    if (!f || atomic_load(&f->times[op]) <= 0) return 0;
    if (atomic_load(&f->skip[op]) > 0) {
        atomic_fetch_sub(&f->skip[op], 1);
        return 0;
    }
    atomic_fetch_sub(&f->times[op], 1);
    return atomic_load(&f->err[op]);
}

void lm_dc_entry_name(char name[LM_DC_NAME_MAX], uint64_t hash, lm_dc_kind kind) {
    snprintf(name, LM_DC_NAME_MAX, "%016llx.%s", (unsigned long long)hash, kind == LM_DC_KV ? "kv" : "st");
}

bool lm_dc_entry_parse(const char *name, uint64_t *hash, lm_dc_kind *kind) {
    if (strlen(name) != 19 || name[16] != '.') return false;
    uint64_t h = 0;
    for (int i = 0; i < 16; i++) {
        char c = name[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return false;
        h = h << 4 | (uint64_t)d;
    }
    if (strcmp(name + 17, "kv") == 0) *kind = LM_DC_KV;
    else if (strcmp(name + 17, "st") == 0) *kind = LM_DC_STATE;
    else return false;
    *hash = h;
    return true;
}

static uint64_t header_sum(const lm_dc_header *h) { return XXH3_64bits(h, offsetof(lm_dc_header, header_xxh3)); }

void lm_dc_blob_make(lm_dc_blob *b, const lm_dc_header *h, const int32_t *tokens, const void *data, size_t n) {
    size_t tb = (size_t)h->n_tokens * sizeof(int32_t);
    b->len = sizeof *h + tb + n;
    b->buf = lm_xmalloc(b->len);
    lm_dc_header *o = (lm_dc_header *)b->buf;
    *o = *h;
    o->magic = LM_DC_MAGIC;
    o->version = LM_DC_VERSION;
    o->payload_bytes = tb + n;
    memcpy(b->buf + sizeof *h, tokens, tb);
    memcpy(b->buf + sizeof *h + tb, data, n);
    o->payload_xxh3 = XXH3_64bits(b->buf + sizeof *h, tb + n);
    o->header_xxh3 = header_sum(o);
}

lm_dc_check lm_dc_header_check(const lm_dc_header *h, const uint64_t ident[2], uint64_t file_bytes) {
    if (h->magic != LM_DC_MAGIC || h->header_xxh3 != header_sum(h)) return LM_DC_CORRUPT;
    if (h->version != LM_DC_VERSION || h->ident[0] != ident[0] || h->ident[1] != ident[1]) return LM_DC_FOREIGN;
    if (file_bytes < sizeof *h || h->payload_bytes != file_bytes - sizeof *h ||
        h->payload_bytes < (uint64_t)h->n_tokens * sizeof(int32_t) || (h->kind != LM_DC_KV && h->kind != LM_DC_STATE))
        return LM_DC_CORRUPT;
    return LM_DC_OK;
}

bool lm_dc_payload_ok(const uint8_t *head, size_t n_head, const void *data, size_t n) {
    const lm_dc_header *h = (const lm_dc_header *)head;
    XXH3_state_t *s = XXH3_createState();
    LM_ASSERT(s);
    XXH3_64bits_reset(s);
    XXH3_64bits_update(s, head + sizeof *h, n_head - sizeof *h);
    XXH3_64bits_update(s, data, n);
    bool ok = h->payload_bytes == n_head - sizeof *h + n && XXH3_64bits_digest(s) == h->payload_xxh3;
    XXH3_freeState(s);
    return ok;
}

/* write(2) of all of buf; an injected fault fails it after half is out, as
 * a full disk would. */
static int write_all(int fd, const uint8_t *buf, size_t n, lm_dc_faults *f) {
    int inj = lm_dc_fault(f, LM_DC_OP_WRITE);
    size_t stop = inj ? n / 2 : n;
    for (size_t done = 0; done < stop;) {
        ssize_t w = write(fd, buf + done, stop - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? errno : EIO;
        done += (size_t)w;
    }
    return inj;
}

int lm_dc_entry_write(int dirfd, const char *name, const lm_dc_blob *b, lm_dc_faults *f) {
    char tmp[LM_DC_NAME_MAX + 8];
    snprintf(tmp, sizeof tmp, LM_DC_TMP_PREFIX "%s", name);
    int fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return errno;
    int err = write_all(fd, b->buf, b->len, f);
    if (!err && (err = lm_dc_fault(f, LM_DC_OP_FSYNC)) == 0 && fsync(fd) != 0) err = errno;
    if (close(fd) != 0 && !err) err = errno;
    if (!err && (err = lm_dc_fault(f, LM_DC_OP_RENAME)) == 0 && renameat(dirfd, tmp, dirfd, name) != 0) err = errno;
    if (err) {
        unlinkat(dirfd, tmp, 0);
        return err;
    }
    return 0;
}

int lm_dc_entry_read(int dirfd, const char *name, uint8_t *head, size_t n_head, void *data, size_t n,
                     lm_dc_faults *f) {
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    int err = lm_dc_fault(f, LM_DC_OP_READ);
    struct stat sb;
    if (!err && fstat(fd, &sb) != 0) err = errno;
    if (!err && (uint64_t)sb.st_size != n_head + n) err = EBADMSG;
    struct iovec iov[2] = { { head, n_head }, { data, n } };
    int i = 0;
    for (size_t left = n_head + n; !err && left > 0;) {
        ssize_t r = readv(fd, iov + i, 2 - i);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            err = r < 0 ? errno : EBADMSG;
            break;
        }
        left -= (size_t)r;
        for (size_t got = (size_t)r; got > 0;) { /* a short read: resume where it stopped */
            size_t take = LM_MIN(got, iov[i].iov_len);
            iov[i].iov_base = (uint8_t *)iov[i].iov_base + take;
            iov[i].iov_len -= take;
            got -= take;
            if (iov[i].iov_len == 0) i++;
        }
    }
    /* a read makes the file recent: the index rebuilt at the next start
     * orders the LRU by modification time (best effort: a read-only
     * directory still serves) */
    if (!err && futimens(fd, NULL) != 0) {}
    close(fd);
    return err;
}
