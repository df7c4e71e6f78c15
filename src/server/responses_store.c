/* responses_store.c - responses kept for previous_response_id: a list in
 * least-recently-used order, bounded by entries and by bytes.
 *
 * Entries are kept as JSON text, not as jansson values: connection threads
 * share the store, jansson's reference counts are not meant to be shared
 * between threads, and the text's length is the byte count the budget
 * needs. A few hundred entries make a linear lookup cheaper than a request's
 * JSON parse, so there is no hash table. */
#include <stdlib.h>
#include <string.h>

#include "responses.h"

typedef struct entry {
    char *id;
    char *json;
    size_t bytes;
    struct entry *prev, *next; /* prev: more recently used */
} entry;

struct srv_resp_store {
    pthread_mutex_t mu; /* guards everything below */
    entry *head, *tail; /* most, least recently used */
    int count, max_count;
    size_t bytes, max_bytes;
};

srv_resp_store *srv_resp_store_create(int max_count, size_t max_bytes) {
    srv_resp_store *st = lm_xcalloc(1, sizeof *st);
    pthread_mutex_init(&st->mu, NULL);
    st->max_count = max_count;
    st->max_bytes = max_bytes;
    return st;
}

static void entry_free(entry *en) {
    if (!en) return;
    free(en->id);
    free(en->json);
    free(en);
}

static void unlink_entry(srv_resp_store *st, entry *en) {
    if (en->prev) en->prev->next = en->next;
    else st->head = en->next;
    if (en->next) en->next->prev = en->prev;
    else st->tail = en->prev;
    en->prev = en->next = NULL;
    st->count--;
    st->bytes -= en->bytes;
}

static void push_front(srv_resp_store *st, entry *en) {
    en->prev = NULL;
    en->next = st->head;
    if (st->head) st->head->prev = en;
    st->head = en;
    if (!st->tail) st->tail = en;
    st->count++;
    st->bytes += en->bytes;
}

static entry *find(srv_resp_store *st, const char *id) {
    for (entry *en = st->head; en; en = en->next)
        if (!strcmp(en->id, id)) return en;
    return NULL;
}

void srv_resp_store_free(srv_resp_store *st) {
    if (!st) return;
    for (entry *en = st->head, *next; en; en = next) {
        next = en->next;
        entry_free(en);
    }
    pthread_mutex_destroy(&st->mu);
    free(st);
}

void srv_resp_store_put(srv_resp_store *st, const char *id, const json_t *items) {
    size_t n;
    char *text = srv_dump(items, false, &n);
    size_t bytes = n + strlen(id) + sizeof(entry);
    pthread_mutex_lock(&st->mu);
    entry *old = find(st, id);
    if (old) unlink_entry(st, old);
    entry_free(old);
    if (bytes > st->max_bytes || st->max_count <= 0) {
        pthread_mutex_unlock(&st->mu);
        free(text);
        return;
    }
    entry *en = lm_xcalloc(1, sizeof *en);
    en->id = lm_xstrdup(id);
    en->json = text;
    en->bytes = bytes;
    push_front(st, en);
    while (st->count > st->max_count || st->bytes > st->max_bytes) {
        entry *last = st->tail;
        unlink_entry(st, last);
        entry_free(last);
    }
    pthread_mutex_unlock(&st->mu);
}

json_t *srv_resp_store_get(srv_resp_store *st, const char *id) {
    char *copy = NULL;
    pthread_mutex_lock(&st->mu);
    entry *en = find(st, id);
    if (en) {
        unlink_entry(st, en);
        push_front(st, en);
        copy = lm_xstrdup(en->json);
    }
    pthread_mutex_unlock(&st->mu);
    if (!copy) return NULL;
    json_t *j = json_loads(copy, JSON_ALLOW_NUL, NULL);
    free(copy);
    return j;
}

int srv_resp_store_count(srv_resp_store *st, size_t *bytes) {
    pthread_mutex_lock(&st->mu);
    int n = st->count;
    if (bytes) *bytes = st->bytes;
    pthread_mutex_unlock(&st->mu);
    return n;
}
