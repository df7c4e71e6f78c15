/* disk_writer.c - the disk tier's writer thread (disk_internal.h).
 *
 * A ring of at most max_jobs packs holding at most max_bytes: the engine
 * thread pushes and never waits (a full ring refuses the pack); the writer
 * takes them in order, writes each atomically and reports the result. The
 * fsyncs are what makes a write slow, and they happen here, off the step;
 * the directory's is shared by a batch (when the ring empties, or every
 * DIR_SYNC_EVERY packs). A job without a blob is a touch: the writer sets
 * that pack's file time (the LRU order a restart reads). */
#include "disk_internal.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define DIR_SYNC_EVERY 64 /* packs renamed between directory fsyncs, at most */

struct lm_dc_writer {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* work arrived, or stop */
    pthread_cond_t idle_cv;   /* the ring emptied */
    lm_dc_job *ring;          /* [max_jobs] */
    int head, n, max_jobs;    /* under mu */
    size_t bytes, max_bytes;  /* under mu: bytes of the queued blobs */
    bool stop;                /* under mu: stop once the ring is empty */
    int dirfd;
    lm_dc_faults *faults;
    lm_dc_done_fn done;
    void *user;
};

static void *writer_main(void *arg) {
    lm_dc_writer *w = arg;
    int unsynced = 0; /* packs renamed since the last directory fsync */
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->n == 0 && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
        if (w->n == 0) break;
        lm_dc_job job = w->ring[w->head]; /* stays counted in n until written: flush waits for it */
        pthread_mutex_unlock(&w->mu);
        char name[LM_DC_NAME_MAX];
        lm_dc_pack_name(name, job.pack);
        if (job.blob.head) {
            int err = lm_dc_pack_write(w->dirfd, name, &job.blob, w->faults);
            w->done(w->user, &job, err);
            free(job.blob.head);
            free(job.blob.body);
            unsynced += !err;
        } else if (utimensat(w->dirfd, name, NULL, 0) != 0) {
            /* a touch of a file evicted meanwhile: nothing to keep recent */
        }
        pthread_mutex_lock(&w->mu);
        if (unsynced && (w->n == 1 || unsynced >= DIR_SYNC_EVERY)) {
            /* the renames reach the disk: one directory fsync for a batch of packs */
            pthread_mutex_unlock(&w->mu);
            fsync(w->dirfd);
            unsynced = 0;
            pthread_mutex_lock(&w->mu);
        }
        w->head = (w->head + 1) % w->max_jobs;
        w->n--;
        w->bytes -= job.blob.head_len + job.blob.body_len;
        if (w->n == 0) pthread_cond_broadcast(&w->idle_cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

lm_dc_writer *lm_dc_writer_create(int dirfd, int max_jobs, size_t max_bytes, lm_dc_faults *f, lm_dc_done_fn done,
                                  void *user) {
    lm_dc_writer *w = lm_xcalloc(1, sizeof *w);
    w->ring = lm_xcalloc((size_t)max_jobs, sizeof *w->ring);
    w->max_jobs = max_jobs;
    w->max_bytes = max_bytes;
    w->dirfd = dirfd;
    w->faults = f;
    w->done = done;
    w->user = user;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    pthread_cond_init(&w->idle_cv, NULL);
    LM_ASSERT(pthread_create(&w->thread, NULL, writer_main, w) == 0);
    return w;
}

bool lm_dc_writer_push(lm_dc_writer *w, lm_dc_job *job) {
    pthread_mutex_lock(&w->mu);
    /* one pack larger than max_bytes still goes through an empty ring; a
     * touch (no blob) only into a ring at most half full: entries first */
    size_t len = job->blob.head_len + job->blob.body_len;
    bool room = w->n < (job->blob.head ? w->max_jobs : w->max_jobs / 2) && (w->n == 0 || w->bytes + len <= w->max_bytes);
    if (room) {
        w->ring[(w->head + w->n) % w->max_jobs] = *job;
        w->n++;
        w->bytes += len;
        pthread_cond_signal(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return room;
}

void lm_dc_writer_flush(lm_dc_writer *w) {
    pthread_mutex_lock(&w->mu);
    while (w->n > 0) pthread_cond_wait(&w->idle_cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

void lm_dc_writer_free(lm_dc_writer *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    pthread_cond_destroy(&w->idle_cv);
    free(w->ring);
    free(w);
}
