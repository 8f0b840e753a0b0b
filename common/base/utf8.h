/* utf8.h: UTF-8 as Unicode defines it (well-formed sequences per Table 3-7:
 * no overlong forms, no surrogates, nothing above U+10FFFF).
 *
 * Pure functions over byte arrays with explicit lengths (NUL is an ordinary
 * character); no allocation, no state.
 */
#ifndef TANDEM_UTF8_H
#define TANDEM_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length (1..4) of the well-formed sequence at s[0..n), or 0 when s[0]
 * does not start one (n >= 1). */
size_t utf8_valid_len(const uint8_t *s, size_t n);

/* The code point at s[0..n) and its length in *adv; 0xFFFFFFFF with
 * *adv = 1 where the bytes are not well formed. */
uint32_t utf8_next_cp(const uint8_t *s, size_t n, size_t *adv);

/* Replaces each maximal invalid subsequence of in[0..n) by U+FFFD (as
 * Rust's String::from_utf8_lossy). `out` must hold 3*n bytes; returns the
 * number of bytes written. */
size_t utf8_repair(const uint8_t *in, size_t n, uint8_t *out);

/* 1 if in[0..n) is valid UTF-8; otherwise 0 and *bad_offset (if not NULL)
 * is the offset of the first invalid byte. */
int utf8_valid(const uint8_t *in, size_t n, size_t *bad_offset);

/* Number of bytes at the end of in[0..n) that form an incomplete but so far
 * valid sequence (0..3): what a streaming decoder must hold back. */
size_t utf8_incomplete_tail(const uint8_t *in, size_t n);

/* Length of the longest prefix of s[0..n) of at most max bytes that does not
 * end inside a character: where client text is quoted in a message, cut it
 * there ("%.*s"). An invalid byte counts as one character of its own (the
 * text is repaired or rejected elsewhere). */
size_t utf8_cut_len(const uint8_t *s, size_t n, size_t max);

#endif
