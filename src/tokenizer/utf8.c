/* utf8.c - UTF-8 decoding, Rust-exact lossy conversion, and the few Unicode
 * character classes the Hugging Face pipeline tests (via utf8proc's tables).
 *
 * Written by hand because the replacement rule must be Rust's
 * String::from_utf8_lossy exactly ("maximal subparts": one U+FFFD per
 * invalid or truncated sequence prefix), which no C library offers, and the
 * streaming variant must agree with it byte for byte. */
#include <string.h>
#include <utf8proc.h>

#include "tok_internal.h"

void tok_str_reserve(lm_tok_str *s, size_t extra) {
    size_t need = s->len + extra + 1;
    if (need <= s->cap) return;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < need) cap *= 2;
    s->s = lm_xrealloc(s->s, cap);
    s->cap = cap;
}

void tok_str_append(lm_tok_str *s, const void *p, size_t n) {
    tok_str_reserve(s, n);
    if (n) memcpy(s->s + s->len, p, n);
    s->len += n;
    s->s[s->len] = 0;
}

void tok_ids_push(lm_tok_ids *v, int32_t id) {
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 64;
        v->ids = lm_xrealloc(v->ids, v->cap * sizeof *v->ids);
    }
    v->ids[v->n++] = id;
}

void lm_tok_ids_free(lm_tok_ids *v) {
    free(v->ids);
    *v = (lm_tok_ids){ 0 };
}

void lm_tok_str_free(lm_tok_str *s) {
    free(s->s);
    *s = (lm_tok_str){ 0 };
}

int tok_utf8_len(uint8_t b) {
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) return 3;
    if (b >= 0xF0 && b <= 0xF4) return 4;
    return 1;
}

uint32_t tok_utf8_cp(const char *s, size_t n, int *len) {
    const uint8_t *u = (const uint8_t *)s;
    int l = tok_utf8_len(u[0]);
    if ((size_t)l > n) l = 1;
    *len = l;
    switch (l) {
    case 1: return u[0];
    case 2: return ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
    case 3: return ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
    default:
        return ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) |
               ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
    }
}

int tok_utf8_put(uint32_t cp, char *out) {
    uint8_t *o = (uint8_t *)out;
    if (cp < 0x80) { o[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) { o[0] = (uint8_t)(0xC0 | (cp >> 6)); o[1] = (uint8_t)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12)); o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18)); o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* The allowed range of byte number pos (1..) of a sequence led by lead
 * (Unicode Table 3-7); returns the sequence length, 0 if lead is invalid. */
static int seq_range(uint8_t lead, int pos, uint8_t *lo, uint8_t *hi) {
    int l;
    *lo = 0x80, *hi = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) l = 2;
    else if (lead >= 0xE0 && lead <= 0xEF) {
        l = 3;
        if (pos == 1 && lead == 0xE0) *lo = 0xA0;
        if (pos == 1 && lead == 0xED) *hi = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
        l = 4;
        if (pos == 1 && lead == 0xF0) *lo = 0x90;
        if (pos == 1 && lead == 0xF4) *hi = 0x8F;
    } else return 0;
    return l;
}

static const char k_fffd[3] = { (char)0xEF, (char)0xBF, (char)0xBD };

bool tok_utf8_lossy(lm_tok_str *out, const char *src, size_t n) {
    const uint8_t *s = (const uint8_t *)src;
    bool valid = true;
    size_t i = 0, run = 0; /* run: start of the pending valid stretch */
    tok_str_reserve(out, n);
    while (i < n) {
        if (s[i] < 0x80) { i++; continue; }
        uint8_t lo, hi;
        int l = seq_range(s[i], 1, &lo, &hi), k = 1;
        if (l) {
            while (k < l && i + (size_t)k < n) {
                seq_range(s[i], k, &lo, &hi);
                if (s[i + k] < lo || s[i + k] > hi) break;
                k++;
            }
            if (k == l) { i += (size_t)l; continue; }
        }
        valid = false;
        tok_str_append(out, src + run, i - run);
        tok_str_append(out, k_fffd, 3);
        i += (size_t)k;
        run = i;
    }
    tok_str_append(out, src + run, n - run);
    return valid;
}

bool tok_utf8_valid(const char *src, size_t n) {
    const uint8_t *s = (const uint8_t *)src;
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) { i++; continue; }
        uint8_t lo, hi;
        int l = seq_range(s[i], 1, &lo, &hi);
        if (!l || i + (size_t)l > n) return false;
        for (int k = 1; k < l; k++) {
            seq_range(s[i], k, &lo, &hi);
            if (s[i + k] < lo || s[i + k] > hi) return false;
        }
        i += (size_t)l;
    }
    return true;
}

void tok_utf8_stream_feed(tok_utf8_stream *u, const char *p, size_t n, lm_tok_str *out) {
    const uint8_t *s = (const uint8_t *)p;
    size_t i = 0;
    while (i < n && u->npend) {
        uint8_t lo, hi;
        int l = seq_range(u->pend[0], u->npend, &lo, &hi);
        if (s[i] < lo || s[i] > hi) {
            tok_str_append(out, k_fffd, 3);
            u->npend = 0;
            break;
        }
        u->pend[u->npend++] = s[i++];
        if (u->npend == l) {
            tok_str_append(out, u->pend, (size_t)l);
            u->npend = 0;
        }
    }
    if (i == n) return;
    /* Find where a trailing incomplete (but so far valid) sequence starts. */
    size_t tail = n;
    for (size_t j = n; j > i && n - j < 4;) {
        j--;
        if ((s[j] & 0xC0) != 0x80) {
            uint8_t lo, hi;
            int l = seq_range(s[j], 1, &lo, &hi);
            if (l && (size_t)l > n - j) {
                bool ok = true;
                for (size_t k = 1; j + k < n; k++) {
                    seq_range(s[j], (int)k, &lo, &hi);
                    if (s[j + k] < lo || s[j + k] > hi) { ok = false; break; }
                }
                if (ok) tail = j;
            }
            break;
        }
    }
    tok_utf8_lossy(out, p + i, tail - i);
    for (size_t k = tail; k < n; k++) u->pend[u->npend++] = s[k];
}

void tok_utf8_stream_end(tok_utf8_stream *u, lm_tok_str *out) {
    if (u->npend) tok_str_append(out, k_fffd, 3);
    u->npend = 0;
}

bool tok_is_whitespace(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

int tok_category(uint32_t c) {
    if (c > 0x10FFFF) return UTF8PROC_CATEGORY_CN;
    int k = utf8proc_category((utf8proc_int32_t)c);
    if (k != UTF8PROC_CATEGORY_CN) return k;
    int lo = 0, hi = tok_uni_new_n - 1; /* newer than utf8proc's tables? */
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (c < tok_uni_new[mid].lo) hi = mid - 1;
        else if (c > tok_uni_new[mid].hi) lo = mid + 1;
        else return tok_uni_new[mid].cat;
    }
    return UTF8PROC_CATEGORY_CN;
}

bool tok_uni_in(const tok_uni_range *r, int n, uint32_t cp) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < r[mid].lo) hi = mid - 1;
        else if (cp > r[mid].hi) lo = mid + 1;
        else return true;
    }
    return false;
}

static utf8proc_category_t cat(uint32_t c) { return (utf8proc_category_t)tok_category(c); }

bool tok_is_numeric(uint32_t c) {
    utf8proc_category_t k = cat(c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

static bool is_letter(utf8proc_category_t k) {
    return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}

bool tok_is_alnum(uint32_t c) {
    utf8proc_category_t k = cat(c);
    return is_letter(k) || k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL ||
           k == UTF8PROC_CATEGORY_NO;
}

bool tok_is_word(uint32_t c) {
    utf8proc_category_t k = cat(c);
    /* Unicode \w: Alphabetic (letters, Nl, and the circled/squared letters
     * that are So), marks, Nd, Pc, the joiners */
    return is_letter(k) || (k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME) ||
           k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_PC ||
           c == 0x200C || c == 0x200D || (c >= 0x24B6 && c <= 0x24E9) ||
           (c >= 0x1F130 && c <= 0x1F149) || (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189);
}

bool tok_is_punct(uint32_t c) {
    if (c < 128) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
                        (c >= 123 && c <= 126);
    utf8proc_category_t k = cat(c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}
