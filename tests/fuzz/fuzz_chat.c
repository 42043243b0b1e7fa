/*
** fuzz_chat.c — engine/text/chat_requests.c: a request body (any JSON) rendered as each of the
** three APIs (OpenAI chat, Anthropic messages, OpenAI responses) and as detected, under the
** serving-engine profile chosen by the input's length.
*/
#include <jansson.h>

#include "engine/text/chat.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  json_error_t err;
  json_t *req = json_loadb((const char *)data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
  if (!req) return 0;
  static const st_chat_api apis[] = {ST_API_AUTO, ST_API_CHAT, ST_API_ANTHROPIC, ST_API_RESPONSES};
  for (size_t a = 0; a < sizeof apis / sizeof apis[0]; a++) {
    st_chat_options o;
    st_chat_options_default(&o);
    o.api = apis[a];
    o.profile = (st_render_profile)((size + a) % ST_RENDER_PROFILE_COUNT);
    st_chat_prompt p;
    memset(&p, 0, sizeof p);
    if (st_chat_render_request(req, &o, &p) == ST_OK) {
      if (p.n_segments < 1 || p.n_segments > 2 || p.segment_end[p.n_segments - 1] != p.len) abort();
      if (p.len && !p.text) abort();
    }
    st_chat_prompt_free(&p);
  }
  json_decref(req);
  return 0;
}
