/* disk_internal.h - what the disk tier's files share (lm_disk_cache.h is
 * the interface): the entry format (disk_entry.c), the fault hooks, and
 * the writer thread (disk_writer.c). */
#ifndef LM_DISK_INTERNAL_H
#define LM_DISK_INTERNAL_H

#include <stdatomic.h>

#include "lm_disk_cache.h"

/* ---- faults ---- */

typedef struct lm_dc_faults {
    atomic_int skip[LM_DC_OP_N], times[LM_DC_OP_N], err[LM_DC_OP_N];
} lm_dc_faults;

/* The errno an injected fault gives this call of op, or 0. */
int lm_dc_fault(lm_dc_faults *f, lm_dc_op op);

/* ---- entry files (disk_entry.c) ---- */

/* At the start of every file; little-endian, no padding. */
typedef struct lm_dc_header {
    uint32_t magic, version;
    uint32_t kind, n_tokens;
    uint64_t ident[2];       /* model identity */
    uint64_t hash, parent;   /* chain hash of the prefix the entry ends, and of its parent */
    uint64_t payload_bytes;  /* after the header: n_tokens int32 tokens, then the data */
    uint64_t payload_xxh3;
    uint64_t header_xxh3;    /* over the fields above */
} lm_dc_header;

#define LM_DC_NAME_MAX 32
/* "<16 hex digits>.kv" or ".st". */
void lm_dc_entry_name(char name[LM_DC_NAME_MAX], uint64_t hash, lm_dc_kind kind);
/* Parses such a name; false for any other. */
bool lm_dc_entry_parse(const char *name, uint64_t *hash, lm_dc_kind *kind);
/* Temp files start with this; a leftover one is a write a crash cut short. */
#define LM_DC_TMP_PREFIX "tmp-"

/* A whole file in memory: header then payload; checksums filled in. */
typedef struct lm_dc_blob {
    uint8_t *buf;
    size_t len;
} lm_dc_blob;
void lm_dc_blob_make(lm_dc_blob *b, const lm_dc_header *h, const int32_t *tokens, const void *data, size_t n);

/* How a header compares with what this process expects. */
typedef enum lm_dc_check { LM_DC_OK, LM_DC_CORRUPT, LM_DC_FOREIGN } lm_dc_check;
lm_dc_check lm_dc_header_check(const lm_dc_header *h, const uint64_t ident[2], uint64_t file_bytes);

/* Writes blob as dirfd/name atomically (temp, fsync, rename; the caller
 * fsyncs the directory). 0, or an errno with no file left behind. */
int lm_dc_entry_write(int dirfd, const char *name, const lm_dc_blob *b, lm_dc_faults *f);
/* Reads dirfd/name, which must be head + n bytes long, into head (header
 * and tokens) and data (straight into the caller's buffer: no copy). 0, or
 * an errno (EIO and friends; EBADMSG when the size is wrong). */
int lm_dc_entry_read(int dirfd, const char *name, uint8_t *head, size_t n_head, void *data, size_t n,
                     lm_dc_faults *f);
/* Whether the payload read that way matches the header's checksum. */
bool lm_dc_payload_ok(const uint8_t *head, size_t n_head, const void *data, size_t n);

/* ---- the writer (disk_writer.c) ---- */

typedef struct lm_dc_job {
    uint64_t hash;
    lm_dc_kind kind;
    lm_dc_blob blob;         /* buf NULL: a touch - only the file's time is set, done is not called */
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
