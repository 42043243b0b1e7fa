/*
** fake_upstream.c — a loopback stand-in for the Anthropic and OpenAI APIs, for the capture
** proxy's tests and benchmark. Not a test itself (built as a helper executable).
**
**   fake_upstream [--port N] [--port-file FILE]     (N = 0 picks a free port; default 0)
**
** Prints "listening PORT" on stdout once ready (and writes PORT to FILE if asked), then serves
** until killed or until the process that started it is gone. Plain sockets and one thread per connection, so that the tests can make it
** misbehave in ways a web framework would not allow: reset the connection mid-stream, close it
** without ending the chunked body, stall, or notice that its client went away.
**
** Endpoints (any path prefix): POST .../v1/messages (Anthropic), .../chat/completions,
** .../completions, .../responses (OpenAI), .../messages/count_tokens; GET .../models;
** GET /_fake/stats -> {"requests":N,"cancelled":N,"streams_completed":N}. A request body that
** is not JSON gets a 400 in the API's shape, as the real servers do. "stream": true in the body
** selects SSE (chunked, one event per write), otherwise one JSON body with Content-Length.
** Everything answered is a deterministic function of the request (ids hash the body), so the same
** request gives the same bytes directly and through the proxy.
**
** Behaviour is steered by request headers (the proxy forwards them untouched):
**   x-fake-events: N         text deltas to send (default 5)
**   x-fake-delta-bytes: B    size of each text delta (default: a short word)
**   x-fake-interval-ms: M    pause between events (default 0)
**   x-fake-first-ms: M       pause before the response head
**   x-fake-tool: 1           add a tool call (split across argument deltas)
**   x-fake-split: 1          write every event in two pieces, cut mid-line, 5 ms apart
**   x-fake-status: S         answer S with the API's error body instead
**   x-fake-fail: reset-before-head | reset-mid-stream | close-mid-stream
**   x-fake-stall-after: K    after K events (or before the head if K < 0) ...
**   x-fake-stall-ms: M       ... go silent for M ms (watching for the client leaving)
**   x-fake-echo: 1           answer {"method","path","query","headers","body"} as received, plus
**                            what an upstream refusing credentials may quote back: "decoded"
**                            {"basic": user:password of an Authorization: Basic, "query": the
**                            %-decoded query} and "encoded": every header value %-encoded
**   x-fake-prompt-ids: [..]  the prompt token ids to return when the body asks for them (below)
**
** Prompt token ids, only when the body asks for them the way the serving engines read it:
** "return_token_ids": true (vLLM; sglang's /v1/completions) or "return_prompt_token_ids": true
** (sglang's /v1/chat/completions). They come back as the engines send them: vLLM chat at the top
** level ("prompt_token_ids" of the chat.completion, or of the first chunk of a stream), sglang chat
** and every /v1/completions answer in choices[0].prompt_token_ids (the first chunk of a stream);
** sglang refuses return_prompt_token_ids on a streaming chat request with a 400. The ids are the
** x-fake-prompt-ids header's JSON array when given, else a made-up list of body_len/4 ids; the
** usage's prompt count is then their number. Messages and responses answers never carry ids.
*/
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

static atomic_long stat_requests, stat_cancelled, stat_completed;

typedef struct request {
  char method[16];
  char path[2048];
  char query[2048];
  char *names[256], *values[256];
  int n_headers;
  char *body;
  size_t body_len;
  int close_after;
} request;

typedef struct conn {
  int fd;
  char buf[1 << 16];
  size_t len;
  int peer_gone;
} conn;

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static const char *header(const request *r, const char *name) {
  for (int i = 0; i < r->n_headers; i++)
    if (!strcasecmp(r->names[i], name)) return r->values[i];
  return NULL;
}
static int header_int(const request *r, const char *name, int dflt) {
  const char *v = header(r, name);
  return v ? atoi(v) : dflt;
}

static int send_all(conn *c, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      c->peer_gone = 1;
      return -1;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Sleeps up to ms, returning -1 early if the peer closed its end (cancellation). */
static int watchful_sleep(conn *c, int ms) {
  for (int waited = 0; waited < ms; waited += 10) {
    struct pollfd p = {.fd = c->fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
      c->peer_gone = 1;
      return -1;
    }
    sleep_ms(ms - waited < 10 ? ms - waited : 10);
  }
  return 0;
}

static void hard_reset(conn *c) {
  struct linger l = {1, 0};
  setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  close(c->fd);
  c->fd = -1;
}

/* Reads one request (head + Content-Length body). 0 ok, -1 connection over. */
static int read_request(conn *c, request *r) {
  memset(r, 0, sizeof *r);
  char *end;
  while (!(end = memmem(c->buf, c->len, "\r\n\r\n", 4))) {
    if (c->len == sizeof c->buf) return -1;
    ssize_t n = recv(c->fd, c->buf + c->len, sizeof c->buf - c->len, 0);
    if (n <= 0) return -1;
    c->len += (size_t)n;
  }
  size_t head_len = (size_t)(end - c->buf) + 4;
  char *head = strndup(c->buf, head_len);
  char *save = NULL, *line = strtok_r(head, "\r\n", &save);
  char target[4096] = "";
  if (!line || sscanf(line, "%15s %4095s", r->method, target) != 2) {
    free(head);
    return -1;
  }
  char *q = strchr(target, '?');
  if (q) {
    *q = 0;
    snprintf(r->query, sizeof r->query, "%s", q + 1);
  }
  snprintf(r->path, sizeof r->path, "%s", target);
  while ((line = strtok_r(NULL, "\r\n", &save)) && r->n_headers < 256) {
    char *colon = strchr(line, ':');
    if (!colon) continue;
    *colon = 0;
    char *v = colon + 1;
    while (*v == ' ' || *v == '\t') v++;
    r->names[r->n_headers] = strdup(line);
    r->values[r->n_headers] = strdup(v);
    r->n_headers++;
  }
  free(head);
  const char *cl = header(r, "content-length");
  size_t want = cl ? strtoull(cl, NULL, 10) : 0;
  const char *connection = header(r, "connection");
  r->close_after = connection && !strcasecmp(connection, "close");
  memmove(c->buf, c->buf + head_len, c->len - head_len);
  c->len -= head_len;
  r->body = malloc(want + 1);
  size_t have = 0;
  while (have < want) {
    if (c->len > 0) {
      size_t take = c->len < want - have ? c->len : want - have;
      memcpy(r->body + have, c->buf, take);
      memmove(c->buf, c->buf + take, c->len - take);
      c->len -= take;
      have += take;
      continue;
    }
    ssize_t n = recv(c->fd, c->buf, sizeof c->buf, 0);
    if (n <= 0) return -1;
    c->len = (size_t)n;
  }
  r->body[want] = 0;
  r->body_len = want;
  return 0;
}

static void free_request(request *r) {
  for (int i = 0; i < r->n_headers; i++) {
    free(r->names[i]);
    free(r->values[i]);
  }
  free(r->body);
}

static int send_response(conn *c, int status, const char *type, const char *body) {
  char head[512];
  int n = snprintf(head, sizeof head,
                   "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                   "request-id: req_fake\r\n\r\n",
                   status, status == 200 ? "OK" : "Error", type, strlen(body));
  if (send_all(c, head, (size_t)n) < 0) return -1;
  return send_all(c, body, strlen(body));
}

static int send_json(conn *c, int status, json_t *j) {
  char *s = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  int rc = send_response(c, status, "application/json", s);
  free(s);
  return rc;
}

typedef enum api { API_ANTHROPIC, API_CHAT, API_COMPLETIONS, API_RESPONSES } api;

static json_t *api_error(api a, int status, const char *msg) {
  if (a == API_ANTHROPIC)
    return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type",
                     status == 529 ? "overloaded_error" : status >= 500 ? "api_error"
                                                                        : "invalid_request_error",
                     "message", msg);
  return json_pack("{s:{s:s, s:s, s:n, s:n}}", "error", "message", msg, "type",
                   status >= 500 ? "server_error" : "invalid_request_error", "param", "code");
}

/* ---- prompt token ids ----------------------------------------------------------------------- */

typedef struct ids_ask {
  json_t *ids;   /* the ids to return; NULL: the request did not ask */
  int top_level; /* vLLM chat: at the top level of the answer; else in choices[0] */
} ids_ask;

static void attach_prompt_ids(json_t *answer, const ids_ask *ask) {
  if (!ask || !ask->ids) return;
  if (ask->top_level) {
    json_object_set(answer, "prompt_token_ids", ask->ids);
  } else {
    json_t *choice = json_array_get(json_object_get(answer, "choices"), 0);
    if (choice) json_object_set(choice, "prompt_token_ids", ask->ids);
  }
}

/* ---- streaming -------------------------------------------------------------------------- */

typedef struct streamer {
  conn *c;
  const request *r;
  const ids_ask *ask; /* prompt ids go into the first event */
  int interval_ms, split, stall_after, stall_ms;
  int sent;      /* events written */
  int fail_at;   /* event index at which to fail (-1 never) */
  const char *fail;
} streamer;

/* Writes one SSE event as one chunk (or two, when splitting). -1 when the exchange is over. */
static int emit(streamer *s, const char *event, json_t *data) {
  if (s->fail && s->sent == s->fail_at) {
    if (!strcmp(s->fail, "reset-mid-stream")) hard_reset(s->c);
    else shutdown(s->c->fd, SHUT_RDWR);
    return -1;
  }
  if (s->stall_ms > 0 && s->sent == s->stall_after && watchful_sleep(s->c, s->stall_ms) < 0) {
    atomic_fetch_add(&stat_cancelled, 1);
    return -1;
  }
  if (s->sent > 0 && s->interval_ms > 0 && watchful_sleep(s->c, s->interval_ms) < 0) {
    atomic_fetch_add(&stat_cancelled, 1);
    return -1;
  }
  if (s->sent == 0) attach_prompt_ids(data, s->ask);
  char *d = json_dumps(data, JSON_COMPACT);
  json_decref(data);
  char *text = NULL;
  int n = event ? asprintf(&text, "event: %s\ndata: %s\n\n", event, d)
                : asprintf(&text, "data: %s\n\n", d);
  free(d);
  if (n < 0) return -1;
  int pieces = s->split ? 2 : 1;
  size_t cut = s->split ? (size_t)n / 2 : (size_t)n;
  int rc = 0;
  for (int i = 0; i < pieces && rc == 0; i++) {
    const char *p = text + (i ? cut : 0);
    size_t len = i ? (size_t)n - cut : cut;
    char frame[32];
    int fl = snprintf(frame, sizeof frame, "%zx\r\n", len);
    if (send_all(s->c, frame, (size_t)fl) < 0 || send_all(s->c, p, len) < 0 ||
        send_all(s->c, "\r\n", 2) < 0)
      rc = -1;
    if (i == 0 && pieces == 2) sleep_ms(5);
  }
  free(text);
  if (rc < 0) atomic_fetch_add(&stat_cancelled, 1);
  s->sent++;
  return rc;
}

static int emit_raw_done(streamer *s) {
  const char *done = "data: [DONE]\n\n";
  char frame[32];
  int fl = snprintf(frame, sizeof frame, "%zx\r\n", strlen(done));
  return send_all(s->c, frame, (size_t)fl) || send_all(s->c, done, strlen(done)) ||
                 send_all(s->c, "\r\n", 2)
             ? -1
             : 0;
}

static char *delta_text(int i, int bytes) {
  char *t;
  if (bytes > 0) {
    t = malloc((size_t)bytes + 1);
    for (int k = 0; k < bytes; k++) t[k] = (char)('a' + (i + k) % 26);
    t[bytes] = 0;
  } else if (i == 0) {
    t = strdup("Héllo 🌍 ");
  } else if (asprintf(&t, "w%d ", i) < 0) {
    t = NULL;
  }
  return t;
}

static const char *tool_pieces[] = {"{\"location\": \"San", " Francisco\", \"unit\": \"c\"}"};

static void stream_anthropic(streamer *s, const char *id, const char *model, int in_tokens,
                             int events, int bytes, int tool) {
  char tool_id[128];
  snprintf(tool_id, sizeof tool_id, "toolu_%s", id + 4);
  if (emit(s, "message_start",
           json_pack("{s:s, s:{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:{s:i, s:i}}}", "type",
                     "message_start", "message", "id", id, "type", "message", "role", "assistant",
                     "model", model, "content", "stop_reason", "stop_sequence", "usage",
                     "input_tokens", in_tokens, "output_tokens", 1)) ||
      emit(s, "content_block_start",
           json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_start", "index", 0,
                     "content_block", "type", "text", "text", "")) ||
      emit(s, "ping", json_pack("{s:s}", "type", "ping")))
    return;
  for (int i = 0; i < events; i++) {
    char *t = delta_text(i, bytes);
    int rc = emit(s, "content_block_delta",
                  json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index", 0,
                            "delta", "type", "text_delta", "text", t));
    free(t);
    if (rc) return;
  }
  if (emit(s, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", 0)))
    return;
  if (tool) {
    if (emit(s, "content_block_start",
             json_pack("{s:s, s:i, s:{s:s, s:s, s:s, s:{}}}", "type", "content_block_start",
                       "index", 1, "content_block", "type", "tool_use", "id", tool_id, "name",
                       "get_weather", "input")))
      return;
    for (int k = 0; k < 2; k++)
      if (emit(s, "content_block_delta",
               json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index", 1,
                         "delta", "type", "input_json_delta", "partial_json", tool_pieces[k])))
        return;
    if (emit(s, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", 1)))
      return;
  }
  if (emit(s, "message_delta",
           json_pack("{s:s, s:{s:s, s:n}, s:{s:i}}", "type", "message_delta", "delta",
                     "stop_reason", tool ? "tool_use" : "end_turn", "stop_sequence", "usage",
                     "output_tokens", events)) ||
      emit(s, "message_stop", json_pack("{s:s}", "type", "message_stop")))
    return;
  atomic_fetch_add(&stat_completed, 1);
}

static json_t *chat_chunk(const char *id, const char *model, json_t *delta, const char *finish) {
  return json_pack("{s:s, s:s, s:i, s:s, s:[{s:i, s:o, s:n, s:s?}]}", "id", id, "object",
                   "chat.completion.chunk", "created", 1700000000, "model", model, "choices",
                   "index", 0, "delta", delta, "logprobs", "finish_reason", finish);
}

static void stream_chat(streamer *s, const char *id, const char *model, int in_tokens, int events,
                        int bytes, int tool, int usage) {
  char call_id[128];
  snprintf(call_id, sizeof call_id, "call_%s", id + 9);
  if (emit(s, NULL, chat_chunk(id, model, json_pack("{s:s, s:s}", "role", "assistant", "content", ""), NULL)))
    return;
  for (int i = 0; i < events; i++) {
    char *t = delta_text(i, bytes);
    int rc = emit(s, NULL, chat_chunk(id, model, json_pack("{s:s}", "content", t), NULL));
    free(t);
    if (rc) return;
  }
  if (tool) {
    if (emit(s, NULL, chat_chunk(id, model,
                                 json_pack("{s:[{s:i, s:s, s:s, s:{s:s, s:s}}]}", "tool_calls",
                                           "index", 0, "id", call_id, "type", "function",
                                           "function", "name", "get_weather", "arguments", ""),
                                 NULL)))
      return;
    for (int k = 0; k < 2; k++)
      if (emit(s, NULL, chat_chunk(id, model,
                                   json_pack("{s:[{s:i, s:{s:s}}]}", "tool_calls", "index", 0,
                                             "function", "arguments", tool_pieces[k]),
                                   NULL)))
        return;
  }
  if (emit(s, NULL, chat_chunk(id, model, json_object(), tool ? "tool_calls" : "stop"))) return;
  if (usage && emit(s, NULL, json_pack("{s:s, s:s, s:i, s:s, s:[], s:{s:i, s:i, s:i}}", "id", id,
                                       "object", "chat.completion.chunk", "created", 1700000000,
                                       "model", model, "choices", "usage", "prompt_tokens",
                                       in_tokens, "completion_tokens", events, "total_tokens",
                                       in_tokens + events)))
    return;
  if (emit_raw_done(s) == 0) atomic_fetch_add(&stat_completed, 1);
}

static void stream_completions(streamer *s, const char *id, const char *model, int events,
                               int bytes) {
  for (int i = 0; i <= events; i++) {
    char *t = i < events ? delta_text(i, bytes) : strdup("");
    int rc = emit(s, NULL, json_pack("{s:s, s:s, s:i, s:s, s:[{s:s, s:i, s:n, s:s?}]}", "id", id,
                                     "object", "text_completion", "created", 1700000000, "model",
                                     model, "choices", "text", t, "index", 0, "logprobs",
                                     "finish_reason", i < events ? NULL : "length"));
    free(t);
    if (rc) return;
  }
  if (emit_raw_done(s) == 0) atomic_fetch_add(&stat_completed, 1);
}

static json_t *responses_object(const char *id, const char *model, const char *status,
                                json_t *output, json_t *usage) {
  return json_pack("{s:s, s:s, s:i, s:s, s:s, s:o, s:o}", "id", id, "object", "response",
                   "created_at", 1700000000, "status", status, "model", model, "output", output,
                   "usage", usage ? usage : json_null());
}

static void stream_responses(streamer *s, const char *id, const char *model, int in_tokens,
                             int events, int bytes, int tool) {
  int seq = 0;
  char msg_id[128], fc_id[128], call_id[128];
  snprintf(msg_id, sizeof msg_id, "msg_%s", id + 5);
  snprintf(fc_id, sizeof fc_id, "fc_%s", id + 5);
  snprintf(call_id, sizeof call_id, "call_%s", id + 5);
  json_t *text = json_string("");
  if (emit(s, "response.created",
           json_pack("{s:s, s:i, s:o}", "type", "response.created", "sequence_number", seq++,
                     "response", responses_object(id, model, "in_progress", json_array(), NULL))))
    goto out;
  if (emit(s, "response.output_item.added",
           json_pack("{s:s, s:i, s:i, s:{s:s, s:s, s:s, s:s, s:[]}}", "type",
                     "response.output_item.added", "sequence_number", seq++, "output_index", 0,
                     "item", "id", msg_id, "type", "message", "status", "in_progress", "role",
                     "assistant", "content")))
    goto out;
  for (int i = 0; i < events; i++) {
    char *t = delta_text(i, bytes);
    json_t *joined = json_sprintf("%s%s", json_string_value(text), t);
    json_decref(text);
    text = joined;
    int rc = emit(s, "response.output_text.delta",
                  json_pack("{s:s, s:i, s:s, s:i, s:i, s:s}", "type", "response.output_text.delta",
                            "sequence_number", seq++, "item_id", msg_id, "output_index", 0,
                            "content_index", 0, "delta", t));
    free(t);
    if (rc) goto out;
  }
  json_t *msg_item = json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:O, s:[]}]}", "id", msg_id, "type",
                               "message", "status", "completed", "role", "assistant", "content",
                               "type", "output_text", "text", text, "annotations");
  if (emit(s, "response.output_item.done",
           json_pack("{s:s, s:i, s:i, s:O}", "type", "response.output_item.done",
                     "sequence_number", seq++, "output_index", 0, "item", msg_item))) {
    json_decref(msg_item);
    goto out;
  }
  json_t *output = json_array();
  json_array_append_new(output, msg_item);
  if (tool) {
    if (emit(s, "response.output_item.added",
             json_pack("{s:s, s:i, s:i, s:{s:s, s:s, s:s, s:s, s:s, s:s}}", "type",
                       "response.output_item.added", "sequence_number", seq++, "output_index", 1,
                       "item", "id", fc_id, "type", "function_call", "status", "in_progress",
                       "arguments", "", "call_id", call_id, "name", "get_weather"))) {
      json_decref(output);
      goto out;
    }
    for (int k = 0; k < 2; k++)
      if (emit(s, "response.function_call_arguments.delta",
               json_pack("{s:s, s:i, s:s, s:i, s:s}", "type",
                         "response.function_call_arguments.delta", "sequence_number", seq++,
                         "item_id", fc_id, "output_index", 1, "delta", tool_pieces[k]))) {
        json_decref(output);
        goto out;
      }
    char args[128];
    snprintf(args, sizeof args, "%s%s", tool_pieces[0], tool_pieces[1]);
    json_array_append_new(output, json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "id", fc_id, "type",
                                            "function_call", "status", "completed", "arguments",
                                            args, "call_id", call_id, "name", "get_weather"));
  }
  if (emit(s, "response.completed",
           json_pack("{s:s, s:i, s:o}", "type", "response.completed", "sequence_number", seq++,
                     "response",
                     responses_object(id, model, "completed", output,
                                      json_pack("{s:i, s:i, s:i}", "input_tokens", in_tokens,
                                                "output_tokens", events, "total_tokens",
                                                in_tokens + events)))))
    goto out;
  atomic_fetch_add(&stat_completed, 1);
out:
  json_decref(text);
}

/* ---- non-streaming answers ------------------------------------------------------------------ */

static char *full_text(int events, int bytes) {
  size_t cap = 64 + (size_t)events * (size_t)(bytes > 16 ? bytes + 1 : 17);
  char *all = calloc(1, cap);
  for (int i = 0; i < events; i++) {
    char *t = delta_text(i, bytes);
    strcat(all, t);
    free(t);
  }
  return all;
}

static int whole_answer(conn *c, api a, const char *id, const char *model, int in_tokens,
                        int events, int bytes, int tool, const ids_ask *ask) {
  char *text = full_text(events, bytes);
  char args[128];
  snprintf(args, sizeof args, "%s%s", tool_pieces[0], tool_pieces[1]);
  json_t *j = NULL;
  if (a == API_ANTHROPIC) {
    json_t *content = json_pack("[{s:s, s:s}]", "type", "text", "text", text);
    if (tool) {
      char tool_id[128];
      snprintf(tool_id, sizeof tool_id, "toolu_%s", id + 4);
      json_array_append_new(content, json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id",
                                               tool_id, "name", "get_weather", "input",
                                               json_loads(args, 0, NULL)));
    }
    j = json_pack("{s:s, s:s, s:s, s:o, s:s, s:s, s:n, s:{s:i, s:i}}", "id", id, "type", "message",
                  "role", "assistant", "content", content, "model", model, "stop_reason",
                  tool ? "tool_use" : "end_turn", "stop_sequence", "usage", "input_tokens",
                  in_tokens, "output_tokens", events);
  } else if (a == API_CHAT) {
    json_t *msg = json_pack("{s:s, s:s}", "role", "assistant", "content", text);
    if (tool)
      json_object_set_new(msg, "tool_calls",
                          json_pack("[{s:s, s:s, s:{s:s, s:s}}]", "id", "call_fake", "type",
                                    "function", "function", "name", "get_weather", "arguments", args));
    j = json_pack("{s:s, s:s, s:i, s:s, s:[{s:i, s:o, s:n, s:s}], s:{s:i, s:i, s:i}}", "id", id,
                  "object", "chat.completion", "created", 1700000000, "model", model, "choices",
                  "index", 0, "message", msg, "logprobs", "finish_reason",
                  tool ? "tool_calls" : "stop", "usage", "prompt_tokens", in_tokens,
                  "completion_tokens", events, "total_tokens", in_tokens + events);
  } else if (a == API_COMPLETIONS) {
    j = json_pack("{s:s, s:s, s:i, s:s, s:[{s:s, s:i, s:n, s:s}], s:{s:i, s:i, s:i}}", "id", id,
                  "object", "text_completion", "created", 1700000000, "model", model, "choices",
                  "text", text, "index", 0, "logprobs", "finish_reason", "length", "usage",
                  "prompt_tokens", in_tokens, "completion_tokens", events, "total_tokens",
                  in_tokens + events);
  } else {
    char msg_id[128];
    snprintf(msg_id, sizeof msg_id, "msg_%s", id + 5);
    json_t *output = json_pack("[{s:s, s:s, s:s, s:s, s:[{s:s, s:s, s:[]}]}]", "id", msg_id,
                               "type", "message", "status", "completed", "role", "assistant",
                               "content", "type", "output_text", "text", text, "annotations");
    if (tool)
      json_array_append_new(output, json_pack("{s:s, s:s, s:s, s:s, s:s}", "type", "function_call",
                                              "status", "completed", "arguments", args, "call_id",
                                              "call_fake", "name", "get_weather"));
    j = responses_object(id, model, "completed", output,
                         json_pack("{s:i, s:i, s:i}", "input_tokens", in_tokens, "output_tokens",
                                   events, "total_tokens", in_tokens + events));
  }
  free(text);
  attach_prompt_ids(j, ask);
  return send_json(c, 200, j);
}

/* ---- dispatch ------------------------------------------------------------------------------- */

static int ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && !strcmp(s + a - b, suffix);
}

static uint64_t fnv1a(const char *p, size_t n) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ULL;
  return h;
}

/* %-encodes (encode = 1: everything but unreserved characters) or %-decodes (0) n bytes. */
static char *pct(const char *p, size_t n, int encode) {
  char *out = malloc(3 * n + 1), *o = out;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)p[i];
    unsigned int v;
    if (encode && !(isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~')) {
      o += sprintf(o, "%%%02X", c);
    } else if (!encode && c == '%' && i + 2 < n && isxdigit((unsigned char)p[i + 1]) &&
               isxdigit((unsigned char)p[i + 2]) && sscanf(p + i + 1, "%2x", &v) == 1) {
      *o++ = (char)v;
      i += 2;
    } else {
      *o++ = (char)c;
    }
  }
  *o = 0;
  return out;
}

static char *unbase64(const char *p) {
  static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  char *out = calloc(1, strlen(p) + 1), *o = out;
  unsigned int acc = 0;
  int bits = 0;
  for (; *p && *p != '='; p++) {
    const char *k = strchr(tab, *p);
    if (!k) break;
    acc = acc << 6 | (unsigned int)(k - tab);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      *o++ = (char)(acc >> bits & 0xFF);
    }
  }
  return out;
}

/* Serves one request; returns -1 when the connection must end. */
static int serve(conn *c, request *r) {
  atomic_fetch_add(&stat_requests, 1);
  if (!strcmp(r->path, "/_fake/stats"))
    return send_json(c, 200, json_pack("{s:I, s:I, s:I}", "requests", (json_int_t)stat_requests,
                                       "cancelled", (json_int_t)stat_cancelled,
                                       "streams_completed", (json_int_t)stat_completed));
  const char *fail = header(r, "x-fake-fail");
  int first_ms = header_int(r, "x-fake-first-ms", 0);
  int stall_after = header_int(r, "x-fake-stall-after", 1 << 30);
  int stall_ms = header_int(r, "x-fake-stall-ms", 0);
  if (first_ms > 0) sleep_ms(first_ms);
  if (stall_ms > 0 && stall_after < 0 && watchful_sleep(c, stall_ms) < 0) {
    atomic_fetch_add(&stat_cancelled, 1);
    return -1;
  }
  if (fail && !strcmp(fail, "reset-before-head")) {
    hard_reset(c);
    return -1;
  }
  if (header(r, "x-fake-echo")) {
    json_t *hs = json_array(), *encoded = json_array(), *decoded = json_object();
    for (int i = 0; i < r->n_headers; i++) {
      json_array_append_new(hs, json_pack("[ss]", r->names[i], r->values[i]));
      char *e = pct(r->values[i], strlen(r->values[i]), 1);
      json_array_append_new(encoded, json_string(e));
      free(e);
    }
    const char *auth = header(r, "authorization");
    if (auth && !strncasecmp(auth, "Basic ", 6)) {
      char *pair = unbase64(auth + 6);
      json_t *v = json_string(pair);
      json_object_set_new(decoded, "basic", v ? v : json_null());
      free(pair);
    }
    char *q = pct(r->query, strlen(r->query), 0);
    json_t *qv = json_string(q);
    json_object_set_new(decoded, "query", qv ? qv : json_null());
    free(q);
    json_t *body = json_stringn(r->body, r->body_len);
    return send_json(c, 200, json_pack("{s:s, s:s, s:s, s:o, s:o, s:o, s:o}", "method", r->method,
                                       "path", r->path, "query", r->query, "headers", hs, "body",
                                       body ? body : json_null(), "decoded", decoded, "encoded",
                                       encoded));
  }
  if (!strcmp(r->method, "GET") && ends_with(r->path, "/models"))
    return send_json(c, 200, json_pack("{s:s, s:[{s:s, s:s, s:i, s:s}]}", "object", "list", "data",
                                       "id", "fake-model", "object", "model", "created",
                                       1700000000, "owned_by", "sparsetrace"));
  api a;
  if (ends_with(r->path, "/messages/count_tokens")) {
    return send_json(c, 200, json_pack("{s:i}", "input_tokens", (int)(r->body_len / 4)));
  } else if (ends_with(r->path, "/messages")) {
    a = API_ANTHROPIC;
  } else if (ends_with(r->path, "/chat/completions")) {
    a = API_CHAT;
  } else if (ends_with(r->path, "/completions")) {
    a = API_COMPLETIONS;
  } else if (ends_with(r->path, "/responses")) {
    a = API_RESPONSES;
  } else {
    return send_json(c, 404, api_error(API_CHAT, 404, "no such endpoint on the fake upstream"));
  }
  json_error_t err;
  json_t *body = json_loadb(r->body, r->body_len, 0, &err);
  if (!body) {
    char msg[300];
    snprintf(msg, sizeof msg, "request body is not valid JSON: %s", err.text);
    return send_json(c, 400, api_error(a, 400, msg));
  }
  int status = header_int(r, "x-fake-status", 0);
  if (status) {
    json_decref(body);
    return send_json(c, status, api_error(a, status, "fake upstream was told to fail"));
  }
  const char *model = json_string_value(json_object_get(body, "model"));
  char model_buf[128];
  snprintf(model_buf, sizeof model_buf, "%s", model ? model : "fake-model");
  int stream = json_is_true(json_object_get(body, "stream"));
  int usage = json_is_true(json_object_get(json_object_get(body, "stream_options"), "include_usage"));
  int ask_vllm = json_is_true(json_object_get(body, "return_token_ids"));
  int ask_sglang = a == API_CHAT && json_is_true(json_object_get(body, "return_prompt_token_ids"));
  json_decref(body);
  int events = header_int(r, "x-fake-events", 5);
  int bytes = header_int(r, "x-fake-delta-bytes", 0);
  int tool = header_int(r, "x-fake-tool", 0);
  int in_tokens = (int)(r->body_len / 4);
  ids_ask ask = {0};
  if ((ask_vllm || ask_sglang) && (a == API_CHAT || a == API_COMPLETIONS)) {
    if (ask_sglang && stream) /* sglang serving_chat.py refuses it the same way */
      return send_json(c, 400, api_error(a, 400, "return_prompt_token_ids is not supported with "
                                                 "streaming. Please set stream=false when using "
                                                 "return_prompt_token_ids=true."));
    const char *given = header(r, "x-fake-prompt-ids");
    ask.ids = given ? json_loads(given, 0, NULL) : NULL;
    if (!json_is_array(ask.ids)) {
      json_decref(ask.ids);
      ask.ids = json_array();
      for (int i = 0; i < in_tokens; i++) json_array_append_new(ask.ids, json_integer((i * 31 + 7) % 250));
    }
    in_tokens = (int)json_array_size(ask.ids);
    ask.top_level = a == API_CHAT && ask_vllm && !ask_sglang;
  }
  char id[96];
  static const char *const prefixes[] = {"msg_", "chatcmpl-", "cmpl-", "resp_"};
  snprintf(id, sizeof id, "%s%016llx", prefixes[a], (unsigned long long)fnv1a(r->body, r->body_len));
  if (!stream) {
    int rc = whole_answer(c, a, id, model_buf, in_tokens, events, bytes, tool, &ask);
    json_decref(ask.ids);
    return rc;
  }

  const char *head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
                     "Cache-Control: no-cache\r\nrequest-id: req_fake\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n";
  if (send_all(c, head, strlen(head)) < 0) {
    json_decref(ask.ids);
    return -1;
  }
  streamer s = {.c = c, .r = r, .ask = &ask, .interval_ms = header_int(r, "x-fake-interval-ms", 0),
                .split = header_int(r, "x-fake-split", 0), .stall_after = stall_after,
                .stall_ms = stall_ms, .fail = fail, .fail_at = fail ? 4 : -1};
  switch (a) {
  case API_ANTHROPIC: stream_anthropic(&s, id, model_buf, in_tokens, events, bytes, tool); break;
  case API_CHAT: stream_chat(&s, id, model_buf, in_tokens, events, bytes, tool, usage); break;
  case API_COMPLETIONS: stream_completions(&s, id, model_buf, events, bytes); break;
  case API_RESPONSES: stream_responses(&s, id, model_buf, in_tokens, events, bytes, tool); break;
  }
  json_decref(ask.ids);
  if (c->fd < 0 || c->peer_gone || fail) return -1;
  return send_all(c, "0\r\n\r\n", 5);
}

static void *conn_main(void *arg) {
  conn *c = arg;
  request r;
  while (read_request(c, &r) == 0) {
    int rc = serve(c, &r);
    int close_after = r.close_after;
    free_request(&r);
    if (rc < 0 || close_after) break;
  }
  if (c->fd >= 0) close(c->fd);
  free(c);
  return NULL;
}

/* A test that dies without stopping its fake must not leave it running: exit once the process
** that started us is gone (we have been re-parented). */
static void *orphan_watch(void *arg) {
  pid_t parent = (pid_t)(intptr_t)arg;
  while (getppid() == parent && parent != 1) sleep_ms(500); /* pid 1: orphaned before we looked */
  _exit(0);
  return NULL;
}

int main(int argc, char **argv) {
  pthread_t watch;
  pthread_create(&watch, NULL, orphan_watch, (void *)(intptr_t)getppid());
  pthread_detach(watch);
  int port = 0;
  const char *port_file = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--port") && i + 1 < argc) port = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--port-file") && i + 1 < argc) port_file = argv[++i];
    else {
      fprintf(stderr, "usage: fake_upstream [--port N] [--port-file FILE]\n");
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 1024) != 0) {
    fprintf(stderr, "fake_upstream: cannot listen on 127.0.0.1:%d: %s\n", port, strerror(errno));
    return 1;
  }
  socklen_t al = sizeof a;
  getsockname(ls, (struct sockaddr *)&a, &al);
  port = ntohs(a.sin_port);
  if (port_file) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", port_file);
    FILE *f = fopen(tmp, "w");
    if (f) {
      fprintf(f, "%d\n", port);
      fclose(f);
      rename(tmp, port_file);
    }
  }
  printf("listening %d\n", port);
  fflush(stdout);
  for (;;) {
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE) continue;
      break;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    conn *c = calloc(1, sizeof *c);
    c->fd = fd;
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    if (pthread_create(&t, &attr, conn_main, c) != 0) {
      close(fd);
      free(c);
    }
    pthread_attr_destroy(&attr);
  }
  return 1;
}
