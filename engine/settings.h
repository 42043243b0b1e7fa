/*
** settings.h — the engine settings of schemas/settings.def, parsed from `--set key=value`.
**
** precision=exact reproduces transformers' DeepseekV4ForCausalLM in fp32; precision=reference
** follows SPEC-dsv4 §2-§4 (bf16 activations, FP8/FP4 QAT round-trips, Hadamard on both indexer
** sides). The other settings change one detail of the indexer or the compressed layers' RoPE so
** that the failure modes of SPEC §6 (F1-F5) can be produced on purpose.
*/
#ifndef ST_SETTINGS_H
#define ST_SETTINGS_H

#include <stddef.h>

#include "common/base.h"
#include "config.h"

typedef enum st_precision { ST_PRECISION_EXACT = 0, ST_PRECISION_REFERENCE = 1 } st_precision;

typedef enum st_number_format {
  ST_FORMAT_AUTO = 0, /* resolved from precision */
  ST_FORMAT_FP32,
  ST_FORMAT_BF16,
  ST_FORMAT_FP8_E4M3FN,
  ST_FORMAT_FP8_E4M3FNUZ,
  ST_FORMAT_FP4_E2M1,
  ST_FORMAT_FP8_E4M3FN_AS_FNUZ, /* F2: written as OCP e4m3fn, read back as e4m3fnuz (x0.5, 0x80 -> NaN) */
} st_number_format;

typedef struct st_settings {
  st_precision precision;
  st_number_format index_k, index_q;
  int rotate;               /* -1 auto; else bit 1 = q rotated, bit 2 = k rotated */
  int topk;                 /* 0 = config index_topk; -1 = all visible rows; else N */
  int index_rope_neox;      /* 0 interleaved pairs (correct for V4), 1 neox halves */
  double compress_rope_theta; /* 0 = config */
  int yarn;                 /* 1 on (config's YaRN on compressed layers), 0 off */
  /* IndexCache (sglang index_topk_freq / index_topk_pattern): which CSA layers compute their
  ** top-k and which reuse the last computed one (st_settings_topk_source). */
  int index_topk_reuse;     /* N >= 1: CSA layers 0, N, 2N, ... (counted among CSA layers) compute */
  char index_topk_pattern[ST_MAX_LAYERS + 1]; /* "" = by index_topk_reuse; else per model layer F|S */
} st_settings;

#define ST_ROTATE_Q 1
#define ST_ROTATE_K 2

void st_settings_default(st_settings *s);

/* Applies one "key=value". Errors name the key and list the allowed values. */
st_status st_settings_set(st_settings *s, const char *key_value);

/* Replaces "auto" and "config" by concrete values for this model. */
void st_settings_resolve(st_settings *s, const st_config *cfg);

/* Effective top-k for a model: N, or INT32_MAX for "all". */
int st_settings_topk(const st_settings *s, const st_config *cfg);

/* The CSA layer whose top-k layer `layer` selects with: the layer itself when it computes its
** own, the last earlier CSA layer that did when it reuses (index_topk_reuse); -1 when layer is no
** CSA layer or the pattern reuses before any CSA layer computed. The one definition of the
** schedule, for the engine and the replayer. */
int st_settings_topk_source(const st_settings *s, const st_config *cfg, int layer);

/* Checks index_topk_reuse against the model: a pattern has one F or S per model layer and its
** first CSA layer computes. Errors name the setting and the layer. */
st_status st_settings_check(const st_settings *s, const st_config *cfg);

/* Writes the settings as a JSON object with every key of the catalogue. Returns length. */
int st_settings_json(const st_settings *s, char *buf, size_t size);

/* Name of a number format as used by --set ("fp8_e4m3fn"). */
const char *st_number_format_name(st_number_format f);

#endif
