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
