/* prefix_cache.c - the RAM prefix cache and the request history (see
 * lm_prefix_cache.h).
 *
 * Entries live in one array, found by chain hash through bucket lists, linked
 * into a tree (first child / next sibling) and into one LRU list (head = most
 * recently used). An entry holds one reference on its pool block, and may own
 * one state slot (its checkpoint). Lookups verify the tokens and the parent of
 * each entry, so a 64-bit hash collision can cost a hit, never correctness. */
#include "lm_prefix_cache.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

typedef struct pc_entry {
    uint64_t hash;
    int32_t block;          /* pool block; -1 while the entry is free */
    int32_t parent;         /* entry of the previous block; -1 for block 0 */
    int32_t child, sib;     /* first child; next sibling (roots: pc->roots list) */
    int32_t n_children;
    int32_t hnext;          /* next entry in the same hash bucket */
    int32_t prev, next;     /* LRU neighbours: prev is more recent */
    int32_t ckpt;           /* state slot with the state at the block's end, or -1 */
    int32_t pins;           /* > 0: in use by an admission, not evictable */
} pc_entry;

struct lm_prefix_cache {
    lm_kv_cache *kv;        /* not owned */
    size_t budget, block_bytes, ckpt_bytes;
    int bs;                 /* tokens per block */
    int cap;                /* most entries (budget / block_bytes) */
    pc_entry *e;            /* [cap] */
    int32_t *toks;          /* [cap][bs] the tokens of each entry's block */
    int32_t *free_e;        /* [cap] stack of free entries */
    int n_free_e;
    int32_t *bucket;        /* [mask + 1] first entry per hash bucket */
    uint64_t mask;
    int32_t lru_head, lru_tail;
    int32_t roots;          /* first entry with no parent */
    int n_blocks, n_ckpts, max_ckpts;
    uint64_t evicted;
    uint64_t seed;
    int32_t *pinned;        /* [2 * cap + 2] entries pinned by the last lookup and lm_pcache_pin */
    lm_pcache_spill_fn spill;
    void *spill_user;
    int32_t *chain;         /* [cap] lookup scratch: the matched chain */
    int n_pinned;
};

/* ---- hashing ---- */

uint64_t lm_pcache_model_seed(const char *path, const void *cfg, size_t cfg_bytes, size_t weight_bytes) {
    uint64_t h = XXH3_64bits(path ? path : "", path ? strlen(path) : 0);
    if (cfg && cfg_bytes) h = XXH3_64bits_withSeed(cfg, cfg_bytes, h);
    return XXH3_64bits_withSeed(&weight_bytes, sizeof weight_bytes, h);
}

uint64_t lm_pcache_hash(uint64_t parent, const int32_t *tokens, int block_size) {
    return XXH3_64bits_withSeed(tokens, (size_t)block_size * sizeof(int32_t), parent);
}

uint64_t lm_pcache_seed(const lm_prefix_cache *pc) { return pc->seed; }

/* ---- create / free ---- */

lm_prefix_cache *lm_pcache_create(lm_kv_cache *kv, size_t budget, int max_ckpts, uint64_t seed) {
    size_t bb = lm_kv_block_bytes(kv);
    size_t cap = budget / bb;
    if (cap == 0) return NULL;
    if (cap > (size_t)kv->pool.n_blocks) cap = (size_t)kv->pool.n_blocks;
    lm_prefix_cache *pc = lm_xcalloc(1, sizeof *pc);
    pc->kv = kv;
    pc->budget = budget;
    pc->block_bytes = bb;
    pc->ckpt_bytes = lm_kv_state_bytes(kv);
    pc->max_ckpts = pc->ckpt_bytes ? max_ckpts : 0;
    pc->bs = kv->pool.block_size;
    pc->cap = (int)cap;
    pc->seed = seed;
    pc->e = lm_xcalloc(cap, sizeof *pc->e);
    pc->toks = lm_xmalloc(cap * (size_t)pc->bs * sizeof(int32_t));
    pc->free_e = lm_xmalloc(cap * sizeof(int32_t));
    pc->pinned = lm_xmalloc((2 * cap + 2) * sizeof(int32_t));
    pc->chain = lm_xmalloc(cap * sizeof(int32_t));
    for (int i = 0; i < pc->cap; i++) {
        pc->e[i].block = -1;
        pc->free_e[i] = pc->cap - 1 - i;
    }
    pc->n_free_e = pc->cap;
    size_t nb = 16;
    while (nb < 2 * cap) nb *= 2;
    pc->mask = nb - 1;
    pc->bucket = lm_xmalloc(nb * sizeof(int32_t));
    for (size_t i = 0; i < nb; i++) pc->bucket[i] = -1;
    pc->lru_head = pc->lru_tail = pc->roots = -1;
    return pc;
}

void lm_pcache_free(lm_prefix_cache *pc) {
    if (!pc) return;
    for (int i = 0; i < pc->cap; i++) {
        pc_entry *x = &pc->e[i];
        if (x->block < 0) continue;
        if (x->ckpt >= 0) lm_kv_state_release(pc->kv, x->ckpt);
        lm_kv_block_unref(pc->kv, x->block);
    }
    free(pc->e);
    free(pc->toks);
    free(pc->free_e);
    free(pc->pinned);
    free(pc->chain);
    free(pc->bucket);
    free(pc);
}

/* ---- lists ---- */

static size_t held_bytes(const lm_prefix_cache *pc) {
    return (size_t)pc->n_blocks * pc->block_bytes + (size_t)pc->n_ckpts * pc->ckpt_bytes;
}

static int32_t find(const lm_prefix_cache *pc, uint64_t hash) {
    for (int32_t i = pc->bucket[hash & pc->mask]; i >= 0; i = pc->e[i].hnext)
        if (pc->e[i].hash == hash) return i;
    return -1;
}

static void lru_unlink(lm_prefix_cache *pc, int32_t i) {
    pc_entry *x = &pc->e[i];
    if (x->prev >= 0) pc->e[x->prev].next = x->next;
    else pc->lru_head = x->next;
    if (x->next >= 0) pc->e[x->next].prev = x->prev;
    else pc->lru_tail = x->prev;
    x->prev = x->next = -1;
}

static void lru_push_front(lm_prefix_cache *pc, int32_t i) {
    pc_entry *x = &pc->e[i];
    x->prev = -1;
    x->next = pc->lru_head;
    if (pc->lru_head >= 0) pc->e[pc->lru_head].prev = i;
    pc->lru_head = i;
    if (pc->lru_tail < 0) pc->lru_tail = i;
}

static void lru_touch(lm_prefix_cache *pc, int32_t i) {
    if (pc->lru_head == i) return;
    lru_unlink(pc, i);
    lru_push_front(pc, i);
}

/* Leaf first, root last: ancestors end up more recent than descendants. */
static void touch_chain(lm_prefix_cache *pc, int32_t i) {
    for (; i >= 0; i = pc->e[i].parent) lru_touch(pc, i);
}

void lm_pcache_touch(lm_prefix_cache *pc, uint64_t hash) { touch_chain(pc, find(pc, hash)); }

static void spill(lm_prefix_cache *pc, int32_t i, bool block) {
    if (!pc->spill) return;
    const pc_entry *x = &pc->e[i];
    uint64_t parent = x->parent >= 0 ? pc->e[x->parent].hash : pc->seed;
    pc->spill(pc->spill_user, x->hash, parent, pc->toks + (size_t)i * pc->bs, block ? x->block : -1, x->ckpt);
}

void lm_pcache_set_spill(lm_prefix_cache *pc, lm_pcache_spill_fn fn, void *user) {
    pc->spill = fn;
    pc->spill_user = user;
}

static void drop_ckpt(lm_prefix_cache *pc, int32_t i) {
    if (pc->e[i].ckpt < 0) return;
    lm_kv_state_release(pc->kv, pc->e[i].ckpt);
    pc->e[i].ckpt = -1;
    pc->n_ckpts--;
}

static void evict(lm_prefix_cache *pc, int32_t i) {
    pc_entry *x = &pc->e[i];
    LM_ASSERT(x->block >= 0 && x->n_children == 0 && x->pins == 0);
    spill(pc, i, true);
    lru_unlink(pc, i);
    int32_t *link = &pc->bucket[x->hash & pc->mask];
    while (*link != i) link = &pc->e[*link].hnext;
    *link = x->hnext;
    link = x->parent >= 0 ? &pc->e[x->parent].child : &pc->roots;
    while (*link != i) link = &pc->e[*link].sib;
    *link = x->sib;
    if (x->parent >= 0) pc->e[x->parent].n_children--;
    drop_ckpt(pc, i);
    lm_kv_block_unref(pc->kv, x->block);
    x->block = -1;
    pc->free_e[pc->n_free_e++] = i;
    pc->n_blocks--;
    pc->evicted++;
}

/* The least recently used evictable entry: childless, unpinned, not `keep`;
 * with only_free, also one whose block nobody else uses (evicting it frees a
 * pool block). -1 when none. */
static int32_t victim(const lm_prefix_cache *pc, bool only_free, int32_t keep) {
    for (int32_t i = pc->lru_tail; i >= 0; i = pc->e[i].prev) {
        const pc_entry *x = &pc->e[i];
        if (x->n_children || x->pins || i == keep) continue;
        if (only_free && pc->kv->refs[x->block] != 1) continue;
        return i;
    }
    return -1;
}

/* Evicts until `extra` more bytes fit the budget; false when it cannot. */
static bool fit_bytes(lm_prefix_cache *pc, size_t extra, int32_t keep) {
    while (held_bytes(pc) + extra > pc->budget) {
        int32_t v = victim(pc, true, keep);
        if (v < 0) v = victim(pc, false, keep);
        if (v < 0) return false;
        evict(pc, v);
    }
    return true;
}

bool lm_pcache_make_room(lm_prefix_cache *pc, int need) {
    if (pc->kv->n_free >= need) return true;
    int freeable = 0;
    for (int i = 0; i < pc->cap; i++) {
        const pc_entry *x = &pc->e[i];
        if (x->block >= 0 && !x->pins && pc->kv->refs[x->block] == 1) freeable++;
    }
    if (pc->kv->n_free + freeable < need) return false;
    /* unpinned entries have no pinned descendants (pins cover a root chain),
     * so evicting leaves reaches every freeable block */
    while (pc->kv->n_free < need) {
        int32_t v = victim(pc, true, -1);
        if (v < 0) v = victim(pc, false, -1);
        LM_ASSERT(v >= 0);
        evict(pc, v);
    }
    return true;
}

/* ---- lookup ---- */

static void pin(lm_prefix_cache *pc, int32_t i) {
    pc->e[i].pins++;
    pc->pinned[pc->n_pinned++] = i;
}

void lm_pcache_unpin(lm_prefix_cache *pc) {
    for (int k = 0; k < pc->n_pinned; k++) pc->e[pc->pinned[k]].pins--;
    pc->n_pinned = 0;
}

void lm_pcache_lookup(lm_prefix_cache *pc, const int32_t *tokens, int n, const uint64_t *hashes, bool stateful,
                      lm_pcache_hit *hit, int32_t *blocks) {
    const int bs = pc->bs;
    *hit = (lm_pcache_hit){ .cow_block = -1, .ckpt = -1 };
    LM_ASSERT(pc->n_pinned == 0);
    if (n < 2) return;
    /* full blocks along the chain, each checked against its tokens and parent */
    int m = 0;
    int32_t last = -1;
    for (; m < n / bs; m++) {
        int32_t i = find(pc, hashes[m]);
        if (i < 0 || pc->e[i].parent != last || memcmp(pc->toks + (size_t)i * bs, tokens + (size_t)m * bs,
                                                       (size_t)bs * sizeof(int32_t)) != 0)
            break;
        pc->chain[m] = i;
        last = i;
    }
    hit->kv_blocks = m;
    int limit = n - 1; /* the last prompt token is always recomputed: it needs logits */
    const int32_t *chain = pc->chain;
    if (stateful) {
        /* the recurrent state cannot be rolled back: only a checkpoint will do */
        int k = LM_MIN(m, limit / bs);
        while (k > 0 && pc->e[chain[k - 1]].ckpt < 0) k--;
        hit->n_tokens = k * bs;
        hit->n_blocks = k;
        hit->ckpt = k > 0 ? pc->e[chain[k - 1]].ckpt : -1;
    } else if (m * bs > limit) {
        hit->n_tokens = limit;
        hit->n_blocks = limit / bs;
        if (limit % bs) hit->cow_block = pc->e[chain[hit->n_blocks]].block;
    } else {
        /* the next block may share a few tokens with a cached one: the child
         * of the chain's end (or a root) with the longest common prefix */
        int best = 0;
        int32_t best_i = -1;
        int avail = LM_MIN(bs, limit - m * bs);
        const int32_t *want = tokens + (size_t)m * bs;
        for (int32_t c = m > 0 ? pc->e[last].child : pc->roots; c >= 0; c = pc->e[c].sib) {
            const int32_t *have = pc->toks + (size_t)c * bs;
            int l = 0;
            while (l < avail && have[l] == want[l]) l++;
            if (l > best) best = l, best_i = c;
        }
        hit->n_tokens = m * bs + best;
        hit->n_blocks = m;
        if (best_i >= 0) {
            hit->cow_block = pc->e[best_i].block;
            pin(pc, best_i);
            lru_touch(pc, best_i);
        }
    }
    for (int i = 0; i < hit->n_blocks; i++) blocks[i] = pc->e[chain[i]].block;
    int n_pin = hit->cow_block >= 0 && !stateful && m * bs > limit ? hit->n_blocks + 1 : hit->n_blocks;
    for (int i = 0; i < n_pin; i++) pin(pc, chain[i]);
    if (m > 0) touch_chain(pc, chain[m - 1]);
}

/* ---- insert, checkpoints ---- */

int lm_pcache_insert(lm_prefix_cache *pc, uint64_t hash, uint64_t parent, const int32_t *tokens, int32_t block) {
    int32_t i = find(pc, hash);
    if (i >= 0) return 0;
    int32_t p = -1;
    if (parent != pc->seed && (p = find(pc, parent)) < 0) return -1;
    if (p >= 0) pc->e[p].pins++; /* the parent must survive making room */
    bool ok = fit_bytes(pc, pc->block_bytes, -1) && pc->n_free_e > 0;
    if (p >= 0) pc->e[p].pins--;
    if (!ok) return -1;
    i = pc->free_e[--pc->n_free_e];
    pc_entry *x = &pc->e[i];
    *x = (pc_entry){ .hash = hash, .block = block, .parent = p, .child = -1, .ckpt = -1, .prev = -1, .next = -1 };
    memcpy(pc->toks + (size_t)i * pc->bs, tokens, (size_t)pc->bs * sizeof(int32_t));
    size_t b = hash & pc->mask;
    x->hnext = pc->bucket[b];
    pc->bucket[b] = i;
    int32_t *head = p >= 0 ? &pc->e[p].child : &pc->roots;
    x->sib = *head;
    *head = i;
    if (p >= 0) pc->e[p].n_children++;
    lru_push_front(pc, i);
    lm_kv_block_ref(pc->kv, block);
    pc->n_blocks++;
    return 0;
}

/* A state slot for a new checkpoint on entry i (making room for it), its
 * contents left to the caller; -1 when there is no room. */
static int32_t ckpt_reserve(lm_prefix_cache *pc, int32_t i) {
    pc->e[i].pins++;
    bool ok = true;
    while (ok && pc->n_ckpts >= pc->max_ckpts) {
        /* out of checkpoint slots: the least recently used checkpoint goes */
        int32_t v = pc->lru_tail;
        while (v >= 0 && (pc->e[v].ckpt < 0 || pc->e[v].pins)) v = pc->e[v].prev;
        if (v >= 0) {
            spill(pc, v, false);
            drop_ckpt(pc, v);
        } else {
            ok = false;
        }
    }
    ok = ok && fit_bytes(pc, pc->ckpt_bytes, i);
    pc->e[i].pins--;
    if (!ok) return -1;
    int32_t s = lm_kv_state_take(pc->kv);
    LM_ASSERT(s >= 0); /* the pool holds max_ckpts slots beyond the running sequences' */
    pc->e[i].ckpt = s;
    pc->n_ckpts++;
    return s;
}

int lm_pcache_checkpoint(lm_prefix_cache *pc, uint64_t hash, int32_t slot) {
    int32_t i = find(pc, hash);
    if (i < 0 || pc->max_ckpts == 0) return -1;
    if (pc->e[i].ckpt >= 0) return 0;
    int32_t s = ckpt_reserve(pc, i);
    if (s < 0) return -1;
    lm_kv_state_copy(pc->kv, s, slot);
    return 1;
}

int32_t lm_pcache_checkpoint_slot(lm_prefix_cache *pc, uint64_t hash) {
    int32_t i = find(pc, hash);
    if (i < 0 || pc->max_ckpts == 0 || pc->e[i].ckpt >= 0) return -1;
    return ckpt_reserve(pc, i);
}

bool lm_pcache_has(const lm_prefix_cache *pc, uint64_t hash) { return find(pc, hash) >= 0; }

int32_t lm_pcache_ckpt_of(const lm_prefix_cache *pc, uint64_t hash) {
    int32_t i = find(pc, hash);
    return i >= 0 ? pc->e[i].ckpt : -1;
}

void lm_pcache_pin(lm_prefix_cache *pc, uint64_t hash) {
    int32_t i = find(pc, hash);
    if (i >= 0 && pc->n_pinned < 2 * pc->cap + 2) pin(pc, i);
}

void lm_pcache_drop_checkpoint(lm_prefix_cache *pc, uint64_t hash) {
    int32_t i = find(pc, hash);
    if (i >= 0) drop_ckpt(pc, i);
}

void lm_pcache_get_stats(const lm_prefix_cache *pc, lm_pcache_stats *s) {
    s->blocks = pc->n_blocks;
    s->checkpoints = pc->n_ckpts;
    s->bytes = held_bytes(pc);
    s->evicted_blocks = pc->evicted;
}

int lm_pcache_check(const lm_prefix_cache *pc) {
    int n = 0, ck = 0, lru = 0;
    for (int i = 0; i < pc->cap; i++) {
        const pc_entry *x = &pc->e[i];
        if (x->block < 0) continue;
        n++;
        if (x->ckpt >= 0) ck++;
        if (x->pins || pc->kv->refs[x->block] < 1 || find(pc, x->hash) != i) return -1;
        int kids = 0;
        for (int32_t c = x->child; c >= 0; c = pc->e[c].sib) {
            if (pc->e[c].parent != i) return -1;
            kids++;
        }
        if (kids != x->n_children) return -1;
    }
    for (int32_t i = pc->lru_head; i >= 0 && lru <= n; i = pc->e[i].next) lru++;
    if (n != pc->n_blocks || ck != pc->n_ckpts || lru != n || n + pc->n_free_e != pc->cap) return -1;
    if (held_bytes(pc) > pc->budget || pc->n_ckpts > pc->max_ckpts || pc->n_pinned) return -1;
    return 0;
}

/* ---- request history ---- */

typedef struct hist_ent {
    uint64_t id;
    int32_t *toks;
    int n;
} hist_ent;

struct lm_req_history {
    hist_ent *ent;      /* [max] oldest first */
    int n, max;
    size_t total, max_tokens;
    uint64_t next_id;
};

lm_req_history *lm_hist_create(int max_entries, size_t max_tokens) {
    lm_req_history *h = lm_xcalloc(1, sizeof *h);
    h->max = max_entries > 0 ? max_entries : 1;
    h->max_tokens = max_tokens > 0 ? max_tokens : 1;
    h->ent = lm_xcalloc((size_t)h->max, sizeof *h->ent);
    h->next_id = 1;
    return h;
}

void lm_hist_free(lm_req_history *h) {
    if (!h) return;
    for (int i = 0; i < h->n; i++) free(h->ent[i].toks);
    free(h->ent);
    free(h);
}

static void hist_drop_oldest(lm_req_history *h) {
    h->total -= (size_t)h->ent[0].n;
    free(h->ent[0].toks);
    memmove(h->ent, h->ent + 1, (size_t)(h->n - 1) * sizeof *h->ent);
    h->n--;
}

/* Drops the oldest entries (never the newest) until the token cap holds. */
static void hist_trim(lm_req_history *h) {
    while (h->n > 1 && h->total > h->max_tokens) hist_drop_oldest(h);
}

uint64_t lm_hist_add(lm_req_history *h, const int32_t *tokens, int n) {
    if ((size_t)n > h->max_tokens) n = (int)h->max_tokens;
    if (h->n == h->max) hist_drop_oldest(h);
    hist_ent *x = &h->ent[h->n++];
    x->id = h->next_id++;
    x->n = n;
    x->toks = lm_xmalloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    memcpy(x->toks, tokens, (size_t)n * sizeof(int32_t));
    h->total += (size_t)n;
    hist_trim(h);
    return x->id;
}

void lm_hist_update(lm_req_history *h, uint64_t id, const int32_t *tokens, int n) {
    if ((size_t)n > h->max_tokens) n = (int)h->max_tokens;
    for (int i = 0; i < h->n; i++) {
        hist_ent *x = &h->ent[i];
        if (x->id != id) continue;
        x->toks = lm_xrealloc(x->toks, (size_t)(n > 0 ? n : 1) * sizeof(int32_t));
        memcpy(x->toks, tokens, (size_t)n * sizeof(int32_t));
        h->total = h->total - (size_t)x->n + (size_t)n;
        x->n = n;
        hist_trim(h);
        return;
    }
}

void lm_hist_closest(const lm_req_history *h, const int32_t *tokens, int n, lm_hist_match *m) {
    *m = (lm_hist_match){ .diverge_pos = -1 };
    int best = -1;
    for (int i = h->n - 1; i >= 0; i--) { /* newest first: ties go to the most recent */
        const hist_ent *x = &h->ent[i];
        int lim = LM_MIN(n, x->n), l = 0;
        while (l < lim && x->toks[l] == tokens[l]) l++;
        if (best < 0 || l > m->n_shared) {
            best = i;
            m->n_shared = l;
        }
    }
    if (best < 0 || m->n_shared == 0) {
        m->n_shared = 0;
        return;
    }
    const hist_ent *x = &h->ent[best];
    m->prev_len = x->n;
    if (m->n_shared < n && m->n_shared < x->n) {
        m->diverge_pos = m->n_shared;
        m->prev_start = LM_MAX(0, m->diverge_pos - LM_TRACE_WINDOW / 2);
        m->n_prev = LM_MIN(LM_TRACE_WINDOW, x->n - m->prev_start);
        memcpy(m->prev_window, x->toks + m->prev_start, (size_t)m->n_prev * sizeof(int32_t));
    }
}
