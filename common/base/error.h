/* error.h: Tandem's error codes and the caller-supplied message buffer.
 *
 * Every fallible function returns 0 (ERR_OK) or one negative code from the
 * single list below. The human-readable reason travels in a caller-supplied
 * buffer `char *err` that is either NULL or holds at least ERR_MSG_MAX bytes;
 * the function that detects a failure writes it once (error_set), callers
 * pass the code up unchanged and leave the message alone.
 *
 * Messages name the thing that was wrong: the file and tensor, the config
 * key, the request field ("max_tokens: must be in 1..8192, got 0").
 */
#ifndef TANDEM_ERROR_H
#define TANDEM_ERROR_H

#include <stddef.h>

#define ERR_MSG_MAX 512

/* X(name, value, default message) */
#define ERR_LIST(X)                                                        \
    X(OK, 0, "success")                                                    \
    X(NOMEM, -1, "out of memory")                                          \
    X(IO, -2, "input/output error")                                        \
    X(FORMAT, -3, "malformed input")                                       \
    X(INVALID_ARG, -4, "invalid argument")                                 \
    X(UNSUPPORTED, -5, "unsupported")                                      \
    X(NOT_FOUND, -6, "not found")                                          \
    X(RANGE, -7, "value out of range")                                     \
    X(CONTEXT_FULL, -8, "sequence exceeds the context length")            \
    X(MISMATCH, -9, "models do not match")                                 \
    X(TIMEOUT, -10, "timed out")                                           \
    X(UNAVAILABLE, -11, "service unavailable")                             \
    X(PROTOCOL, -12, "protocol error")                                     \
    X(OVERLOADED, -13, "overloaded")                                       \
    X(CUDA, -14, "CUDA error")                                             \
    X(SYSTEM, -15, "system call failed")                                   \
    X(INTERNAL, -16, "internal error")                                     \
    X(CANCELLED, -17, "cancelled")

enum error_code {
#define ERR_ENUM_ITEM(name, value, msg) ERR_##name = (value),
    ERR_LIST(ERR_ENUM_ITEM)
#undef ERR_ENUM_ITEM
};

/* Default message of a code; never NULL ("unknown error" for a stray value). */
const char *error_str(int code);

/* Short stable identifier of a code ("invalid_arg", "context_full"), used on
 * the wire and in logs. Never NULL. */
const char *error_name(int code);

/* Formats the reason into err (when err is not NULL) and returns code, so a
 * failure site reads `return error_set(err, ERR_FORMAT, "%s: ...", path);`. */
int error_set(char *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Like error_set, but appends ": strerror(errno_value)" to the message. */
int error_set_errno(char *err, int code, int errno_value, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
