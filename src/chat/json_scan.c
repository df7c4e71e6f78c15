/* json_scan.c - an incremental JSON validator: one byte in, "still valid?"
 * out, plus events saying where values and keys begin and end.
 *
 * The tool-call parser needs to stream a call's arguments while the model is
 * still writing them, and to notice bad JSON at the first wrong byte; jansson
 * only parses complete documents, so this push-down automaton does the
 * syntax. It never allocates; nesting is bounded by LM_JSON_MAX_DEPTH (deeper
 * input is treated as invalid, which for a tool call means "malformed"). */
#include "chat/parse_internal.h"

enum {
    S_VALUE,     /* expecting a value */
    S_OBJ_FIRST, /* after '{': a key or '}' */
    S_OBJ_KEY,   /* after ',' in an object: a key */
    S_COLON,     /* after a key */
    S_AFTER,     /* after a value inside a container: ',' or the closer */
    S_ARR_FIRST, /* after '[': a value or ']' */
    S_STR,
    S_STR_ESC,
    S_STR_HEX,
    S_NUM,
    S_LIT,
    S_DONE,      /* the top-level value is complete */
    S_ERROR,
};

/* number sub-states; N_ZERO, N_INT, N_FRAC and N_EXP may end the number */
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

void lm_json_scan_init(lm_json_scan *js) {
    *js = (lm_json_scan){ 0 };
    js->state = S_VALUE;
}

static int fail(lm_json_scan *js) {
    js->state = S_ERROR;
    return -1;
}

static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static bool is_hex(unsigned char c) {
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* A value just ended (its depth is js->depth): back to the container, or done. */
static void value_done(lm_json_scan *js) { js->state = js->depth == 0 ? S_DONE : S_AFTER; }

static int begin_value(lm_json_scan *js, unsigned char c) {
    js->ev |= LM_JS_BEGIN;
    js->begin_depth = js->depth;
    switch (c) {
    case '{':
    case '[':
        if (js->depth == LM_JSON_MAX_DEPTH) return fail(js);
        js->stack[js->depth++] = (char)c;
        js->state = c == '{' ? S_OBJ_FIRST : S_ARR_FIRST;
        return 0;
    case '"':
        js->in_key = false;
        js->state = S_STR;
        return 0;
    case '-': js->num = N_MINUS; js->state = S_NUM; return 0;
    case '0': js->num = N_ZERO; js->state = S_NUM; return 0;
    case 't': js->lit = "true"; break;
    case 'f': js->lit = "false"; break;
    case 'n': js->lit = "null"; break;
    default:
        if (c >= '1' && c <= '9') {
            js->num = N_INT;
            js->state = S_NUM;
            return 0;
        }
        return fail(js);
    }
    js->lit_pos = 1;
    js->state = S_LIT;
    return 0;
}

static void close_container(lm_json_scan *js) {
    js->depth--;
    js->ev |= LM_JS_END;
    js->end_depth = js->depth;
    value_done(js);
}

static int begin_key(lm_json_scan *js) {
    js->ev |= LM_JS_KEY_BEGIN;
    js->in_key = true;
    js->state = S_STR;
    return 0;
}

/* One byte in the structural states (everything but strings, numbers and
 * literals). Split out so a number's terminating byte can be re-run here. */
static int structural(lm_json_scan *js, unsigned char c) {
    bool ws = lm_parse_is_ws(c);
    switch (js->state) {
    case S_VALUE:
        return ws ? 0 : begin_value(js, c);
    case S_ARR_FIRST:
        if (ws) return 0;
        if (c == ']') {
            close_container(js);
            return 0;
        }
        return begin_value(js, c);
    case S_OBJ_FIRST:
        if (ws) return 0;
        if (c == '}') {
            close_container(js);
            return 0;
        }
        return c == '"' ? begin_key(js) : fail(js);
    case S_OBJ_KEY:
        if (ws) return 0;
        return c == '"' ? begin_key(js) : fail(js);
    case S_COLON:
        if (ws) return 0;
        if (c != ':') return fail(js);
        js->state = S_VALUE;
        return 0;
    case S_AFTER: {
        if (ws) return 0;
        char top = js->stack[js->depth - 1];
        if (c == ',') {
            js->state = top == '{' ? S_OBJ_KEY : S_VALUE;
            return 0;
        }
        if ((c == '}' && top == '{') || (c == ']' && top == '[')) {
            close_container(js);
            return 0;
        }
        return fail(js);
    }
    case S_DONE:
        return ws ? 0 : fail(js);
    default:
        return fail(js);
    }
}

int lm_json_scan_byte(lm_json_scan *js, unsigned char c) {
    js->ev = 0;
    switch (js->state) {
    case S_STR:
        if (c == '"') {
            if (js->in_key) {
                js->ev |= LM_JS_KEY_END;
                js->state = S_COLON;
            } else {
                js->ev |= LM_JS_END;
                js->end_depth = js->depth;
                value_done(js);
            }
        } else if (c == '\\') {
            js->state = S_STR_ESC;
        } else if (c < 0x20) {
            return fail(js);
        }
        return 0;
    case S_STR_ESC:
        if (c == 'u') {
            js->hex_left = 4;
            js->state = S_STR_HEX;
            return 0;
        }
        if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
            js->state = S_STR;
            return 0;
        }
        return fail(js);
    case S_STR_HEX:
        if (!is_hex(c)) return fail(js);
        if (--js->hex_left == 0) js->state = S_STR;
        return 0;
    case S_LIT:
        if (c != (unsigned char)js->lit[js->lit_pos]) return fail(js);
        if (js->lit[++js->lit_pos] == 0) {
            js->ev |= LM_JS_END;
            js->end_depth = js->depth;
            value_done(js);
        }
        return 0;
    case S_NUM:
        switch (js->num) {
        case N_MINUS:
            if (c == '0') js->num = N_ZERO;
            else if (is_digit(c)) js->num = N_INT;
            else return fail(js);
            return 0;
        case N_DOT:
            if (!is_digit(c)) return fail(js);
            js->num = N_FRAC;
            return 0;
        case N_E:
            if (c == '+' || c == '-') js->num = N_ESIGN;
            else if (is_digit(c)) js->num = N_EXP;
            else return fail(js);
            return 0;
        case N_ESIGN:
            if (!is_digit(c)) return fail(js);
            js->num = N_EXP;
            return 0;
        default: /* N_ZERO, N_INT, N_FRAC, N_EXP: may continue or end here */
            if (is_digit(c) && js->num != N_ZERO) return 0;
            if (c == '.' && (js->num == N_ZERO || js->num == N_INT)) {
                js->num = N_DOT;
                return 0;
            }
            if ((c == 'e' || c == 'E') && js->num != N_EXP) {
                js->num = N_E;
                return 0;
            }
            /* the number ended before c; c belongs to what follows */
            js->ev |= LM_JS_END_BEFORE;
            js->endb_depth = js->depth;
            value_done(js);
            return structural(js, c);
        }
    case S_ERROR:
        return -1;
    default:
        return structural(js, c);
    }
}

bool lm_json_scan_end(lm_json_scan *js) {
    if (js->state == S_NUM && js->depth == 0 &&
        (js->num == N_ZERO || js->num == N_INT || js->num == N_FRAC || js->num == N_EXP))
        js->state = S_DONE;
    return js->state == S_DONE;
}

bool lm_json_valid(const char *s, size_t n) {
    lm_json_scan js;
    lm_json_scan_init(&js);
    for (size_t i = 0; i < n; i++)
        if (lm_json_scan_byte(&js, (unsigned char)s[i]) < 0) return false;
    return lm_json_scan_end(&js);
}
