/*
** tokenizer.h — Hugging Face `tokenizer.json` byte-level BPE in C (DeepSeek-V3/V4 and kin).
**
** What is read: `tokenizer.json` (model BPE: vocab, merges as "a b" strings or [a, b] pairs,
** ignore_merges, unk_token, byte_fallback; added_tokens with special / normalized / lstrip /
** rstrip / single_word; pre_tokenizer Sequence of Split{Regex|String, behavior, invert} and
** ByteLevel; normalizer null or an empty Sequence; decoder ByteLevel) and, when present,
** `tokenizer_config.json` (add_bos_token, add_eos_token, bos_token, eos_token, chat_template,
** added_tokens_decoder). Anything else a file asks for is refused with ST_EUNSUPPORTED naming
** the file and the JSON field, rather than tokenised differently from HF `tokenizers`.
**
** Encoding follows HF `tokenizers`' order exactly: added tokens are cut out of the raw text
** first (leftmost-longest; non-normalized tokens, then normalized ones), every other piece goes
** through the pre-tokenizer regexes (PCRE2, UTF + UCP, JIT; `\s` rewritten to Oniguruma's
** White_Space set), then byte-level BPE by merge rank with a per-word cache.
**
** Ownership and threads: a tokenizer is immutable after open except for its word cache and
** scratch buffers, so one tokenizer must not encode on two threads at once (open one per
** thread, or serialise). decode, token_id, token_text and the getters are read-only.
*/
#ifndef ST_TOKENIZER_H
#define ST_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "common/base.h"

typedef struct st_tokenizer st_tokenizer;

/* Growable array of token ids. Zero-initialise; st_tokenizer_encode appends; free with
** st_token_ids_free (which leaves it empty and reusable). */
typedef struct st_token_ids {
  int32_t *ids;
  size_t n, cap;
} st_token_ids;

void st_token_ids_free(st_token_ids *v);
/* Appends one id; ST_ENOMEM on allocation failure. */
st_status st_token_ids_push(st_token_ids *v, int32_t id);

/* Encode flags. */
enum {
  /* Add what tokenizer_config.json asks for: BOS first when add_bos_token is true, EOS last
  ** when add_eos_token is true (transformers' add_special_tokens=True). Without it: neither. */
  ST_TOK_ADD_SPECIAL = 1u << 0,
  /* Treat special added tokens in the text as plain text (HF split_special_tokens=True). */
  ST_TOK_SPLIT_SPECIAL = 1u << 1,
};

/* Decode flags. */
enum {
  ST_TOK_SKIP_SPECIAL = 1u << 0, /* leave out added tokens marked special (BOS, EOS, ...) */
};

/* Opens DIR/tokenizer.json and, when it exists, DIR/tokenizer_config.json. */
st_status st_tokenizer_open(const char *dir, st_tokenizer **out);

/* Same with explicit paths; config_path may be NULL (no config: no BOS/EOS added). */
st_status st_tokenizer_open_files(const char *tokenizer_json_path, const char *config_path,
                                  st_tokenizer **out);

/* Accepts NULL. */
void st_tokenizer_close(st_tokenizer *tok);

/* Tokenises len bytes of UTF-8 text and appends the ids to out. Invalid UTF-8 is refused
** (ST_EINVAL with the byte offset); NUL bytes are ordinary characters. On failure out keeps
** the ids it had before the call. */
st_status st_tokenizer_encode(st_tokenizer *tok, const char *text, size_t len, unsigned flags,
                              st_token_ids *out);

/* Decodes ids back to bytes (byte-level map; tokens that are not byte-level strings, such as
** "<｜User｜>", give their own UTF-8). *text is NUL-terminated, caller frees; *len excludes the
** NUL (may be NULL). An id outside the vocabulary is ST_EINVAL naming its position. */
st_status st_tokenizer_decode(const st_tokenizer *tok, const int32_t *ids, size_t n,
                              unsigned flags, char **text, size_t *len);

/* Id of a token given as it is spelled in tokenizer.json (added-token content such as
** "<｜User｜>", or a vocab key such as "Ġthe"); -1 when there is none. Added tokens first. */
int32_t st_tokenizer_token_id(const st_tokenizer *tok, const char *token);

/* The token's tokenizer.json spelling (NUL-terminated, owned by tok), or NULL for an id
** outside the vocabulary or a hole in the id range. */
const char *st_tokenizer_token_text(const st_tokenizer *tok, int32_t id);

/* Decoded bytes of one token (not NUL-terminated; owned by tok); NULL for unknown ids. */
const char *st_tokenizer_token_bytes(const st_tokenizer *tok, int32_t id, size_t *len);

/* Largest id + 1 over the model vocab and the added tokens: the rows an embedding needs. */
size_t st_tokenizer_vocab_size(const st_tokenizer *tok);
/* Entries in model.vocab, merges in model.merges, entries in added_tokens (after config). */
size_t st_tokenizer_model_vocab_size(const st_tokenizer *tok);
size_t st_tokenizer_merge_count(const st_tokenizer *tok);
size_t st_tokenizer_added_count(const st_tokenizer *tok);

/* 1 when id is an added token (special or not) / an added token marked special. */
int st_tokenizer_is_added(const st_tokenizer *tok, int32_t id);
int st_tokenizer_is_special(const st_tokenizer *tok, int32_t id);

/* From tokenizer_config.json: bos/eos ids (-1 when not configured), whether encode with
** ST_TOK_ADD_SPECIAL adds them, and whether a chat_template is present. */
int32_t st_tokenizer_bos_id(const st_tokenizer *tok);
int32_t st_tokenizer_eos_id(const st_tokenizer *tok);
int st_tokenizer_adds_bos(const st_tokenizer *tok);
int st_tokenizer_adds_eos(const st_tokenizer *tok);
int st_tokenizer_has_chat_template(const st_tokenizer *tok);

/* Path of the tokenizer.json that was loaded (for messages and records). */
const char *st_tokenizer_path(const st_tokenizer *tok);

#endif
