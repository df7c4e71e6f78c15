/* lm_disk_cache.h - the prefix cache's disk tier: KV blocks and recurrent-
 * state checkpoints kept as files in one directory, so that they survive a
 * restart or a crash.
 *
 * An entry is named by the chain hash of the prefix it ends
 * (lm_prefix_cache.h) and its kind: a block's tokens and its K/V in the
 * cache's own formats (KV), or the recurrent state of a hybrid model at
 * that block's end (STATE). Entries of a kind written together - the puts
 * between lm_dcache_batch_begin and _end, a chain's blocks in chain order -
 * share one file, a pack "<number>.pk": a header (magic, version, model
 * identity), a table of the entries (hash, parent hash, kind, token count,
 * where the payload lies, its checksum; all checksummed), then the
 * payloads (disk_entry.c). A restore reads a pack's run of entries with
 * one large read; every entry is checked on every read: one that is torn,
 * corrupt, of another model or format version, or unreadable is never
 * served - it is counted, logged, dropped, and the prefix is computed
 * again.
 *
 * Writes go through a writer thread with a bounded queue (disk_writer.c):
 * lm_dcache_put copies the entry and returns; when the queue is full the
 * pack is dropped (counted), the caller never waits. A pack appears
 * atomically (temp file, fsync, rename, directory fsync), so a crash leaves
 * either the whole pack or a temp file, which the next start deletes.
 *
 * The index (disk_cache.c) is rebuilt from the directory at start (headers
 * and tables read, not payloads) and kept in LRU order by entry (at start,
 * by pack file time, which a write or a read refreshes); entries go, least
 * recently used first, when the bytes pass the budget: the end of a pack
 * by truncating its file, a whole pack by deleting it. It knows each
 * entry's parent, so the blocks continuing a prefix can be listed (a hit
 * ending inside a block). One process owns a directory: a lock file
 * (flock) refuses a second one with a clear error.
 *
 * Thread safety: every function may be called from any thread. */
#ifndef LM_DISK_CACHE_H
#define LM_DISK_CACHE_H

#include "../base/lm_base.h"

/* Bump when the file layout changes: packs of another version read as
 * foreign and are left alone; version 1's one-entry files ("<hash>.kv",
 * ".st") are deleted at start (no reader of theirs is left, and they would
 * sit outside the budget). */
#define LM_DC_VERSION 2

typedef enum lm_dc_kind { LM_DC_KV = 1, LM_DC_STATE = 2 } lm_dc_kind;

typedef struct lm_disk_cache lm_disk_cache;

/* Opens (creating it if needed) and locks dir, deletes leftover temp files,
 * rebuilds the index of entries of model identity ident (others are counted
 * and left alone), evicts down to budget, starts the writer. With e naming
 * the directory and the reason: -1 when the directory cannot be used (not a
 * directory, unreadable, ...), LM_DC_REFUSED when another process holds it
 * (or the fault spec is malformed): a server must not start then. */
int lm_dcache_open(lm_disk_cache **out, const char *dir, size_t budget, const uint64_t ident[2], lm_err *e);
#define LM_DC_REFUSED (-2)
/* The same with faults injected from the start (lm_dcache_inject_spec; NULL
 * or "" for none): a test's way into a server process (LUMEN_DISK_FAULTS). */
int lm_dcache_open_with_faults(lm_disk_cache **out, const char *dir, size_t budget, const uint64_t ident[2],
                               const char *faults, lm_err *e);
/* Writes what is queued, stops the writer, unlocks. */
void lm_dcache_close(lm_disk_cache *dc);

/* Whether the entry is on disk or queued to be. */
bool lm_dcache_has(lm_disk_cache *dc, uint64_t hash, lm_dc_kind kind);
/* Whether the entry is on disk (readable by lm_dcache_get). */
bool lm_dcache_ready(lm_disk_cache *dc, uint64_t hash, lm_dc_kind kind);

/* Makes the entry (if indexed) the most recently used; and, at most once a
 * minute per entry, has the writer set its file's time, so that the order
 * survives a restart for entries used from RAM only. */
void lm_dcache_touch(lm_disk_cache *dc, uint64_t hash, lm_dc_kind kind);
/* Tests: how often a touch may set an entry's file time (default 60 s). */
void lm_dcache_set_touch_interval(lm_disk_cache *dc, double seconds);

/* Entries put from here to the matching _end go into one pack per kind
 * (several when they pass 8 MiB), handed to the writer at the end; batches
 * nest. A put outside a batch is a pack of its own, queued at once. */
void lm_dcache_batch_begin(lm_disk_cache *dc);
void lm_dcache_batch_end(lm_disk_cache *dc);

/* Queues an entry: n_tokens tokens and n data bytes, both copied. 0: queued
 * (or, in a batch, added to its pack); 1: already on disk or queued (its
 * LRU position refreshed); -1: dropped (the queue is full). */
int lm_dcache_put(lm_disk_cache *dc, uint64_t hash, uint64_t parent, lm_dc_kind kind, const int32_t *tokens,
                  int n_tokens, const void *data, size_t n);
/* Reads and checks an entry that must be (hash, kind) under parent, for
 * tokens[0, n_tokens), with n data bytes, into data (left undefined on failure). 0 on success (the
 * entry becomes most recently used); -1 when it is absent or fails a check
 * (counted, logged, and the file deleted). */
int lm_dcache_get(lm_disk_cache *dc, uint64_t hash, uint64_t parent, lm_dc_kind kind, const int32_t *tokens,
                  int n_tokens, void *data, size_t n);

/* The hashes of up to max entries of kind on disk whose parent is parent
 * (the blocks that continue a prefix); how many. */
int lm_dcache_children(lm_disk_cache *dc, uint64_t parent, lm_dc_kind kind, uint64_t *out, int max);
/* Reads only the header and tokens of entry (hash, kind), which must be
 * under parent and hold n_tokens tokens, into tokens: what a hit ending
 * inside the block compares with the prompt before the whole entry is read
 * (lm_dcache_get checks the payload then). 0, or -1 when it is absent or
 * fails a check (counted, logged, deleted, as by lm_dcache_get). */
int lm_dcache_peek(lm_disk_cache *dc, uint64_t hash, uint64_t parent, lm_dc_kind kind, int32_t *tokens, int n_tokens);

/* Asks the kernel to start reading the n entries (hash[i], kind) now, all
 * at once (POSIX_FADV_WILLNEED on each pack's run of them), so that the
 * lm_dcache_get calls that follow find them in memory while the first are
 * checked. Absent entries are skipped. */
void lm_dcache_willneed(lm_disk_cache *dc, const uint64_t *hash, int n, lm_dc_kind kind);

/* Waits until the writer has handled every queued entry (tests, shutdown). */
void lm_dcache_flush(lm_disk_cache *dc);

typedef struct lm_dc_stats {
    int entries;            /* on disk, of this model */
    size_t bytes, budget;
    uint64_t writes;        /* entries written */
    uint64_t dropped;       /* entries dropped: the writer's queue was full */
    uint64_t write_errors;  /* entries of packs whose write failed (ENOSPC, EIO, ...): nothing left behind */
    uint64_t reads;         /* entries read and verified */
    uint64_t read_errors;   /* reads that failed (EIO, vanished file) */
    uint64_t corrupt;       /* torn, truncated or bit-flipped entries found (at start or on read) */
    uint64_t foreign;       /* entries of another model, KV format or version, left alone */
    uint64_t evicted;       /* entries deleted over the budget */
    uint64_t temp_cleaned;  /* leftover temp files of interrupted writes deleted at start */
    uint64_t old_format;    /* files of cache format version 1 deleted at start */
    double open_s;          /* seconds lm_dcache_open took (index rebuild) */
} lm_dc_stats;
void lm_dcache_get_stats(lm_disk_cache *dc, lm_dc_stats *s);

/* Fault injection (tests), as SQLite tests its I/O: after `skip` more
 * successful calls of op, the next `times` calls fail with errno err. The
 * ops: a pack's write(2), its fsync, its rename, a read from a pack (a
 * span for lm_dcache_get, the tokens for lm_dcache_peek; an entry served
 * from the span another read took reads nothing), and the header read of
 * each pack while the index is rebuilt. */
typedef enum lm_dc_op {
    LM_DC_OP_WRITE, LM_DC_OP_FSYNC, LM_DC_OP_RENAME, LM_DC_OP_READ, LM_DC_OP_SCAN, LM_DC_OP_N
} lm_dc_op;
void lm_dcache_inject(lm_disk_cache *dc, lm_dc_op op, int err, int skip, int times);
/* The same from text: "OP:ERR[:SKIP[:TIMES]]", comma-separated, OP one of
 * write fsync rename read scan, ERR a name (ENOSPC EIO EACCES EROFS EDQUOT
 * ENOENT) or a number; TIMES defaults to every call. -1 with e on a
 * malformed spec. */
int lm_dcache_inject_spec(lm_disk_cache *dc, const char *spec, lm_err *e);

#endif
