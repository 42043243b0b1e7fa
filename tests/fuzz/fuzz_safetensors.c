/*
** fuzz_safetensors.c — engine/safetensors.c on arbitrary files: header length, header JSON,
** dtype/shape/offset validation; every tensor's bytes are then read through its `data` pointer
** (they must lie in the mapping).
*/
#include "engine/safetensors.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_path("st", ".safetensors");
  fuzz_write(path, data, size);
  st_safetensors *st = NULL;
  if (st_safetensors_open(path, &st) == ST_OK) {
    volatile unsigned sum = 0;
    size_t n = st_safetensors_count(st);
    for (size_t i = 0; i < n; i++) {
      const st_safetensors_tensor *t = st_safetensors_at(st, i);
      if (st_safetensors_find(st, t->name) == NULL) abort(); /* every listed name is found */
      for (uint64_t b = 0; b < t->n_bytes; b += 1 + t->n_bytes / 64) sum += t->data[b];
      if (t->n_bytes) sum += t->data[t->n_bytes - 1];
      (void)st_safetensors_dtype_name(t->dtype);
    }
    (void)st_safetensors_metadata(st, "format");
    (void)sum;
  }
  st_safetensors_close(st);
  unlink(path);
  return 0;
}
