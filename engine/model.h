/*
** model.h — the DeepSeek-V4 reference engine: weights, per-request state, forward pass.
**
** st_model holds the weights in their stored formats (one layer can be loaded alone).
** st_session holds one request's state — the window ring, the compressor states and the
** compressed rows of every layer — and runs tokens through the model in chunks. Every chunking
** of the same tokens gives bit-identical results (prefill, chunked prefill and decode share one
** code path), and so does every thread count.
*/
#ifndef ST_MODEL_H
#define ST_MODEL_H

#include <stdint.h>

#include "kernels/backend.h"
#include "common/base.h"
#include "checkpoint.h"
#include "config.h"
#include "settings.h"
#include "taps.h"

/* Weights. Matrices are st_weight views of the checkpoint in their stored format (never
** dequantised); parameter vectors (norms, biases, sinks, ape, mHC mixers) are fp32, converted at
** load (they are a few MB in the largest model). All of it is host memory; a session on a device
** backend uploads its own copy once (st_session_create). */

/* One compressor's weights (SPEC §3.2): ratio m, output dim d, overlap = CSA layout (c = 2). */
typedef struct st_compressor_weights {
  int ratio, dim, overlap;
  st_weight wkv, wgate; /* [c d, D] */
  float *ape;           /* [m, c d] */
  float *norm;          /* [d] */
} st_compressor_weights;

typedef struct st_layer_weights {
  int loaded;
  float *attn_norm, *ffn_norm;                      /* [D] */
  float *hc_attn_fn, *hc_attn_base, *hc_attn_scale; /* [(2+hc) hc, hc D], [(2+hc) hc], [3] */
  float *hc_ffn_fn, *hc_ffn_base, *hc_ffn_scale;
  st_weight wq_a;    /* [q_lo, D] */
  float *q_norm;     /* [q_lo] */
  st_weight wq_b;    /* [H d, q_lo] */
  st_weight wkv;     /* [d, D] */
  float *kv_norm;    /* [d] */
  st_weight wo_a;    /* [G R_o, H d / G]: group g is rows [g R_o, (g+1) R_o) */
  st_weight wo_b;    /* [D, G R_o] */
  float *attn_sink;  /* [H] */
  st_compressor_weights compressor;       /* ratio > 0 */
  st_compressor_weights index_compressor; /* CSA only */
  st_weight index_wq_b;         /* [hI dI, q_lo] */
  st_weight index_weights_proj; /* [hI, D] */
  st_weight gate;    /* [E, D] */
  float *gate_bias;  /* [E]; NULL on hash layers */
  int32_t *tid2eid;  /* [V, kE] on hash layers (host: routing ids are uploaded per chunk) */
  st_weight *w1, *w2, *w3; /* E experts: [F, D], [D, F], [F, D] */
  st_weight shared_w1, shared_w2, shared_w3;
} st_layer_weights;

typedef struct st_model {
  st_checkpoint *checkpoint;
  const st_config *cfg;
  st_weight embed; /* [V, D] */
  st_weight head;  /* [V, D] */
  float *norm;     /* [D] */
  float *hc_head_fn, *hc_head_base, *hc_head_scale; /* [hc, hc D], [hc], [1] */
  st_layer_weights *layers; /* [n_layers] */
  void **owned;    /* what the model allocated (fp32 vectors, weights the backends cannot map) */
  int n_owned, cap_owned;
  size_t weight_bytes; /* resident bytes of every loaded weight and vector */
  int nonfinite_tensors;      /* loaded tensors holding NaN or inf (each warned about once) */
  uint64_t nonfinite_values;  /* their non-finite elements (and scales) */
} st_model;

/* Opens the checkpoint in dir and loads the model-level tensors (embed, head, norm, hc_head). */
st_status st_model_open(const char *dir, st_model **out);
/* Loads one layer's tensors (idempotent). */
st_status st_model_load_layer(st_model *m, int layer);
st_status st_model_load_all(st_model *m);
void st_model_close(st_model *m); /* accepts NULL */

typedef struct st_session_options {
  int64_t max_tokens;          /* capacity: prompt + generated */
  int max_chunk;               /* tokens per internal chunk (0: 256 on host backends, 4096 on device ones) */
  st_settings settings;        /* resolved by st_session_create */
  st_taps *taps;               /* borrowed; NULL = nothing recorded */
  /* Replay: the layers with alt_layers[l] = 1 run the indexer and compressed-layer RoPE under
  ** alt_settings instead (precision must be the same). NULL = every layer uses settings. */
  const uint8_t *alt_layers;   /* [n_layers], borrowed */
  st_settings alt_settings;
  const st_backend *backend;   /* borrowed; NULL = the session opens cpu-ref (the oracle) */
  /* Replay from a layer after the CSA layer whose top-k it reuses (index_topk_reuse): that
  ** layer's recorded top-k, by token position [max_tokens, topk_in_width], and its index. */
  const int32_t *topk_in;      /* borrowed; NULL = none */
  int topk_in_width, topk_in_layer;
  /* Device backends: the pinned staging armed taps are copied into before they reach the sink
  ** (grown to the largest tap; taken at the first armed tap); 0 = 64 MiB. */
  size_t tap_staging;
} st_session_options;

typedef struct st_session st_session;

/* Allocates every buffer the forward pass will use (nothing is allocated afterwards). */
st_status st_session_create(st_model *m, const st_session_options *opt, st_session **out);
void st_session_free(st_session *s); /* accepts NULL */

/* Runs tokens[0..n) at the next n positions. If logits is non-NULL it receives the logits of the
** last token [V]; if all_logits is non-NULL it receives [n, V]. */
st_status st_session_forward(st_session *s, const int32_t *tokens, int n, float *logits,
                             float *all_logits);

/* Runs layers [first, last] only: the residual streams entering layer `first` come from X_in
** [n, hc, D] instead of the embedding; X_out (if non-NULL) receives the streams leaving layer
** `last` [n, hc, D]; when last is the final layer, logits are computed as in st_session_forward.
** tokens are still needed (hash routing). Only the layers run need to be loaded. */
st_status st_session_forward_layers(st_session *s, const int32_t *tokens, int n, const float *X_in,
                                    int first, int last, float *X_out, float *logits,
                                    float *all_logits);

/* Resident bytes of the model's loaded weights, in their stored formats (plus the fp32 vectors):
** what `run --json` and the benchmarks report beside the checkpoint's own size. */
size_t st_model_weight_bytes(const st_model *m);
/* Bytes the session allocated from its backend (state, scratch, uploaded weights). */
size_t st_session_backend_bytes(const st_session *s);
/* Tokens per internal chunk: opt->max_chunk, or the backend's default (256 on host-memory
** backends, 4096 on device backends), capped at max_tokens. */
int st_session_max_chunk(const st_session *s);
const st_backend *st_session_backend(const st_session *s);

/* Positions whose logits, as returned by st_session_forward*, held NaN or inf (a warning, not
** an error: the run goes on and says so). */
int64_t st_session_nonfinite_logits(const st_session *s);

/* Tokens processed so far. */
int64_t st_session_position(const st_session *s);
const st_settings *st_session_settings(const st_session *s);

/* Greedy generation: forwards the prompt, then up to max_new tokens (argmax, ties to the lower
** id), stopping after eos when stop_at_eos. Generated ids go to out (capacity max_new). */
st_status st_generate_greedy(st_session *s, const int32_t *prompt, int n_prompt, int max_new,
                             int stop_at_eos, int32_t *out, int *n_out);

/* RoPE inverse frequencies of one layer kind under the settings: [rope_dim / 2]. */
void st_rope_inv_freq(const st_config *cfg, const st_settings *set, int compressed, double *out);
/* cos and sin of one position for every rope pair (r/2 values each): the angle is the fp32
** product of the inverse frequency and the position, as the oracle computes it; cos and sin are
** taken in double and rounded to float. The engine's tables and the replayer use this one. */
void st_rope_cos_sin(const double *inv_freq, int half, int64_t position, float *cos_out, float *sin_out);

#endif
