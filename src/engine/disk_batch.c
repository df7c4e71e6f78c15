/* disk_batch.c - many lm_dcache_get at once (lm_dcache_get_batch).
 *
 * A restore reads thousands of small entries. One after another, each
 * waits for its inode and its data in turn (a disk's latency, not its
 * bandwidth) and each checksum runs on the engine thread alone. Here up to
 * LM_DC_READERS threads take the entries of a batch in turn, so several
 * reads are in flight at once and the checks run on every core. Each entry
 * is one lm_dcache_get: the same checks, counters and deletions. */
#include "disk_internal.h"

#include <pthread.h>
#include <stdatomic.h>

#define LM_DC_READERS 16 /* mostly waiting for the disk: more than the cores */

typedef struct batch {
    lm_disk_cache *dc;
    const lm_dc_read *rd;
    int *rc;
    int n;
    atomic_int next;
} batch;

static void *reader(void *arg) {
    batch *b = arg;
    for (int i; (i = atomic_fetch_add(&b->next, 1)) < b->n;) {
        const lm_dc_read *x = &b->rd[i];
        b->rc[i] = lm_dcache_get(b->dc, x->hash, x->parent, x->kind, x->tokens, x->n_tokens, x->data, x->n);
    }
    return NULL;
}

void lm_dcache_get_batch(lm_disk_cache *dc, const lm_dc_read *rd, int n, int *rc) {
    batch b = { .dc = dc, .rd = rd, .rc = rc, .n = n };
    atomic_init(&b.next, 0);
    pthread_t t[LM_DC_READERS - 1];
    int nt = 0;
    while (nt < LM_MIN(LM_DC_READERS, n) - 1 && pthread_create(&t[nt], NULL, reader, &b) == 0) nt++;
    reader(&b); /* this thread reads too; without helpers (none started) it reads them all */
    for (int i = 0; i < nt; i++) pthread_join(t[i], NULL);
}
