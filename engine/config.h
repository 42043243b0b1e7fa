/*
** config.h — a DeepSeek-V4 model configuration, read from a checkpoint's config.json.
**
** Both spellings are accepted (SPEC-dsv4 §1.1): the HF field names (layer_types,
** mlp_layer_types, compress_rates, rope_parameters, partial_rotary_factor) and the legacy ones
** (compress_ratios, num_hash_layers, qk_rope_head_dim, compress_rate_csa/hca, rope_scaling).
** Values are stored as read; derived quantities (RoPE tables, YaRN ramps) are computed by the
** engine. model_type must be "deepseek_v4".
*/
#ifndef ST_CONFIG_H
#define ST_CONFIG_H

#include <stdint.h>

#include "common/base.h"

#define ST_MAX_LAYERS 256

typedef enum st_layer_kind {
  ST_LAYER_SLIDING = 0, /* compress ratio 0: window only, rope_theta, no YaRN */
  ST_LAYER_CSA = 1,     /* overlapping compressor (ratio m, 2m tokens pooled) + lightning indexer */
  ST_LAYER_HCA = 2,     /* non-overlapping compressor (ratio m), every visible row attended */
} st_layer_kind;

typedef struct st_config {
  char model_type[32];
  int vocab_size;
  int hidden_size;          /* D */
  int num_hidden_layers;
  int num_attention_heads;  /* H */
  int num_key_value_heads;  /* must be 1 */
  int head_dim;             /* d */
  int rope_head_dim;        /* r: the LAST r dims of a head are rotated (qk_rope_head_dim) */
  int q_lora_rank;
  int o_groups;
  int o_lora_rank;
  int sliding_window;
  int index_n_heads;
  int index_head_dim;
  int index_topk;
  int n_routed_experts;
  int num_experts_per_tok;
  int n_shared_experts;
  int moe_intermediate_size;
  int hc_mult;
  int hc_sinkhorn_iters;
  double hc_eps;
  double rms_norm_eps;
  double routed_scaling_factor;
  double swiglu_limit;
  char scoring_func[24];    /* "sqrtsoftplus" (also "sigmoid", "softmax") */
  double rope_theta;        /* sliding layers */
  double compress_rope_theta;
  /* YaRN on compressed layers (rope_scaling / rope_parameters.compress) */
  int yarn;                 /* 1 if rope type is "yarn" */
  double yarn_factor;
  double yarn_original_max_position;
  double yarn_beta_fast;
  double yarn_beta_slow;
  double yarn_attention_factor; /* DeepSeek-V4 forces 1.0; kept to report other values */
  int64_t max_position_embeddings;
  int bos_token_id;
  int eos_token_id;         /* first one if config gives a list */
  int tie_word_embeddings;
  int num_nextn_predict_layers;
  int compress_rate_csa;    /* default 4 */
  int compress_rate_hca;    /* default 128 */
  st_layer_kind layer_kind[ST_MAX_LAYERS];
  int compress_ratio[ST_MAX_LAYERS]; /* 0, compress_rate_csa or compress_rate_hca */
  int hash_moe[ST_MAX_LAYERS];       /* 1: experts chosen by tid2eid[token] */
  /* quantization_config, if any */
  int quantized;            /* 1 when quantization_config.quant_method == "fp8" */
  int weight_block[2];      /* [128, 128] */
  int scale_ue8m0;          /* scale_fmt == "ue8m0" */
  char expert_dtype[16];    /* "fp4", "fp8" or "" */
} st_config;

/* Reads and validates DIR/config.json (path given in full). Errors name the file and the field. */
st_status st_config_load(const char *path, st_config *out);

/* Parses config JSON text; `origin` names it in error messages. */
st_status st_config_parse(const char *json_text, const char *origin, st_config *out);

#endif
