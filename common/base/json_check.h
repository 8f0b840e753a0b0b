/* json_check.h: a strict validation pass over JSON text from a peer, run
 * before cJSON parses it.
 *
 * What it is: one pass over bytes with an explicit length that accepts
 * exactly RFC 8259 JSON, with these additions that cJSON does not check:
 *   - the text is valid UTF-8 (utf8.h), inside strings and out;
 *   - no raw control character (U+0000..U+001F) inside a string;
 *   - no \u0000 escape (a C string would silently end there);
 *   - no lone or reversed UTF-16 surrogate escape;
 *   - no key given twice in one object, at any depth (keys are compared
 *     after unescaping: "a" and "\u0061" are the same key);
 *   - nesting at most JSON_CHECK_DEPTH_MAX deep.
 * After the value only whitespace and NUL bytes may follow (some clients
 * send a trailing NUL).
 * What it is not: a parser; it builds no tree. Text it accepts is parsed by
 * cJSON to the same values.
 *
 * Messages name what was wrong and where: "invalid UTF-8 at offset 12",
 * "raw control character 0x0a in a string at offset 40 (escape it)",
 * "\\u0000 in a string at offset 7: NUL characters are not accepted",
 * "messages[0].role: given more than once (duplicate key)". Client text in a message (a key
 * path) is valid UTF-8, cut at a character boundary.
 */
#ifndef TANDEM_JSON_CHECK_H
#define TANDEM_JSON_CHECK_H

#include <stddef.h>

#define JSON_CHECK_DEPTH_MAX 64

/* 0 when data[0..len) is acceptable. ERR_FORMAT when it is not JSON as
 * above (syntax, encoding, control characters, \u0000, depth); ERR_INVALID_ARG
 * when it is well-formed but an object repeats a key (then cJSON can still
 * parse it, e.g. to read the request's id for the error reply); ERR_NOMEM.
 * The reason goes to err (NULL or ERR_MSG_MAX bytes). */
int json_check(const char *data, size_t len, char *err);

#endif
