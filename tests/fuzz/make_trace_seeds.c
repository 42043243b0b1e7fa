/*
** make_trace_seeds.c — writes the small HDF5 traces of corpus/trace/ with the project's own
** writer (built with the fuzzers; run by hand: make_trace_seeds DIR). Not a fuzzer.
*/
#include <stdio.h>
#include <string.h>

#include "recorder/trace_writer.h"

static int write_one(const char *path, int deflate, int finish, int positions_last) {
  st_trace_run_attrs attrs = {.run_id = "seed", .model = "tiny", .settings_json = "{\"rotate\":\"none\"}",
                              .config_json = "{}", .positions = positions_last ? "last" : "all",
                              .backend = "cpu-ref", .threads = 1, .n_layers = 2};
  st_trace_writer_options opts = {.deflate_level = deflate};
  st_trace_writer *w = NULL;
  if (st_trace_writer_open(path, &attrs, &opts, &w) != ST_OK) return 1;
  float f[8] = {1, -2, 3.5f, 0, 0.25f, -1e3f, 7, 8};
  int32_t topk[4] = {0, 2, -1, 1};
  uint16_t bf[4] = {0x3F80, 0xC000, 0x7FC0, 0x0000};
  int64_t s3[3] = {1, 2, 4}, s2[2] = {1, 4}, sk[2] = {2, 2};
  for (int p = 0; p < 2; p++) {
    int64_t pos = positions_last ? 3 + p : p;
    if (st_trace_writer_append(w, ST_TAP_INPUT, 0, pos, ST_F32, 3, s3, f) != ST_OK) return 1;
    if (st_trace_writer_append(w, ST_TAP_INDEXER_SCORES, 1, pos, ST_F32, 2, s2, f) != ST_OK) return 1;
    if (st_trace_writer_append(w, ST_TAP_INDEXER_TOPK, 1, pos, ST_I32, 2, s2, topk) != ST_OK) return 1;
    if (st_trace_writer_append(w, ST_TAP_ATTN_QR, 0, pos, ST_BF16, 2, s2, bf) != ST_OK) return 1;
  }
  if (st_trace_writer_append(w, ST_TAP_INDEXER_K, 1, 0, ST_F32, 2, sk, f) != ST_OK) return 1;
  if (st_trace_writer_append(w, ST_TAP_LOGITS, -1, 0, ST_F32, 2, s2, f) != ST_OK) return 1;
  if (!finish) {
    st_trace_writer_abort(w);
    return 0;
  }
  int32_t tokens[5] = {0, 5, 7, 9, 11};
  return st_trace_writer_finish(w, tokens, 5, 3, NULL, NULL) != ST_OK;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: make_trace_seeds DIR\n");
    return 2;
  }
  char p[1024];
  int rc = 0;
  snprintf(p, sizeof p, "%s/plain.h5", argv[1]);
  rc |= write_one(p, 0, 1, 0);
  snprintf(p, sizeof p, "%s/deflate.h5", argv[1]);
  rc |= write_one(p, 1, 1, 1);
  snprintf(p, sizeof p, "%s/unfinished.h5", argv[1]);
  rc |= write_one(p, 0, 0, 0);
  return rc;
}
