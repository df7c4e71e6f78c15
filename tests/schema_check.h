/* schema_check.h - a JSON Schema validator for the subset lumen's grammars
 * support (tests only): types, enum/const, anyOf/oneOf, $ref into $defs,
 * number bounds, string lengths and patterns (PCRE2), array bounds and
 * items / prefixItems, required / properties / additionalProperties. */
#ifndef SCHEMA_CHECK_H
#define SCHEMA_CHECK_H

#include <jansson.h>
#include <stdbool.h>

/* Whether v is valid against schema s of the document root. */
bool schema_valid(const json_t *root, const json_t *s, const json_t *v);

#endif
