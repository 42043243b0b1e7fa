/*
** json_oom.h — telling jansson's "out of memory" from a syntax error.
**
** jansson 2.14 reports most allocation failures inside a load as syntax errors at the place the
** lexer was ("string or '}' expected near ..."), some with an empty text at line -1; only a few set
** json_error_out_of_memory. malloc sets errno to ENOMEM when it fails and a parse error leaves
** errno alone, so a caller sets errno = 0 before the load and asks here when it returns NULL.
** Header-only: common/ does not link jansson, the units that include this do.
*/
#ifndef ST_JSON_OOM_H
#define ST_JSON_OOM_H

#include <errno.h>
#include <jansson.h>

/* 1 when the jansson load that just returned NULL (errno cleared before it) ran out of memory. */
static inline int st_json_out_of_memory(const json_error_t *err) {
  return errno == ENOMEM || (err && json_error_code(err) == json_error_out_of_memory);
}

#endif
