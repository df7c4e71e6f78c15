/* server_fixture.c - see server_fixture.h. */
#include "server_fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lm_test.h"

bool srv_fx_open(srv_fx *f, const char *model, int ctx) {
    memset(f, 0, sizeof *f);
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s", model);
    char *dir = lm_test_fixture_path(rel);
    if (!dir) return false;
    lm_err e = { { 0 } };
    int rc = lm_tokenizer_load(&f->tok, dir, &e);
    free(dir);
    if (rc) {
        fprintf(stderr, "  tokenizer: %s\n", e.msg);
        return false;
    }
    f->s.model_name = lm_xstrdup(model);
    f->s.ctx = ctx;
    static const int eos[] = { 2 };
    srv_init_text(&f->s, f->tok, lm_tokenizer_n_vocab(f->tok), eos, 1);
    pthread_mutex_init(&f->s.jobs_mu, NULL);
    return true;
}

void srv_fx_close(srv_fx *f) {
    pthread_mutex_destroy(&f->s.jobs_mu);
    srv_free_text(&f->s);
    free(f->s.model_name);
    lm_tokenizer_free(f->tok);
}
