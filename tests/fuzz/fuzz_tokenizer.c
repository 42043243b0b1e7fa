/*
** fuzz_tokenizer.c — engine/text/tokenizer*.c: tokenizer.json (vocab, merges, added tokens,
** normalizer, pre-tokenizer regexes, decoder, post-processor) from arbitrary bytes; when it
** loads, a fixed text with special tokens is encoded and decoded back.
*/
#include "engine/text/tokenizer.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_path("tok", ".json");
  fuzz_write(path, data, size);
  st_tokenizer *tok = NULL;
  if (st_tokenizer_open_files(path, NULL, &tok) == ST_OK) {
    static const char text[] = "Hello, world! <｜begin▁of▁sentence｜>  x = 12345;\n\tcafé 日本語 \xf0\x9f\x98\x80 ab";
    st_token_ids ids = {0};
    if (st_tokenizer_encode(tok, text, sizeof text - 1, 0, &ids) == ST_OK) {
      char *out = NULL;
      size_t len = 0;
      if (st_tokenizer_decode(tok, ids.ids, ids.n, 0, &out, &len) == ST_OK) free(out);
      for (size_t i = 0; i < ids.n; i++) {
        (void)st_tokenizer_token_text(tok, ids.ids[i]);
        size_t bl;
        (void)st_tokenizer_token_bytes(tok, ids.ids[i], &bl);
      }
    }
    st_token_ids_free(&ids);
    (void)st_tokenizer_token_id(tok, "<｜end▁of▁sentence｜>");
    st_tokenizer_close(tok);
  }
  unlink(path);
  return 0;
}
