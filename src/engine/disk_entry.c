/* disk_entry.c - the disk tier's pack files: names, header, records and
 * checksums, the atomic write and the checked read (disk_internal.h).
 *
 * A pack is a header (lm_dc_pack_header), a table of records (one per
 * entry: hash, parent, kind, tokens, where its payload lies, the payload's
 * XXH3), then the payloads back to back. The header carries an XXH3 of
 * itself and of the table, each record one of its payload: a torn write,
 * a truncation or a flipped bit anywhere is seen before anything is
 * served, and a bad payload costs only its own entry. Packs are written as
 * "tmp-<name>", fsynced, renamed onto the name and the directory fsynced:
 * a crash at any point leaves the old state or the new one, plus at most a
 * temp file. Byte order is the host's (little-endian on every target lumen
 * builds for). The directory is fsynced by the writer (disk_writer.c) in
 * batches: until then a power loss may lose a renamed pack, never tear it. */
#include "disk_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define LM_DC_MAGIC 0x4b50444cu /* "LDPK" */

_Static_assert(sizeof(lm_dc_pack_header) == 48, "lm_dc_pack_header has no padding");
_Static_assert(sizeof(lm_dc_record) == 48, "lm_dc_record has no padding");

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

void lm_dc_pack_name(char name[LM_DC_NAME_MAX], uint64_t id) {
    snprintf(name, LM_DC_NAME_MAX, "%016llx.pk", (unsigned long long)id);
}

/* 16 hex digits then '.' and the suffix: the number, or false. */
static bool parse_hex_name(const char *name, const char *suffix, uint64_t *out) {
    if (strlen(name) != 17 + strlen(suffix) || name[16] != '.' || strcmp(name + 17, suffix) != 0) return false;
    uint64_t h = 0;
    for (int i = 0; i < 16; i++) {
        char c = name[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return false;
        h = h << 4 | (uint64_t)d;
    }
    *out = h;
    return true;
}

bool lm_dc_pack_parse(const char *name, uint64_t *id) { return parse_hex_name(name, "pk", id); }

bool lm_dc_v1_name(const char *name) {
    uint64_t h;
    return parse_hex_name(name, "kv", &h) || parse_hex_name(name, "st", &h);
}

static uint64_t header_sum(const lm_dc_pack_header *h) {
    return XXH3_64bits(h, offsetof(lm_dc_pack_header, header_xxh3));
}

void lm_dc_pack_seal(lm_dc_blob *b, const uint64_t ident[2], lm_dc_record *rec, int n) {
    b->head_len = lm_dc_head_bytes(n);
    b->head = lm_xmalloc(b->head_len);
    for (int i = 0; i < n; i++) rec[i].offset += b->head_len;
    lm_dc_pack_header *h = (lm_dc_pack_header *)b->head;
    *h = (lm_dc_pack_header){ .magic = LM_DC_MAGIC, .version = LM_DC_VERSION, .n_entries = (uint32_t)n,
                              .ident = { ident[0], ident[1] } };
    memcpy(b->head + sizeof *h, rec, (size_t)n * sizeof *rec);
    h->table_xxh3 = XXH3_64bits(rec, (size_t)n * sizeof *rec);
    h->header_xxh3 = header_sum(h);
}

lm_dc_check lm_dc_header_check(const lm_dc_pack_header *h, const uint64_t ident[2], uint64_t file_bytes) {
    if (h->magic != LM_DC_MAGIC || h->header_xxh3 != header_sum(h)) return LM_DC_CORRUPT;
    if (h->version != LM_DC_VERSION || h->ident[0] != ident[0] || h->ident[1] != ident[1]) return LM_DC_FOREIGN;
    if (h->n_entries == 0 || h->n_entries > LM_DC_PACK_MAX || file_bytes < lm_dc_head_bytes((int)h->n_entries))
        return LM_DC_CORRUPT;
    return LM_DC_OK;
}

bool lm_dc_table_ok(const lm_dc_pack_header *h, const lm_dc_record *rec) {
    return XXH3_64bits(rec, (size_t)h->n_entries * sizeof *rec) == h->table_xxh3;
}

bool lm_dc_record_ok(const lm_dc_record *r, uint64_t prev_end) {
    return (r->kind == LM_DC_KV || r->kind == LM_DC_STATE) && r->offset >= prev_end &&
           r->bytes >= (uint64_t)r->n_tokens * sizeof(int32_t) && r->offset + r->bytes > r->offset;
}

/* writev(2) of all of iov; an injected fault fails it after half is out,
 * as a full disk would. */
static int write_all(int fd, const lm_dc_blob *b, lm_dc_faults *f) {
    int inj = lm_dc_fault(f, LM_DC_OP_WRITE);
    size_t total = b->head_len + b->body_len, stop = inj ? total / 2 : total;
    for (size_t done = 0; done < stop;) {
        const uint8_t *p = done < b->head_len ? b->head + done : b->body + (done - b->head_len);
        size_t seg_end = done < b->head_len ? b->head_len : total;
        ssize_t w = write(fd, p, LM_MIN(seg_end, stop) - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? errno : EIO;
        done += (size_t)w;
    }
    return inj;
}

int lm_dc_pack_write(int dirfd, const char *name, const lm_dc_blob *b, lm_dc_faults *f) {
    char tmp[LM_DC_NAME_MAX + 8];
    snprintf(tmp, sizeof tmp, LM_DC_TMP_PREFIX "%s", name);
    int fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return errno;
    int err = write_all(fd, b, f);
    if (!err && (err = lm_dc_fault(f, LM_DC_OP_FSYNC)) == 0 && fsync(fd) != 0) err = errno;
    if (close(fd) != 0 && !err) err = errno;
    if (!err && (err = lm_dc_fault(f, LM_DC_OP_RENAME)) == 0 && renameat(dirfd, tmp, dirfd, name) != 0) err = errno;
    if (err) {
        unlinkat(dirfd, tmp, 0);
        return err;
    }
    return 0;
}

int lm_dc_pack_read(int dirfd, uint64_t id, uint64_t off, struct iovec *iov, int n_iov, lm_dc_faults *f) {
    char name[LM_DC_NAME_MAX];
    lm_dc_pack_name(name, id);
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    int err = lm_dc_fault(f, LM_DC_OP_READ), i = 0;
    size_t left = 0;
    for (int k = 0; k < n_iov; k++) left += iov[k].iov_len;
    while (!err && left > 0) {
        ssize_t r = preadv(fd, iov + i, n_iov - i, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            err = r < 0 ? errno : EBADMSG;
            break;
        }
        left -= (size_t)r;
        off += (uint64_t)r;
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
