/* prom_text.h: Prometheus' text exposition format (version 0.0.4), written
 * once for every process that serves metrics (the coordinator's
 * metrics_prometheus, the gateway's /metrics): a growing buffer, the HELP
 * and TYPE lines of a family, samples with optional labels, histograms,
 * and label values escaped as the format wants.
 *
 * Out of memory is sticky: every later call does nothing and
 * prom_text_finish reports it, so a writer checks once at the end.
 */
#ifndef TANDEM_PROM_TEXT_H
#define TANDEM_PROM_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct prom_text {
    char *buf;               /* NUL-terminated while not failed; malloc'd */
    size_t len, cap;
    bool failed;
};

/* A histogram as the format shows it: n_bounds upper bounds (ascending)
 * with counts[i] observations in bucket i (not cumulative), and
 * counts[n_bounds] above the last bound. le_text, when not NULL, gives each
 * bound's label text (else "%g" of the bound). */
struct prom_histogram {
    const double *bounds;
    const char *const *le_text;
    const uint64_t *counts;
    int n_bounds;
    double sum;
    uint64_t count;
};

/* Starts t empty, or appending to a buffer of len bytes (buf malloc'd,
 * NUL-terminated; NULL: empty). */
void prom_text_init(struct prom_text *t, char *buf, size_t len);

/* Appends printf-style text. */
void prom_printf(struct prom_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The "# HELP" and "# TYPE" lines of family name (type: counter, gauge,
 * histogram). */
void prom_family(struct prom_text *t, const char *name, const char *type, const char *help);

/* One sample: name{labels} v, labels the text inside the braces (already
 * escaped; NULL or "": none), v in full (%.17g: integers as integers). */
void prom_sample(struct prom_text *t, const char *name, const char *labels, double v);

/* A family with its one unlabelled sample. */
void prom_single(struct prom_text *t, const char *name, const char *type, const char *help, double v);

/* A family with its one sample, labelled (labels as prom_sample's). */
void prom_single_labelled(struct prom_text *t, const char *name, const char *type, const char *help,
                          const char *labels, double v);

/* A whole histogram family: buckets (cumulative, +Inf last), _sum, _count,
 * each with labels before le (NULL or "": none). */
void prom_histogram(struct prom_text *t, const char *name, const char *help, const char *labels,
                    const struct prom_histogram *h);

/* v as a label value (backslash, double quote and line feed escaped);
 * NULL when out of memory; the caller frees. */
char *prom_label_value(const char *v);

/* Hands the text over: 0 with *buf and *len set (the caller frees *buf), or
 * ERR_NOMEM (err set, the text freed). */
int prom_text_finish(struct prom_text *t, char **buf, size_t *len, char *err);

#endif
