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

/* Bounds on config.json values (st_config_parse refuses a value outside them, naming the field).
** Generous for V4-Pro-scale models (hidden 7168, 128 heads of 512, 384 experts, vocab 129280),
** small enough that every product the engine forms from them fits its integer types; the
** products that size buffers are also checked in int64 (ST_CONFIG_MAX_TENSOR elements per
** tensor). This table is the documentation of the bounds.
**   field                                   range
**   vocab_size                              1 .. 4194304
**   hidden_size, q_lora_rank, o_lora_rank   1 .. 65536
**   num_hidden_layers                       1 .. 256 (ST_MAX_LAYERS; more is ST_EUNSUPPORTED)
**   num_attention_heads, index_n_heads,
**   num_key_value_heads, o_groups           1 .. 1024
**   head_dim, index_head_dim                1 .. 4096 (qk_rope_head_dim 0 .. 4096)
**   sliding_window                          1 .. 1048576
**   index_topk                              1 .. 1048576
**   n_routed_experts                        1 .. 4096
**   num_experts_per_tok                     1 .. 256 (and <= n_routed_experts)
**   n_shared_experts                        0 .. 256
**   moe_intermediate_size                   1 .. 262144
**   hc_mult                                 1 .. 16
**   hc_sinkhorn_iters                       1 .. 1000
**   num_nextn_predict_layers, num_hash_layers 0 .. 256
**   compress_rates / compress_rate_csa/hca  1 .. 65536
**   max_position_embeddings                 1 .. 2^40 (yarn original_max_position_embeddings too)
**   weight_block_size                       1 .. 65536 each
**   hc_eps, rms_norm_eps                    0 .. 1
**   routed_scaling_factor, swiglu_limit     (0, 1e6]
**   rope_theta, compress_rope_theta         (0, 1e12]
**   partial_rotary_factor                   0 .. 1
**   yarn factor, beta_fast, beta_slow,
**   mscale, mscale_all_dim, attention_factor |x| <= 1e6 (factor > 0)
**   token ids                               -1 (null) .. 2^31-1 */
#define ST_CONFIG_MAX_VOCAB (1 << 22)
#define ST_CONFIG_MAX_HIDDEN 65536
#define ST_CONFIG_MAX_HEADS 1024
#define ST_CONFIG_MAX_HEAD_DIM 4096
#define ST_CONFIG_MAX_WINDOW (1 << 20)
#define ST_CONFIG_MAX_TOPK (1 << 20)
#define ST_CONFIG_MAX_EXPERTS 4096
#define ST_CONFIG_MAX_EXPERTS_PER_TOK 256
#define ST_CONFIG_MAX_FFN (1 << 18)
#define ST_CONFIG_MAX_HC 16
#define ST_CONFIG_MAX_SINKHORN_ITERS 1000
#define ST_CONFIG_MAX_COMPRESS 65536
#define ST_CONFIG_MAX_POSITIONS (1LL << 40)
#define ST_CONFIG_MAX_SCALE 1e6
#define ST_CONFIG_MAX_THETA 1e12
#define ST_CONFIG_MAX_TENSOR (1LL << 36) /* elements of one tensor sized from the config */

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
