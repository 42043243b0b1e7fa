/*
** fuzz_tokenize.c — engine/text/tokenizer_pretok.c + tokenizer_bpe.c: arbitrary text (any
** bytes: invalid UTF-8 must be refused, not read past) encoded with the bundled needle model's
** tokenizer (models/needle-v4, a DeepSeek-V4 byte-level BPE with its added tokens), flags from the
** first byte, then decoded; valid UTF-8 without added tokens must decode back to itself.
*/
#include "engine/text/tokenizer.h"
#include "fuzz_util.h"

static st_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  if (st_tokenizer_open(ST_FUZZ_TOKENIZER_DIR, &tok) != ST_OK) {
    fprintf(stderr, "fuzz_tokenize: cannot open %s: %s\n", ST_FUZZ_TOKENIZER_DIR, st_errmsg());
    abort();
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  unsigned flags = data[0] & (ST_TOK_ADD_SPECIAL | ST_TOK_SPLIT_SPECIAL);
  const char *text = (const char *)data + 1;
  size_t len = size - 1;
  st_token_ids ids = {0};
  if (st_tokenizer_encode(tok, text, len, flags, &ids) == ST_OK) {
    char *out = NULL;
    size_t out_len = 0;
    if (st_tokenizer_decode(tok, ids.ids, ids.n, 0, &out, &out_len) != ST_OK) abort();
    /* byte-level BPE is lossless: with special tokens split as text and none added, the ids
    ** decode to the input exactly */
    if (flags == ST_TOK_SPLIT_SPECIAL && (out_len != len || memcmp(out, text, len))) abort();
    free(out);
  }
  st_token_ids_free(&ids);
  return 0;
}
