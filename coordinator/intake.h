/* intake.h: client messages in: the envelope, generate requests (validation,
 * tokenization, the sequence record) and stats requests. */
#ifndef TANDEM_INTAKE_H
#define TANDEM_INTAKE_H

#include "coord_state.h"

/* Reads one client message (routing id + one frame) and answers it. */
void intake_on_message(struct coordinator *c);

#endif
