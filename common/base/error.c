/* error.c: the error-code table's strings and the message-buffer helpers. */
#include "error.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "utf8.h"

/* A message cut at ERR_MSG_MAX must not end inside a UTF-8 character: it
 * may quote client text and end up in a JSON reply. */
static void trim_cut(char *err, int n)
{
    if (n >= ERR_MSG_MAX) {
        size_t len = strlen(err);
        err[len - utf8_incomplete_tail((const uint8_t *)err, len)] = '\0';
    }
}

const char *error_str(int code)
{
    switch (code) {
#define ERR_STR_CASE(name, value, msg) \
    case (value): return (msg);
        ERR_LIST(ERR_STR_CASE)
#undef ERR_STR_CASE
    }
    return "unknown error";
}

const char *error_name(int code)
{
    switch (code) {
#define ERR_NAME_CASE(name, value, msg) \
    case (value): return #name;
        ERR_LIST(ERR_NAME_CASE)
#undef ERR_NAME_CASE
    }
    return "UNKNOWN";
}

int error_set(char *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(err, ERR_MSG_MAX, fmt, ap);
        va_end(ap);
        trim_cut(err, n);
    }
    return code;
}

int error_set_errno(char *err, int code, int errno_value, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(err, ERR_MSG_MAX, fmt, ap);
        va_end(ap);
        if (n >= 0 && n < ERR_MSG_MAX)
            n += snprintf(err + n, (size_t)(ERR_MSG_MAX - n), ": %s", strerror(errno_value));
        trim_cut(err, n);
    }
    return code;
}
