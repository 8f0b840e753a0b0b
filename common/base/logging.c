/* logging.c: timestamped log lines on stderr. The time is ISO 8601 in UTC
 * with its date and zone (2026-12-02T03:06:01.123Z): a line read days later,
 * or beside another host's, says when it was written. */
#include "logging.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

int logging_level_current = LOGGING_INFO;
static char logging_tag[32] = "tandem";

void logging_set_level(enum logging_level level) { logging_level_current = (int)level; }

int logging_level_parse(const char *name)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (name && strcmp(name, names[i]) == 0)
            return i;
    return -1;
}

void logging_set_tag(const char *tag)
{
    snprintf(logging_tag, sizeof logging_tag, "%s", tag ? tag : "tandem");
}

void logging_write(enum logging_level level, const char *fmt, ...)
{
    static const char *level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    char line[2048];
    struct timespec now;
    struct tm tm_utc;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm_utc);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s: ", tm_utc.tm_year + 1900,
                     tm_utc.tm_mon + 1, tm_utc.tm_mday, tm_utc.tm_hour, tm_utc.tm_min, tm_utc.tm_sec,
                     now.tv_nsec / 1000000L, logging_tag,
                     level_names[level < 0 || level > 3 ? 0 : level]);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && n < (int)sizeof line)
        vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    /* One fputs per line keeps lines from concurrent threads whole. */
    size_t len = strlen(line);
    if (len + 1 < sizeof line) {
        line[len] = '\n';
        line[len + 1] = '\0';
    }
    fputs(line, stderr);
}
