/* disk_internal.h - what the disk tier's files share (lm_disk_cache.h is
 * the interface): the pack file format (disk_entry.c), the fault hooks,
 * and the writer thread (disk_writer.c). */
#ifndef LM_DISK_INTERNAL_H
#define LM_DISK_INTERNAL_H

#include <stdatomic.h>
#include <sys/uio.h>

#include "lm_disk_cache.h"

/* ---- faults ---- */

typedef struct lm_dc_faults {
    atomic_int skip[LM_DC_OP_N], times[LM_DC_OP_N], err[LM_DC_OP_N];
} lm_dc_faults;

/* The errno an injected fault gives this call of op, or 0. */
int lm_dc_fault(lm_dc_faults *f, lm_dc_op op);

/* ---- pack files (disk_entry.c) ---- */

/* A pack file holds entries written together (a chain's blocks, in chain
 * order): this header, n_entries records, then the entries' payloads (each
 * n_tokens int32 tokens, then the data) in record order. Little-endian, no
 * padding. */
typedef struct lm_dc_pack_header {
    uint32_t magic, version;
    uint32_t n_entries, reserved;
    uint64_t ident[2];       /* model identity */
    uint64_t table_xxh3;     /* over the records */
    uint64_t header_xxh3;    /* over the fields above */
} lm_dc_pack_header;

typedef struct lm_dc_record {
    uint64_t hash, parent;   /* chain hash of the prefix the entry ends, and of its parent */
    uint64_t offset, bytes;  /* where its payload lies in the file */
    uint64_t payload_xxh3;
    uint32_t kind, n_tokens;
} lm_dc_record;

#define LM_DC_PACK_MAX (1u << 20) /* entries a pack may hold: a larger count is a corrupt header */

/* Bytes before the first payload of a pack of n entries. */
static inline size_t lm_dc_head_bytes(int n) {
    return sizeof(lm_dc_pack_header) + (size_t)n * sizeof(lm_dc_record);
}

#define LM_DC_NAME_MAX 32
/* "<16 hex digits>.pk", the pack's number. */
void lm_dc_pack_name(char name[LM_DC_NAME_MAX], uint64_t id);
/* Parses such a name; false for any other. */
bool lm_dc_pack_parse(const char *name, uint64_t *id);
/* Whether name is a file of format version 1 (one entry a file,
 * "<16 hex digits>.kv" or ".st"). */
bool lm_dc_v1_name(const char *name);
/* Temp files start with this; a leftover one is a write a crash cut short. */
#define LM_DC_TMP_PREFIX "tmp-"

/* A whole pack file in memory: head (header and records), then body (the
 * payloads). */
typedef struct lm_dc_blob {
    uint8_t *head, *body;
    size_t head_len, body_len;
} lm_dc_blob;
/* Allocates and fills b->head for rec[0, n), whose offsets are relative to
 * the body on entry and absolute (in the file) on return. */
void lm_dc_pack_seal(lm_dc_blob *b, const uint64_t ident[2], lm_dc_record *rec, int n);

/* How a pack's header compares with what this process expects. */
typedef enum lm_dc_check { LM_DC_OK, LM_DC_CORRUPT, LM_DC_FOREIGN } lm_dc_check;
lm_dc_check lm_dc_header_check(const lm_dc_pack_header *h, const uint64_t ident[2], uint64_t file_bytes);
/* Whether the records match the header's checksum. */
bool lm_dc_table_ok(const lm_dc_pack_header *h, const lm_dc_record *rec);
/* Whether record r (following the one ending at prev_end) is well formed. */
bool lm_dc_record_ok(const lm_dc_record *r, uint64_t prev_end);

/* Writes blob as dirfd/name atomically (temp, fsync, rename; the caller
 * fsyncs the directory). 0, or an errno with no file left behind. */
int lm_dc_pack_write(int dirfd, const char *name, const lm_dc_blob *b, lm_dc_faults *f);
/* Reads pack id's bytes from off into the n_iov buffers, and refreshes its
 * file time (the LRU order a restart reads). 0, or an errno (ENOENT: no
 * such pack; EBADMSG: the file ends first). */
int lm_dc_pack_read(int dirfd, uint64_t id, uint64_t off, struct iovec *iov, int n_iov, lm_dc_faults *f);

/* ---- the writer (disk_writer.c) ---- */

typedef struct lm_dc_job {
    uint64_t pack;           /* its number */
    int32_t slot;            /* the index's own (disk_cache.c) */
    lm_dc_blob blob;         /* head NULL: a touch - only the file's time is set, done is not called */
} lm_dc_job;

typedef struct lm_dc_writer lm_dc_writer;
/* done(user, job, err) runs on the writer thread after each write (err 0:
 * the file is in place), before the job's blob is freed. */
typedef void (*lm_dc_done_fn)(void *user, const lm_dc_job *job, int err);
lm_dc_writer *lm_dc_writer_create(int dirfd, int max_jobs, size_t max_bytes, lm_dc_faults *f, lm_dc_done_fn done,
                                  void *user);
/* Takes job (its blob) when there is room; false (job untouched) when full. */
bool lm_dc_writer_push(lm_dc_writer *w, lm_dc_job *job);
void lm_dc_writer_flush(lm_dc_writer *w);
/* Writes what is queued, then stops. */
void lm_dc_writer_free(lm_dc_writer *w);

#endif
