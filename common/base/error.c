/* error.c: the error-code table's strings and the message-buffer helpers. */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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
        vsnprintf(err, ERR_MSG_MAX, fmt, ap);
        va_end(ap);
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
            snprintf(err + n, (size_t)(ERR_MSG_MAX - n), ": %s", strerror(errno_value));
    }
    return code;
}
