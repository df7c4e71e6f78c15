/* vocab.c - the string <-> id map and the merge-pair map.
 *
 * Both are open-addressing tables sized once up front (load <= 1/2): token
 * strings live in one arena, so a 262k-token vocabulary is three arrays and
 * one buffer, not 262k allocations. Hashing is XXH3. */
#include <string.h>
#include <xxhash.h>

#include "tok_internal.h"

uint64_t tok_hash(const void *p, size_t n) { return XXH3_64bits(p, n); }

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

void tok_vocab_init(tok_vocab *v, size_t expect) {
    *v = (tok_vocab){ 0 };
    size_t cap = pow2_at_least(expect * 2 + 16);
    v->slots = lm_xmalloc(cap * sizeof *v->slots);
    memset(v->slots, 0xff, cap * sizeof *v->slots);
    v->mask = cap - 1;
}

void tok_vocab_free(tok_vocab *v) {
    free(v->arena);
    free(v->off);
    free(v->len);
    free(v->slots);
    *v = (tok_vocab){ 0 };
}

static void grow_slots(tok_vocab *v) {
    size_t cap = (v->mask + 1) * 2;
    int32_t *slots = lm_xmalloc(cap * sizeof *slots);
    memset(slots, 0xff, cap * sizeof *slots);
    for (int32_t id = 0; id < v->n_ids; id++) {
        if (v->len[id] == UINT32_MAX) continue;
        size_t i = (size_t)tok_hash(v->arena + v->off[id], v->len[id]) & (cap - 1);
        while (slots[i] >= 0) i = (i + 1) & (cap - 1);
        slots[i] = id;
    }
    free(v->slots);
    v->slots = slots;
    v->mask = cap - 1;
}

bool tok_vocab_set(tok_vocab *v, int32_t id, const char *s, size_t n) {
    LM_ASSERT(id >= 0 && n < UINT32_MAX);
    if (id >= v->id_cap) {
        int32_t cap = v->id_cap ? v->id_cap : 256;
        while (cap <= id) cap *= 2;
        v->off = lm_xrealloc(v->off, (size_t)cap * sizeof *v->off);
        v->len = lm_xrealloc(v->len, (size_t)cap * sizeof *v->len);
        for (int32_t i = v->id_cap; i < cap; i++) v->len[i] = UINT32_MAX;
        v->id_cap = cap;
    }
    if (id >= v->n_ids) v->n_ids = id + 1;
    if (v->len[id] != UINT32_MAX) return false;
    if (v->arena_len + n + 1 > v->arena_cap) {
        size_t cap = v->arena_cap ? v->arena_cap : 4096;
        while (cap < v->arena_len + n + 1) cap *= 2;
        v->arena = lm_xrealloc(v->arena, cap);
        v->arena_cap = cap;
    }
    memcpy(v->arena + v->arena_len, s, n);
    v->arena[v->arena_len + n] = 0;
    v->off[id] = (uint32_t)v->arena_len;
    v->len[id] = (uint32_t)n;
    v->arena_len += n + 1;
    LM_ASSERT(v->arena_len < UINT32_MAX);
    if ((v->n_used + 1) * 2 > v->mask + 1) grow_slots(v);
    size_t i = (size_t)tok_hash(s, n) & v->mask;
    while (v->slots[i] >= 0) i = (i + 1) & v->mask;
    v->slots[i] = id;
    v->n_used++;
    return true;
}

int32_t tok_vocab_get(const tok_vocab *v, const char *s, size_t n) {
    size_t i = (size_t)tok_hash(s, n) & v->mask;
    for (;;) {
        int32_t id = v->slots[i];
        if (id < 0) return -1;
        if (v->len[id] == n && !memcmp(v->arena + v->off[id], s, n)) return id;
        i = (i + 1) & v->mask;
    }
}

const char *tok_vocab_str(const tok_vocab *v, int32_t id, size_t *n) {
    if (id < 0 || id >= v->n_ids || v->len[id] == UINT32_MAX) return NULL;
    *n = v->len[id];
    return v->arena + v->off[id];
}

void tok_merges_init(tok_merges *m, size_t expect) {
    size_t cap = pow2_at_least(expect * 2 + 16);
    m->slots = lm_xmalloc(cap * sizeof *m->slots);
    for (size_t i = 0; i < cap; i++) m->slots[i].key = UINT64_MAX;
    m->mask = cap - 1;
    m->n = 0;
}

void tok_merges_free(tok_merges *m) {
    free(m->slots);
    *m = (tok_merges){ 0 };
}

void tok_merges_put(tok_merges *m, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    if ((m->n + 1) * 2 > m->mask + 1) {
        tok_merges old = *m;
        tok_merges_init(m, (old.mask + 1));
        for (size_t i = 0; i <= old.mask; i++)
            if (old.slots[i].key != UINT64_MAX)
                tok_merges_put(m, (int32_t)(old.slots[i].key >> 32), (int32_t)(uint32_t)old.slots[i].key,
                               old.slots[i].rank, old.slots[i].id);
        free(old.slots);
    }
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h >> 20) & m->mask;
    while (m->slots[i].key != UINT64_MAX && m->slots[i].key != key) i = (i + 1) & m->mask;
    if (m->slots[i].key == UINT64_MAX) m->n++;
    m->slots[i] = (tok_merge){ key, rank, id };
}
