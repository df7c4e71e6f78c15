/* schema_check.c - see schema_check.h. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "schema_check.h"

#include <pcre2.h>
#include <string.h>


static size_t utf8_chars(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

static bool type_ok(const char *t, const json_t *v) {
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "integer")) return json_is_integer(v);
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    return false;
}

static bool pattern_ok(const char *re, const char *s, size_t n) {
    int err;
    PCRE2_SIZE off;
    pcre2_code *c = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &err, &off, NULL);
    if (!c) return false;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(c, NULL);
    int rc = pcre2_match(c, (PCRE2_SPTR)s, n, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(c);
    return rc >= 0;
}

bool schema_valid(const json_t *root, const json_t *s, const json_t *v) {
    if (json_is_true(s)) return true;
    const json_t *x;
    if ((x = json_object_get(s, "$ref"))) {
        const char *ref = json_string_value(x);
        const json_t *t = root;
        if (strncmp(ref, "#/$defs/", 8) == 0) t = json_object_get(json_object_get(root, "$defs"), ref + 8);
        return t && schema_valid(root, t, v);
    }
    if ((x = json_object_get(s, "const")) && !json_equal(x, v)) return false;
    if ((x = json_object_get(s, "enum"))) {
        bool any = false;
        for (size_t i = 0; i < json_array_size(x); i++) any |= json_equal(json_array_get(x, i), v);
        if (!any) return false;
    }
    if ((x = json_object_get(s, "anyOf")) || (x = json_object_get(s, "oneOf"))) {
        int n = 0;
        for (size_t i = 0; i < json_array_size(x); i++) n += schema_valid(root, json_array_get(x, i), v);
        if (n == 0 || (json_object_get(s, "oneOf") && n != 1)) return false;
    }
    if ((x = json_object_get(s, "type"))) {
        bool ok = false;
        if (json_is_string(x)) ok = type_ok(json_string_value(x), v);
        for (size_t i = 0; i < json_array_size(x); i++) ok |= type_ok(json_string_value(json_array_get(x, i)), v);
        if (!ok) return false;
    }
    if (json_is_number(v)) {
        double d = json_number_value(v);
        if ((x = json_object_get(s, "minimum")) && d < json_number_value(x)) return false;
        if ((x = json_object_get(s, "maximum")) && d > json_number_value(x)) return false;
        if ((x = json_object_get(s, "exclusiveMinimum")) && d <= json_number_value(x)) return false;
        if ((x = json_object_get(s, "exclusiveMaximum")) && d >= json_number_value(x)) return false;
    }
    if (json_is_string(v)) {
        size_t n = utf8_chars(json_string_value(v), json_string_length(v));
        if ((x = json_object_get(s, "minLength")) && n < (size_t)json_integer_value(x)) return false;
        if ((x = json_object_get(s, "maxLength")) && n > (size_t)json_integer_value(x)) return false;
        if ((x = json_object_get(s, "pattern")) && !pattern_ok(json_string_value(x), json_string_value(v), json_string_length(v)))
            return false;
    }
    if (json_is_array(v)) {
        size_t n = json_array_size(v);
        if ((x = json_object_get(s, "minItems")) && n < (size_t)json_integer_value(x)) return false;
        if ((x = json_object_get(s, "maxItems")) && n > (size_t)json_integer_value(x)) return false;
        const json_t *pi = json_object_get(s, "prefixItems"), *it = json_object_get(s, "items");
        if (pi && n != json_array_size(pi)) return false;
        for (size_t i = 0; i < n; i++) {
            const json_t *sub = pi ? json_array_get(pi, i) : it;
            if (sub && !schema_valid(root, sub, json_array_get(v, i))) return false;
        }
    }
    if (json_is_object(v)) {
        const json_t *props = json_object_get(s, "properties"), *add = json_object_get(s, "additionalProperties");
        const json_t *req = json_object_get(s, "required");
        for (size_t i = 0; i < json_array_size(req); i++)
            if (!json_object_get(v, json_string_value(json_array_get(req, i)))) return false;
        const char *k;
        const json_t *val;
        json_object_foreach((json_t *)v, k, val) {
            const json_t *ps = json_object_get(props, k);
            if (ps) {
                if (!schema_valid(root, ps, val)) return false;
            } else if (json_is_false(add)) {
                return false;
            } else if (json_is_object(add) && !schema_valid(root, add, val)) {
                return false;
            }
        }
    }
    return true;
}

