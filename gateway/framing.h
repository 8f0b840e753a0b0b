/* framing.h: what the gateway decides from a request's head alone, before
 * any body byte is read: whether its headers say plainly where its body
 * ends (RFC 9112 6.1, 6.3), whether its Host is single, and whether its
 * target is one the gateway serves. A request refused here is answered
 * and its connection closed: what follows its headers cannot be trusted to
 * be a body or a request (request smuggling behind a proxy that reads the
 * framing the other way).
 *
 * Called from libmicrohttpd's callbacks of the connection (its event-loop
 * thread); no state of its own.
 */
#ifndef TANDEM_GATEWAY_FRAMING_H
#define TANDEM_GATEWAY_FRAMING_H

#include <stdbool.h>
#include <stddef.h>

#include <microhttpd.h>

#include "openai.h"

/* The path of a request target (url as libmicrohttpd passes it): the
 * target itself in origin form ("/health"), the part after the authority
 * in absolute form ("http://host/health"); NULL for any other form. */
const char *framing_path_of(const char *url);

/* libmicrohttpd's MHD_OPTION_UNESCAPE_CALLBACK: percent-decodes s in place
 * and returns its length; a target that decodes to a NUL byte becomes "". */
size_t framing_unescape(void *cls, struct MHD_Connection *conn, char *s);

/* True, with e set (status 400 or 501, an OpenAI error), when the request
 * must be refused: Content-Length repeated or beside Transfer-Encoding, a
 * transfer coding other than chunked or chunked twice, Transfer-Encoding
 * in HTTP/1.0, no Host in HTTP/1.1 or two, a target that is empty, holds a
 * decoded NUL, or is neither a path nor an absolute URL. From the first
 * call of the access handler (the headers are in, no body byte read). */
bool framing_refused(struct MHD_Connection *conn, const char *url, const char *version, struct openai_error *e);

#endif
