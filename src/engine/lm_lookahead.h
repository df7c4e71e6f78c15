/* lm_lookahead.h - greedy look-ahead on the device: a chain of decode
 * forwards, each taking its tokens from the previous one's argmax on the
 * backend and queued before those ids reach the host, so that a GPU never
 * waits for the host between steps.
 *
 * A chain starts with any forward whose argmax rows (lm_batch_set_argmax,
 * later) are its sequences' next tokens, one row per sequence. Each link
 * after it is queued with lm_lookahead_queue; the host then waits for the
 * previous forward's ids (lm_model_wait_argmax, once per argmax_later
 * forward, oldest first) and reads them while the link runs. Links
 * alternate between two id buffers, so that the one the host reads is not
 * the one the backend writes. Needs lm_model_look_ahead.
 *
 * The engine's policy for when a chain may run (lookahead.c) and `lumen
 * bench --batch` both use this. */
#ifndef LM_LOOKAHEAD_H
#define LM_LOOKAHEAD_H

#include "lm_batch_builder.h"

/* Queues the next link: bb holds one token per sequence, each added with
 * lm_batch_add_from_argmax in the order of the previous forward's argmax
 * rows; each gets an output row, whose argmax lands in ids [its sequences]
 * once lm_model_wait_argmax has returned for this forward. masked: that
 * argmax waits for lm_model_argmax_masked (the rows' grammar masks). 0, or
 * -1 with e (nothing queued). */
int lm_lookahead_queue(lm_model *m, lm_kv_pool *kv, lm_batch_builder *bb, int32_t *ids, bool masked, lm_err *e);

#endif
