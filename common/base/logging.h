/* logging.h: leveled logging to stderr, one line per message.
 *
 * The level is checked before any formatting, so a disabled LOG_DEBUG in a
 * per-token loop costs one comparison. The level and the process tag are the
 * only process-wide state in Tandem: they describe the process, not a model.
 */
#ifndef TANDEM_LOGGING_H
#define TANDEM_LOGGING_H

enum logging_level {
    LOGGING_ERROR = 0,
    LOGGING_WARN = 1,
    LOGGING_INFO = 2,
    LOGGING_DEBUG = 3,
};

extern int logging_level_current;

void logging_set_level(enum logging_level level);
/* Parses "error", "warn", "info", "debug"; returns -1 for anything else. */
int logging_level_parse(const char *name);
/* Tag printed on each line, e.g. the process name; copied. */
void logging_set_tag(const char *tag);
void logging_write(enum logging_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Log rotation without copytruncate: when stderr is a regular file (the
 * supervisor's `>>NAME.log 2>&1`), remembers its path and installs a
 * SIGHUP handler that opens that path again (appending, created if a
 * rotation moved it away) onto stderr, and onto stdout when stdout was the
 * same file. logrotate's postrotate sends the SIGHUP (deploy/logrotate).
 * Elsewhere (a terminal, a pipe to tee or journald) SIGHUP is ignored, so
 * it never stops a process. 0, or -1 when sigaction failed. Call once, from
 * main, before threads start. */
int logging_reopen_on_sighup(void);

#define LOGGING_AT(level, ...)                        \
    do {                                              \
        if ((int)(level) <= logging_level_current)    \
            logging_write((level), __VA_ARGS__);      \
    } while (0)

#define LOG_ERROR(...) LOGGING_AT(LOGGING_ERROR, __VA_ARGS__)
#define LOG_WARN(...) LOGGING_AT(LOGGING_WARN, __VA_ARGS__)
#define LOG_INFO(...) LOGGING_AT(LOGGING_INFO, __VA_ARGS__)
#define LOG_DEBUG(...) LOGGING_AT(LOGGING_DEBUG, __VA_ARGS__)

#endif
