/* json_type.h: the name of a cJSON value's type, for error messages that say
 * what was found where something else was expected ("expected a number, got
 * string"). Shared by every parser of peer and file input. */
#ifndef TANDEM_JSON_TYPE_H
#define TANDEM_JSON_TYPE_H

#include <cjson/cJSON.h>

/* "null", "boolean", "number", "string", "array", "object", or "invalid"
 * (also for NULL). Never NULL; a static string. */
const char *json_type_name(const cJSON *item);

#endif
