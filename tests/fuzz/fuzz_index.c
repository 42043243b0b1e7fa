/*
** fuzz_index.c — engine/checkpoint.c's sharded index: model.safetensors.index.json from
** arbitrary bytes, in a checkpoint directory holding a valid config.json (ST_FUZZ_CONFIG, the
** tiny oracle's) and two small valid shards (shard-1.safetensors, shard-2.safetensors) that
** the index may name. When the checkpoint opens, every tensor's info is read.
*/
#include <sys/stat.h>

#include "engine/checkpoint.h"
#include "fuzz_util.h"

static char dir[512];

static void write_shard(const char *name, const char *header, size_t data_bytes) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  size_t hl = strlen(header);
  uint8_t *b = calloc(1, 8 + hl + data_bytes);
  if (!b) abort();
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
  memcpy(b + 8, header, hl);
  for (size_t i = 0; i < data_bytes; i++) b[8 + hl + i] = (uint8_t)(i * 37 + 1);
  fuzz_write(path, b, 8 + hl + data_bytes);
  free(b);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  snprintf(dir, sizeof dir, "%s", fuzz_path("index", ".d"));
  mkdir(dir, 0700);
  char path[600];
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *in = fopen(ST_FUZZ_CONFIG, "rb");
  if (!in) {
    perror(ST_FUZZ_CONFIG);
    abort();
  }
  static uint8_t cfg[1 << 16];
  size_t n = fread(cfg, 1, sizeof cfg, in);
  fclose(in);
  fuzz_write(path, cfg, n);
  write_shard("shard-1.safetensors",
              "{\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
              "\"model.layers.0.input_layernorm.weight\":{\"dtype\":\"BF16\",\"shape\":[4],"
              "\"data_offsets\":[16,24]},\"__metadata__\":{\"format\":\"pt\"}}",
              24);
  write_shard("shard-2.safetensors",
              "{\"lm_head.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,4],\"data_offsets\":[0,8]},"
              "\"lm_head.weight_scale_inv\":{\"dtype\":\"F32\",\"shape\":[1,1],\"data_offsets\":[8,12]},"
              "\"embed.weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]}}",
              16);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char path[600];
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  fuzz_write(path, data, size);
  st_checkpoint *ck = NULL;
  if (st_checkpoint_open(dir, &ck) == ST_OK) {
    size_t n = st_checkpoint_count(ck);
    for (size_t i = 0; i < n; i++) {
      const char *name = st_checkpoint_name_at(ck, i);
      if (!st_checkpoint_has(ck, name)) abort();
      st_dtype dt;
      (void)st_checkpoint_dtype(ck, name, &dt);
    }
  }
  st_checkpoint_close(ck);
  return 0;
}
