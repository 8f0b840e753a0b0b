/* json_type.c: see json_type.h. */
#include "json_type.h"

const char *json_type_name(const cJSON *item)
{
    if (cJSON_IsNull(item))
        return "null";
    if (cJSON_IsBool(item))
        return "boolean";
    if (cJSON_IsNumber(item))
        return "number";
    if (cJSON_IsString(item))
        return "string";
    if (cJSON_IsArray(item))
        return "array";
    if (cJSON_IsObject(item))
        return "object";
    return "invalid";
}
