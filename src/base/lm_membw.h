/* lm_membw.h - a STREAM-like copy to measure this machine's memory bandwidth,
 * the roofline that decode speed is judged against. */
#ifndef LM_MEMBW_H
#define LM_MEMBW_H

#include "lm_base.h"

/* Copies `bytes` between two buffers with n_threads threads, best of reps;
 * returns bytes moved per second counting read + write (STREAM's convention),
 * or 0 when the buffers cannot be allocated. */
double lm_copy_bandwidth(size_t bytes, int n_threads, int reps);

/* A streaming read of `bytes` with n_threads threads, best of reps, in bytes
 * per second: what loads alone get, the traffic of a decode step's weights. */
double lm_read_bandwidth(size_t bytes, int n_threads, int reps);

#endif
