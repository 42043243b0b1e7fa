/*
** fuzz_config.c — engine/config.c: st_config_parse on arbitrary config.json text.
*/
#include "engine/config.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_strdup(data, size);
  st_config *cfg = malloc(sizeof *cfg);
  if (!cfg) abort();
  (void)st_config_parse(text, "fuzz/config.json", cfg);
  free(cfg);
  free(text);
  return 0;
}
