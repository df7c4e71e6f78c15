/* quant_fit.h - the scale searches every block quantiser shares (internal
 * to src/quant).
 *
 * A block of n values x (importance w) is stored as a scale times a level
 * from a fixed set (symmetric: x ~ s * L[q]) or a scale times an unsigned
 * integer minus an offset (asymmetric: x ~ s * q - m). The searches try a
 * spread of scales around the one that maps the largest value onto an end
 * of the level set, fit the least-squares scale (and offset) for each
 * assignment of levels, and keep the best; so every format's block gets the
 * same search and only its packing differs. */
#ifndef LM_QUANT_FIT_H
#define LM_QUANT_FIT_H

#include <stdbool.h>
#include <stdint.h>

/* The levels a symmetric format can store: n values ascending; uniform
 * sets (lo, lo+1, ...) are found by rounding, others by search. */
typedef struct lm_qlevels {
    const float *v;
    int n;
    bool uniform;
} lm_qlevels;

/* Index of the level nearest to t. */
int lm_qfit_nearest(const lm_qlevels *L, float t);
/* The scale s minimising sum w (x - s L[q])^2 over the searched scales, with
 * q (level indices) for it in q; 0 (q all the level nearest 0) when x is 0. */
float lm_qfit_sym(const lm_qlevels *L, const float *x, const float *w, int n, uint8_t *q);
/* The scale s >= 0 and offset m (>= 0 unless signed_m: the K-quants store
 * unsigned mins, Q4_1 / Q5_1 a signed f16) minimising
 * sum w (x - (s q - m))^2, q in 0..nmax, over the searched pairs; q for
 * them in q. */
void lm_qfit_asym(int nmax, const float *x, const float *w, int n, bool signed_m, float *s, float *m, uint8_t *q);
/* Levels for a stored scale: q_i = nearest level of x_i / s (0 scale: the
 * level nearest 0). */
void lm_qfit_assign_sym(const lm_qlevels *L, const float *x, int n, float s, uint8_t *q);
/* q_i = clamp(round((x_i + m) / s), 0, nmax). */
void lm_qfit_assign_asym(int nmax, const float *x, int n, float s, float m, uint8_t *q);

#endif
