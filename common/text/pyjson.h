/* pyjson.h: JSON text as Python's json.dumps writes it, which is what the
 * `tojson` filter of HF transformers' chat templates produces
 * (json.dumps(x, ensure_ascii=False, indent=indent)).
 *
 * Layout: without indent, ", " between items and ": " after keys; with
 * indent N, one item a line indented N spaces a level, "," at line ends,
 * "{}" and "[]" for empty containers. Strings: '"', '\\', \b \f \n \r \t
 * escaped, other bytes below 0x20 as \u00XX (lower-case hex), everything
 * else (non-ASCII, DEL) raw. Keys in the object's order.
 * Numbers: cJSON keeps a double, not the text, so an integral value within
 * 2^53 is written as an integer (Python would write "1.0" for a float 1.0
 * given as "1.0"); any other the shortest text that reads back the same, in
 * Python's repr form ("0.5", "1e-05", "1e+16").
 */
#ifndef TANDEM_PYJSON_H
#define TANDEM_PYJSON_H

#include <stddef.h>

struct cJSON;

/* Writes v to a malloc'd NUL-terminated string (*out, *len bytes). indent
 * < 0: no indent. Returns 0, ERR_INVALID_ARG (a non-finite number, an
 * invalid cJSON item) or ERR_NOMEM. */
int pyjson_dump(const struct cJSON *v, int indent, char **out, size_t *len);

#endif
