/* server_fixture.h - a server's text side (srv_init_text: stop ids, hidden
 * tokens, the chat template) over a fixture model's tokenizer, with no model
 * and no HTTP: for the tests of src/server's request translation and output.
 * Implemented in server_fixture.c. */
#ifndef SERVER_FIXTURE_H
#define SERVER_FIXTURE_H

#include <stdbool.h>

#include "server/server_internal.h"

typedef struct srv_fx {
    srv s;
    lm_tokenizer *tok;
} srv_fx;

/* ../shared/fixtures/models/MODEL's tokenizer, a context of ctx tokens and
 * eos id 2; false when the fixture is absent or its tokenizer fails (the
 * error printed). */
bool srv_fx_open(srv_fx *f, const char *model, int ctx);
void srv_fx_close(srv_fx *f);

#endif
