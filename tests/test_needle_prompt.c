/*
** test_needle_prompt.c — needle/needle_prompt.h and the parts of needle/harness.h that need no
** engine or server: the generator in-process (determinism, the needle once at the requested
** fraction for every kind, format and render profile, sizes nesting with the target, spec errors),
** the token span of a byte range (against a hand-made byte tokenizer), and reading the answer
** text out of Anthropic, OpenAI chat and Responses bodies (edge cases included).
*/
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "needle/needle_prompt.h"
#include "needle/harness.h"

static char *dump(const json_t *v) { return json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER); }

static int count(const char *hay, size_t n, const char *needle) {
  int c = 0;
  for (const char *p = hay; (p = memmem(p, n - (size_t)(p - hay), needle, strlen(needle))); p++) c++;
  return c;
}

static void test_deterministic(void **state) {
  st_needle_spec sp;
  st_needle_spec_default(&sp);
  sp.tokens = 6000;
  sp.position = 0.3;
  sp.seed = 11;
  st_needle_prompt a, b, c;
  assert_int_equal(st_needle_make(&sp, &a), ST_OK);
  assert_int_equal(st_needle_make(&sp, &b), ST_OK);
  sp.seed = 12;
  assert_int_equal(st_needle_make(&sp, &c), ST_OK);
  char *da = dump(a.request), *db = dump(b.request), *dc = dump(c.request);
  assert_string_equal(da, db);
  assert_string_not_equal(da, dc);
  assert_string_equal(a.line, b.line);
  assert_string_not_equal(a.value, c.value);
  assert_int_equal(a.prompt_len, b.prompt_len);
  assert_memory_equal(a.prompt, b.prompt, a.prompt_len);
  free(da), free(db), free(dc);
  st_needle_prompt_free(&a), st_needle_prompt_free(&b), st_needle_prompt_free(&c);
}

/* The needle is the same for a seed at every size and position (only seed and kind choose it). */
static void test_needle_depends_on_seed_and_kind(void **state) {
  st_needle_spec sp;
  st_needle_spec_default(&sp);
  sp.seed = 4;
  st_needle_prompt a, b;
  sp.tokens = 1500, sp.position = 0.2;
  assert_int_equal(st_needle_make(&sp, &a), ST_OK);
  sp.tokens = 9000, sp.position = 0.9, sp.format = ST_NEEDLE_OPENAI_RESPONSES;
  assert_int_equal(st_needle_make(&sp, &b), ST_OK);
  assert_string_equal(a.line, b.line);
  assert_true(!strncmp(a.line, "Working directory: /home/dev/projects/", 38));
  st_needle_prompt_free(&a), st_needle_prompt_free(&b);
}

static void test_every_kind_format_profile(void **state) {
  static const char *const labels[] = {"Working directory: ", "Primary database host: ", "Deploy API key: sk-live-",
                                       "Incident ticket number: ", "Tracking ticket: ", "Release branch: release/",
                                       "Artifact URL: https://artifacts.", "On-call contact: ", "Pinned commit: ",
                                       "Environment variable: ", "Session token: ",
                                       NULL /* assorted: its shape's label, below */,
                                       "" /* vocab: drawn from a tokenizer (test_needle_batch.sh) */};
  static const char *const assorted[] = {"Build version: v", "Service address: 10.", "Request id: ", "Cutover time: 20",
                                         "Base image: ghcr.io/", "Bucket ARN: arn:aws:s3:::", "Escalation phone: +",
                                         "Device MAC: ", "Cleanup schedule: ", "Config key: ", "Feature flag: ",
                                         "Handler class: ", "Export path: s3://", "Budget cap: EUR ",
                                         "Site coordinates: ", "Signing fingerprint: SHA256:"};
  assert_int_equal(sizeof labels / sizeof labels[0], ST_NEEDLE_KIND_COUNT);
  for (int k = 0; k < ST_NEEDLE_KIND_COUNT; k++)
    for (int f = 0; f < ST_NEEDLE_FORMAT_COUNT; f++)
      for (int p = 0; p < ST_RENDER_PROFILE_COUNT; p++) {
        if (p == ST_RENDER_ATOM && f == ST_NEEDLE_OPENAI_RESPONSES) continue; /* ATOM has no /v1/responses */
        for (double pos = 0.1; pos < 1.0; pos += 0.4) {
          st_needle_spec sp;
          st_needle_spec_default(&sp);
          sp.tokens = 5000;
          sp.position = pos;
          sp.seed = (uint64_t)(k * 7 + f * 3 + p + 1);
          sp.kind = (st_needle_kind)k;
          sp.format = (st_needle_format)f;
          sp.render.profile = (st_render_profile)p;
          st_needle_prompt np;
          st_status rc = st_needle_make(&sp, &np);
          if (k == ST_NEEDLE_VOCAB) { /* no tokenizer here: refused, saying what it needs */
            assert_int_equal(rc, ST_EINVAL);
            assert_non_null(strstr(st_errmsg(), "tokenizer"));
            continue;
          }
          if (rc) fail_msg("kind %d format %d profile %d: %s", k, f, p, st_errmsg());
          int labelled = 0;
          for (size_t i = 0; i < (labels[k] ? 1 : sizeof assorted / sizeof assorted[0]); i++) {
            const char *want = labels[k] ? labels[k] : assorted[i];
            labelled |= !strncmp(np.line, want, strlen(want));
          }
          if (!labelled) fail_msg("kind %d: needle line '%s' has none of the kind's labels", k, np.line);
          char *body = dump(np.request);
          assert_int_equal(count(body, strlen(body), np.value), 1);
          assert_int_equal(count(np.prompt, np.prompt_len, np.value), 1);
          assert_int_equal(count(np.prompt, np.prompt_len, np.line), 1);
          assert_true(np.needle_byte >= 0 && !memcmp(np.prompt + np.needle_byte, np.line, strlen(np.line)));
          double at = (double)np.needle_byte / (double)np.prompt_len;
          if (at < pos - 0.04 || at > pos + 0.04)
            fail_msg("kind %d format %d profile %d: needle at %.3f, wanted %.2f (%s)", k, f, p, at, pos, np.placement);
          assert_true(np.within_tolerance);
          assert_true(np.n_tools >= 4);
          free(body);
          st_needle_prompt_free(&np);
        }
      }
}

/* The assorted kind: over 96 seeds every one of its 16 labels, and no value with an '@' or an '='
** (the held-out kinds' shapes: addresses, NAME=VALUE assignments). */
static void test_assorted_shapes(void **state) {
  (void)state;
  char seen[16][64];
  int n_seen = 0;
  for (uint64_t seed = 1; seed <= 96; seed++) {
    st_needle_spec sp;
    st_needle_spec_default(&sp);
    sp.tokens = 1000, sp.seed = seed, sp.kind = ST_NEEDLE_ASSORTED;
    st_needle_prompt np;
    if (st_needle_make(&sp, &np)) fail_msg("seed %llu: %s", (unsigned long long)seed, st_errmsg());
    if (strchr(np.value, '@') || strchr(np.value, '='))
      fail_msg("seed %llu: '%s' has a held-out kind's shape", (unsigned long long)seed, np.value);
    int known = 0;
    for (int i = 0; i < n_seen; i++) known |= !strcmp(seen[i], np.label);
    if (!known) {
      assert_true(n_seen < 16);
      snprintf(seen[n_seen++], sizeof seen[0], "%s", np.label);
    }
    st_needle_prompt_free(&np);
  }
  assert_int_equal(n_seen, 16);
}

/* Bigger targets, bigger prompts; every size within 2% once above the smallest shape. */
static void test_sizes(void **state) {
  int64_t last = 0;
  for (int64_t t = 1000; t <= 64000; t *= 2) {
    st_needle_spec sp;
    st_needle_spec_default(&sp);
    sp.tokens = t;
    sp.position = 0.5;
    sp.seed = 3;
    st_needle_prompt np;
    assert_int_equal(st_needle_make(&sp, &np), ST_OK);
    assert_true(np.tokens > last);
    if (np.min_tokens < t) assert_true(np.tokens >= t - t / 50 && np.tokens <= t + t / 50);
    assert_int_equal(np.tokens, (int64_t)((double)np.prompt_len / ST_NEEDLE_BYTES_PER_TOKEN + 0.5));
    last = np.tokens;
    st_needle_prompt_free(&np);
  }
}

static void test_spec_errors(void **state) {
  st_needle_spec sp;
  st_needle_spec_default(&sp);
  st_needle_prompt np;
  sp.position = 1.5;
  assert_int_equal(st_needle_make(&sp, &np), ST_EINVAL);
  assert_non_null(strstr(st_errmsg(), "[0, 1]"));
  sp.position = 0.5, sp.tokens = 0;
  assert_int_equal(st_needle_make(&sp, &np), ST_EINVAL);
  /* the vocab kind's value length: LO-HI with 1 <= LO <= HI <= ST_NEEDLE_VOCAB_TOKENS_MAX, or 0-0 */
  static const int bad_vocab[][2] = {{0, 5}, {5, 3}, {1, ST_NEEDLE_VOCAB_TOKENS_MAX + 1}, {3, 0}, {-1, 4}};
  sp.tokens = 2048;
  for (size_t i = 0; i < sizeof bad_vocab / sizeof bad_vocab[0]; i++) {
    sp.vocab_tokens[0] = bad_vocab[i][0], sp.vocab_tokens[1] = bad_vocab[i][1];
    assert_int_equal(st_needle_make(&sp, &np), ST_EINVAL);
    assert_non_null(strstr(st_errmsg(), "vocab tokens"));
  }
  sp.vocab_tokens[0] = 1, sp.vocab_tokens[1] = ST_NEEDLE_VOCAB_TOKENS_MAX; /* a path needle: the range is the vocab kind's */
  assert_int_equal(st_needle_make(&sp, &np), ST_OK);
  st_needle_prompt_free(&np);
  st_needle_kind k;
  st_needle_format f;
  assert_int_equal(st_needle_kind_parse("host", &k), ST_OK);
  assert_int_equal(k, ST_NEEDLE_HOST);
  assert_int_equal(st_needle_kind_parse("colour", &k), ST_EINVAL);
  assert_int_equal(st_needle_format_parse("openai-responses", &f), ST_OK);
  assert_int_equal(f, ST_NEEDLE_OPENAI_RESPONSES);
  assert_int_equal(st_needle_format_parse("grpc", &f), ST_EINVAL);
}

/* A byte tokenizer (no merges) plus one added token of 6 bytes: spans follow the bytes. */
static void test_token_span(void **state) {
  char dir[] = "/tmp/st_needle_tok_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[256];
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  json_t *vocab = json_object();
  for (int b = 0; b < 256; b++) { /* GPT-2 byte spelling */
    int cp = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174))) {
      int n = 0;
      for (int x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174))) n++;
      cp = 256 + n;
    }
    char u[4] = {0};
    if (cp < 0x80) u[0] = (char)cp;
    else u[0] = (char)(0xC0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3F));
    json_object_set_new(vocab, u, json_integer(b));
  }
  json_t *root = json_pack("{s:[{s:i, s:s, s:b, s:b, s:b, s:b, s:b}], s:n, s:{s:s, s:b, s:b}, s:{s:s}, s:{s:s, s:o, s:[]}}",
                           "added_tokens", "id", 256, "content", "<SPEC>", "single_word", 0, "lstrip", 0, "rstrip", 0,
                           "normalized", 0, "special", 1, "normalizer", "pre_tokenizer", "type", "ByteLevel",
                           "add_prefix_space", 0, "use_regex", 0, "decoder", "type", "ByteLevel", "model", "type",
                           "BPE", "vocab", vocab, "merges");
  assert_non_null(root);
  assert_int_equal(json_dump_file(root, path, 0), 0);
  json_decref(root);
  st_tokenizer *tok = NULL;
  assert_int_equal(st_tokenizer_open(dir, &tok), ST_OK);
  const char *text = "ab<SPEC>cd";
  st_token_ids ids = {0};
  assert_int_equal(st_tokenizer_encode(tok, text, strlen(text), 0, &ids), ST_OK);
  assert_int_equal(ids.n, 5); /* a b <SPEC> c d */
  int64_t s, e;
  assert_int_equal(st_needle_token_span(tok, ids.ids, ids.n, strlen(text), 0, 1, &s, &e), ST_OK);
  assert_true(s == 0 && e == 1);
  assert_int_equal(st_needle_token_span(tok, ids.ids, ids.n, strlen(text), 3, 9, &s, &e), ST_OK);
  assert_true(s == 2 && e == 4); /* inside <SPEC> through c */
  assert_int_equal(st_needle_token_span(tok, ids.ids, ids.n, strlen(text), 8, 10, &s, &e), ST_OK);
  assert_true(s == 3 && e == 5);
  assert_int_equal(st_needle_token_span(tok, ids.ids, ids.n, strlen(text) + 1, 0, 1, &s, &e), ST_EMISMATCH);
  st_token_ids_free(&ids);
  st_tokenizer_close(tok);
  unlink(path);
  rmdir(dir);
}

static void answer(st_harness_api api, const char *body, st_status want, const char *text, int64_t tokens) {
  char *got = NULL;
  int64_t n = -2;
  st_status rc = st_harness_answer_text(api, body, strlen(body), &got, &n);
  if (rc != want) fail_msg("%s: status %d, wanted %d (%s)", body, rc, want, st_errmsg());
  if (!rc) {
    assert_string_equal(got, text);
    assert_int_equal(n, tokens);
  }
  free(got);
}

static void test_answer_text(void **state) {
  answer(ST_HARNESS_ANTHROPIC,
         "{\"content\":[{\"type\":\"thinking\",\"thinking\":\"hmm\"},{\"type\":\"text\",\"text\":\"Working directory: /a\"},"
         "{\"type\":\"text\",\"text\":\"!\"}],\"usage\":{\"input_tokens\":10,\"cache_read_input_tokens\":5}}",
         ST_OK, "Working directory: /a!", 15);
  answer(ST_HARNESS_ANTHROPIC, "{\"content\":[{\"type\":\"tool_use\",\"name\":\"x\",\"input\":{}}]}", ST_OK, "", -1);
  answer(ST_HARNESS_ANTHROPIC, "{\"type\":\"error\",\"error\":{\"message\":\"overloaded\"}}", ST_EFORMAT, NULL, 0);
  answer(ST_HARNESS_OPENAI, "{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"x\"}}],\"usage\":{\"prompt_tokens\":7}}",
         ST_OK, "x", 7);
  answer(ST_HARNESS_OPENAI, "{\"choices\":[{\"message\":{\"content\":null,\"reasoning_content\":\"r\"}}]}", ST_OK, "", -1);
  answer(ST_HARNESS_OPENAI, "{\"choices\":[{\"message\":{\"content\":[{\"type\":\"text\",\"text\":\"p\"}]}}]}", ST_OK, "p", -1);
  answer(ST_HARNESS_OPENAI, "{\"choices\":[]}", ST_EFORMAT, NULL, 0);
  answer(ST_HARNESS_RESPONSES,
         "{\"output\":[{\"type\":\"reasoning\",\"summary\":[]},{\"type\":\"message\",\"content\":[{\"type\":\"output_text\","
         "\"text\":\"a\"},{\"type\":\"refusal\",\"refusal\":\"no\"}]}],\"usage\":{\"input_tokens\":3}}",
         ST_OK, "a", 3);
  answer(ST_HARNESS_RESPONSES, "{\"output_text\":\"direct\"}", ST_OK, "direct", -1);
  answer(ST_HARNESS_RESPONSES, "not json", ST_EFORMAT, NULL, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_deterministic),
    cmocka_unit_test(test_needle_depends_on_seed_and_kind),
    cmocka_unit_test(test_every_kind_format_profile),
    cmocka_unit_test(test_assorted_shapes),
    cmocka_unit_test(test_sizes),
    cmocka_unit_test(test_spec_errors),
    cmocka_unit_test(test_token_span),
    cmocka_unit_test(test_answer_text),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
