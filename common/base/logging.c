/* logging.c: timestamped log lines on stderr. The time is ISO 8601 in UTC
 * with its date and zone (2026-12-02T03:06:01.123Z): a line read days later,
 * or beside another host's, says when it was written. */
#include "logging.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

/* What the SIGHUP handler reopens: set once before the handler is
 * installed, only read after (a handler can reach nothing else). */
static char logging_path[PATH_MAX];
static bool logging_stdout_too;

/* open and dup2 are async-signal-safe; a failure leaves the old file in
 * place, which is all a handler can do about it. */
static void on_sighup(int signo)
{
    (void)signo;
    int fd = open(logging_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (fd < 0)
        return;
    (void)dup2(fd, STDERR_FILENO);
    if (logging_stdout_too)
        (void)dup2(fd, STDOUT_FILENO);
    (void)close(fd);
}

int logging_reopen_on_sighup(void)
{
    struct stat se, so;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sa.sa_handler = SIG_IGN;
    ssize_t n = readlink("/proc/self/fd/2", logging_path, sizeof logging_path - 1);
    if (fstat(STDERR_FILENO, &se) == 0 && S_ISREG(se.st_mode) && n > 0 && logging_path[0] == '/') {
        logging_path[n] = '\0';
        logging_stdout_too = fstat(STDOUT_FILENO, &so) == 0 && so.st_dev == se.st_dev && so.st_ino == se.st_ino;
        sa.sa_handler = on_sighup;
    }
    return sigaction(SIGHUP, &sa, NULL) == 0 ? 0 : -1;
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
