/*
** config.c — DeepSeek-V4 config.json -> st_config (SPEC-dsv4 §1.1).
**
** Follows transformers' DeepseekV4Config (5.17) field by field, because exact mode must build the
** model transformers builds from the same file: its defaults, its precedence (the modern field
** wins over the legacy one: layer_types > compress_ratios > default schedule; mlp_layer_types >
** num_hash_layers; partial_rotary_factor > qk_rope_head_dim; nested rope_parameters {main,
** compress} > flat rope_parameters > rope_scaling), and its arithmetic (rope_head_dim =
** int(head_dim * partial_rotary_factor) in double, as Python computes it).
**
** A JSON null counts as absent (save_pretrained writes nulls for unset optional fields). Wrong
** JSON types and impossible values are ST_EFORMAT; valid configurations this engine does not
** run (another model_type, several KV heads, too many layers) are ST_EUNSUPPORTED. Every message
** starts with the origin (the file) and names the field.
**
** Exact mode needs no divisibility beyond what the model's own reshapes need
** (heads*head_dim % o_groups == 0); the FP8/FP4/Hadamard shape rules belong to the quantised
** paths and are checked where those run.
*/
#include "config.h"
#include "common/json_oom.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cfg {
  json_t *root;
  const char *origin;
} cfg;

static const char *json_kind(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "an array";
  case JSON_STRING: return "a string";
  case JSON_INTEGER: return "an integer";
  case JSON_REAL: return "a real number";
  case JSON_TRUE: case JSON_FALSE: return "a boolean";
  case JSON_NULL: return "null";
  }
  return "?";
}

/* The value of `field` in `obj`, NULL when absent or null. */
static json_t *field_get(json_t *obj, const char *field) {
  json_t *v = json_object_get(obj, field);
  return json_is_null(v) ? NULL : v;
}

/* Integer field in [lo, hi]; `def` when absent. `where` prefixes the name for nested objects. */
static st_status get_int_in(const cfg *c, json_t *obj, const char *where, const char *field,
                            long long def, long long lo, long long hi, long long *out) {
  json_t *v = field_get(obj, field);
  if (!v) {
    *out = def;
    return ST_OK;
  }
  /* 4.0 written by a float-minded tool is still an integer */
  if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
      fabs(json_real_value(v)) < 9e15) {
    *out = (long long)json_real_value(v);
  } else if (json_is_integer(v)) {
    *out = json_integer_value(v);
  } else {
    return st_fail(ST_EFORMAT, "%s: field \"%s%s\" must be an integer, found %s", c->origin, where,
                   field, json_kind(v));
  }
  if (*out < lo || *out > hi)
    return st_fail(ST_EFORMAT, "%s: field \"%s%s\" = %lld is out of range [%lld, %lld]", c->origin,
                   where, field, *out, lo, hi);
  return ST_OK;
}

static st_status get_int(const cfg *c, const char *field, int def, int lo, int hi, int *out) {
  long long v;
  st_status rc = get_int_in(c, c->root, "", field, def, lo, hi, &v);
  if (rc == ST_OK) *out = (int)v;
  return rc;
}

static st_status get_num_in(const cfg *c, json_t *obj, const char *where, const char *field,
                            double def, double *out);

/* A number field in [lo, hi] (both finite); `def` when absent. */
static st_status get_num_range(const cfg *c, json_t *obj, const char *where, const char *field,
                               double def, double lo, double hi, double *out) {
  st_status rc = get_num_in(c, obj, where, field, def, out);
  if (rc == ST_OK && !(*out >= lo && *out <= hi))
    return st_fail(ST_EFORMAT, "%s: field \"%s%s\" = %g is out of range [%g, %g]", c->origin, where,
                   field, *out, lo, hi);
  return rc;
}

/* Number field (integer or real); `def` when absent. */
static st_status get_num_in(const cfg *c, json_t *obj, const char *where, const char *field,
                            double def, double *out) {
  json_t *v = field_get(obj, field);
  if (!v) {
    *out = def;
    return ST_OK;
  }
  if (!json_is_number(v))
    return st_fail(ST_EFORMAT, "%s: field \"%s%s\" must be a number, found %s", c->origin, where,
                   field, json_kind(v));
  *out = json_number_value(v);
  if (!isfinite(*out))
    return st_fail(ST_EFORMAT, "%s: field \"%s%s\" is not finite", c->origin, where, field);
  return ST_OK;
}

/* Positive and at most hi. */
static st_status get_positive(const cfg *c, const char *field, double def, double hi, double *out) {
  st_status rc = get_num_in(c, c->root, "", field, def, out);
  if (rc == ST_OK && !(*out > 0))
    return st_fail(ST_EFORMAT, "%s: field \"%s\" = %g must be positive", c->origin, field, *out);
  if (rc == ST_OK && *out > hi)
    return st_fail(ST_EFORMAT, "%s: field \"%s\" = %g is out of range (0, %g]", c->origin, field,
                   *out, hi);
  return rc;
}

/* Non-negative and at most hi. */
static st_status get_nonnegative(const cfg *c, const char *field, double def, double hi, double *out) {
  st_status rc = get_num_in(c, c->root, "", field, def, out);
  if (rc == ST_OK && !(*out >= 0))
    return st_fail(ST_EFORMAT, "%s: field \"%s\" = %g must not be negative", c->origin, field, *out);
  if (rc == ST_OK && *out > hi)
    return st_fail(ST_EFORMAT, "%s: field \"%s\" = %g is out of range [0, %g]", c->origin, field,
                   *out, hi);
  return rc;
}

static st_status get_bool(const cfg *c, const char *field, int def, int *out) {
  json_t *v = field_get(c->root, field);
  if (!v) {
    *out = def;
    return ST_OK;
  }
  if (!json_is_boolean(v))
    return st_fail(ST_EFORMAT, "%s: field \"%s\" must be true or false, found %s", c->origin, field,
                   json_kind(v));
  *out = json_is_true(v);
  return ST_OK;
}

/* String field copied into buf; `def` when absent; ST_EFORMAT if it does not fit. */
static st_status get_string_in(const cfg *c, json_t *obj, const char *where, const char *field,
                               const char *def, char *buf, size_t size) {
  json_t *v = field_get(obj, field);
  const char *s = def;
  if (v) {
    if (!json_is_string(v))
      return st_fail(ST_EFORMAT, "%s: field \"%s%s\" must be a string, found %s", c->origin, where,
                     field, json_kind(v));
    s = json_string_value(v);
  }
  if (strlen(s) >= size)
    return st_fail(ST_EFORMAT, "%s: field \"%s%s\" = \"%.40s...\" is too long", c->origin, where,
                   field, s);
  snprintf(buf, size, "%s", s);
  return ST_OK;
}

/* Token id that may be an integer, a list of integers (first one is kept) or null (-1). */
static st_status get_token_id(const cfg *c, const char *field, int def, int *out) {
  json_t *v = json_object_get(c->root, field);
  if (!v) {
    *out = def;
    return ST_OK;
  }
  if (json_is_null(v)) {
    *out = -1;
    return ST_OK;
  }
  if (json_is_array(v)) {
    if (json_array_size(v) == 0) {
      *out = -1;
      return ST_OK;
    }
    v = json_array_get(v, 0);
  }
  if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT_MAX)
    return st_fail(ST_EFORMAT, "%s: field \"%s\" must be a token id or a list of them", c->origin,
                   field);
  *out = (int)json_integer_value(v);
  return ST_OK;
}

/* ------------------------------------------------------------------ layer schedules */

static const char *const layer_type_names[] = {
  [ST_LAYER_SLIDING] = "sliding_attention",
  [ST_LAYER_CSA] = "compressed_sparse_attention",
  [ST_LAYER_HCA] = "heavily_compressed_attention",
};

static st_status parse_compress_rates(const cfg *c, st_config *o) {
  long long v;
  st_status rc;
  /* legacy scalars first; the dict (HF's modern field) is folded in by HF the other way round:
  ** the dict is the base and the legacy scalars override it. */
  json_t *rates = field_get(c->root, "compress_rates");
  o->compress_rate_csa = 4;
  o->compress_rate_hca = 128;
  if (rates) {
    if (!json_is_object(rates))
      return st_fail(ST_EFORMAT, "%s: field \"compress_rates\" must be an object, found %s",
                     c->origin, json_kind(rates));
    const char *key;
    json_t *value;
    json_object_foreach(rates, key, value) {
      int is_csa = strcmp(key, layer_type_names[ST_LAYER_CSA]) == 0;
      int is_hca = strcmp(key, layer_type_names[ST_LAYER_HCA]) == 0;
      if (!is_csa && !is_hca) {
        if (strcmp(key, layer_type_names[ST_LAYER_SLIDING]) == 0 && json_is_integer(value) &&
            json_integer_value(value) == 0)
          continue;
        return st_fail(ST_EUNSUPPORTED, "%s: field \"compress_rates\" has unknown layer type \"%s\"",
                       c->origin, key);
      }
      if ((rc = get_int_in(c, rates, "compress_rates.", key, 0, 1, ST_CONFIG_MAX_COMPRESS, &v)) != ST_OK) return rc;
      *(is_csa ? &o->compress_rate_csa : &o->compress_rate_hca) = (int)v;
    }
  }
  if ((rc = get_int_in(c, c->root, "", "compress_rate_csa", o->compress_rate_csa, 1, ST_CONFIG_MAX_COMPRESS, &v)))
    return rc;
  o->compress_rate_csa = (int)v;
  if ((rc = get_int_in(c, c->root, "", "compress_rate_hca", o->compress_rate_hca, 1, ST_CONFIG_MAX_COMPRESS, &v)))
    return rc;
  o->compress_rate_hca = (int)v;
  return ST_OK;
}

/* An array field of at least n entries (extra entries are MTP blocks and ignored). */
static st_status get_schedule(const cfg *c, const char *field, int n, json_t **out) {
  json_t *v = field_get(c->root, field);
  *out = v;
  if (!v) return ST_OK;
  if (!json_is_array(v))
    return st_fail(ST_EFORMAT, "%s: field \"%s\" must be an array, found %s", c->origin, field,
                   json_kind(v));
  if (json_array_size(v) < (size_t)n)
    return st_fail(ST_EFORMAT, "%s: field \"%s\" has %zu entries but num_hidden_layers is %d",
                   c->origin, field, json_array_size(v), n);
  return ST_OK;
}

static st_status parse_layer_types(const cfg *c, st_config *o) {
  int n = o->num_hidden_layers;
  json_t *types, *ratios;
  st_status rc;
  if ((rc = get_schedule(c, "layer_types", n, &types)) != ST_OK) return rc;
  if (types) {
    for (int i = 0; i < n; i++) {
      json_t *t = json_array_get(types, (size_t)i);
      if (!json_is_string(t))
        return st_fail(ST_EFORMAT, "%s: field \"layer_types[%d]\" must be a string, found %s",
                       c->origin, i, json_kind(t));
      int k = -1;
      for (int j = 0; j < 3; j++)
        if (strcmp(json_string_value(t), layer_type_names[j]) == 0) k = j;
      if (k < 0)
        return st_fail(ST_EUNSUPPORTED,
                       "%s: field \"layer_types[%d]\" = \"%s\" is not a DeepSeek-V4 layer type "
                       "(sliding_attention, compressed_sparse_attention, "
                       "heavily_compressed_attention)",
                       c->origin, i, json_string_value(t));
      o->layer_kind[i] = (st_layer_kind)k;
    }
  } else {
    if ((rc = get_schedule(c, "compress_ratios", n, &ratios)) != ST_OK) return rc;
    if (ratios) {
      for (int i = 0; i < n; i++) {
        json_t *r = json_array_get(ratios, (size_t)i);
        if (!json_is_integer(r))
          return st_fail(ST_EFORMAT, "%s: field \"compress_ratios[%d]\" must be an integer, found %s",
                         c->origin, i, json_kind(r));
        /* transformers maps the literal ratios 0/4/128 to types, whatever compress_rates says */
        switch (json_integer_value(r)) {
        case 0: o->layer_kind[i] = ST_LAYER_SLIDING; break;
        case 4: o->layer_kind[i] = ST_LAYER_CSA; break;
        case 128: o->layer_kind[i] = ST_LAYER_HCA; break;
        default:
          return st_fail(ST_EUNSUPPORTED,
                         "%s: field \"compress_ratios[%d]\" = %lld is not a known layer type "
                         "(0, 4 or 128)",
                         c->origin, i, (long long)json_integer_value(r));
        }
      }
    } else {
      /* transformers' default: two HCA layers, then "CSA if i % 2 else HCA" for i in
      ** range(n - 2), i.e. layer 2 is HCA, layer 3 CSA, layer 4 HCA, ... */
      for (int i = 0; i < n; i++)
        o->layer_kind[i] = i < 2 ? ST_LAYER_HCA : ((i - 2) % 2 ? ST_LAYER_CSA : ST_LAYER_HCA);
    }
  }
  for (int i = 0; i < n; i++)
    o->compress_ratio[i] = o->layer_kind[i] == ST_LAYER_SLIDING ? 0
                           : o->layer_kind[i] == ST_LAYER_CSA   ? o->compress_rate_csa
                                                                : o->compress_rate_hca;
  return ST_OK;
}

static st_status parse_mlp_types(const cfg *c, st_config *o) {
  int n = o->num_hidden_layers;
  json_t *types;
  st_status rc;
  if ((rc = get_schedule(c, "mlp_layer_types", n, &types)) != ST_OK) return rc;
  if (types) {
    for (int i = 0; i < n; i++) {
      json_t *t = json_array_get(types, (size_t)i);
      const char *s = json_string_value(t);
      if (!s)
        return st_fail(ST_EFORMAT, "%s: field \"mlp_layer_types[%d]\" must be a string, found %s",
                       c->origin, i, json_kind(t));
      if (strcmp(s, "hash_moe") == 0) o->hash_moe[i] = 1;
      else if (strcmp(s, "moe") == 0) o->hash_moe[i] = 0;
      else
        return st_fail(ST_EUNSUPPORTED,
                       "%s: field \"mlp_layer_types[%d]\" = \"%s\" is not hash_moe or moe",
                       c->origin, i, s);
    }
    return ST_OK;
  }
  int n_hash;
  if ((rc = get_int(c, "num_hash_layers", 3, 0, ST_MAX_LAYERS, &n_hash)) != ST_OK) return rc;
  for (int i = 0; i < n; i++) o->hash_moe[i] = i < n_hash;
  return ST_OK;
}

/* ------------------------------------------------------------------ RoPE */

/* transformers' YaRN default attention factor when none is given: get_mscale(factor) or
** get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim). */
static double yarn_mscale(double factor, double mscale) {
  return factor <= 1 ? 1.0 : 0.1 * mscale * log(factor) + 1.0;
}

/* Reads one RoPE parameter object: rope_type ("rope_type" or "type", default "default") and, for
** yarn, its parameters. `forced_attention_factor` is HF's flat-config behaviour (1.0 forced). */
static st_status parse_compress_rope(const cfg *c, json_t *p, const char *where,
                                     int force_attention_factor, st_config *o) {
  char type[32];
  st_status rc;
  const char *type_field = field_get(p, "rope_type") ? "rope_type" : "type";
  if ((rc = get_string_in(c, p, where, type_field, "default", type, sizeof type)) != ST_OK)
    return rc;
  if (strcmp(type, "default") == 0) {
    o->yarn = 0;
    return ST_OK;
  }
  if (strcmp(type, "yarn") != 0)
    return st_fail(ST_EUNSUPPORTED, "%s: field \"%s%s\" = \"%s\": only yarn or default RoPE is "
                   "supported on compressed layers", c->origin, where, type_field, type);
  o->yarn = 1;
  double mscale, mscale_all_dim;
  if ((rc = get_num_range(c, p, where, "factor", 1.0, -ST_CONFIG_MAX_SCALE, ST_CONFIG_MAX_SCALE,
                          &o->yarn_factor)) != ST_OK ||
      (rc = get_num_range(c, p, where, "original_max_position_embeddings",
                          (double)o->max_position_embeddings, -(double)ST_CONFIG_MAX_POSITIONS,
                          (double)ST_CONFIG_MAX_POSITIONS, &o->yarn_original_max_position)) != ST_OK ||
      (rc = get_num_range(c, p, where, "beta_fast", 32.0, -ST_CONFIG_MAX_SCALE, ST_CONFIG_MAX_SCALE,
                          &o->yarn_beta_fast)) != ST_OK ||
      (rc = get_num_range(c, p, where, "beta_slow", 1.0, -ST_CONFIG_MAX_SCALE, ST_CONFIG_MAX_SCALE,
                          &o->yarn_beta_slow)) != ST_OK ||
      (rc = get_num_range(c, p, where, "mscale", 0.0, -ST_CONFIG_MAX_SCALE, ST_CONFIG_MAX_SCALE,
                          &mscale)) != ST_OK ||
      (rc = get_num_range(c, p, where, "mscale_all_dim", 0.0, -ST_CONFIG_MAX_SCALE,
                          ST_CONFIG_MAX_SCALE, &mscale_all_dim)) != ST_OK)
    return rc;
  if (!(o->yarn_factor > 0) || !(o->yarn_original_max_position > 0))
    return st_fail(ST_EFORMAT, "%s: field \"%sfactor\"/\"%soriginal_max_position_embeddings\" "
                   "must be positive", c->origin, where, where);
  double def_af = mscale != 0 && mscale_all_dim != 0
                      ? yarn_mscale(o->yarn_factor, mscale) / yarn_mscale(o->yarn_factor, mscale_all_dim)
                      : yarn_mscale(o->yarn_factor, 1.0);
  if (force_attention_factor) def_af = 1.0;
  return get_num_range(c, p, where, "attention_factor", def_af, -ST_CONFIG_MAX_SCALE,
                       ST_CONFIG_MAX_SCALE, &o->yarn_attention_factor);
}

static st_status parse_rope(const cfg *c, st_config *o) {
  st_status rc;
  if ((rc = get_positive(c, "rope_theta", 10000.0, ST_CONFIG_MAX_THETA, &o->rope_theta)) != ST_OK ||
      (rc = get_positive(c, "compress_rope_theta", 160000.0, ST_CONFIG_MAX_THETA,
                         &o->compress_rope_theta)) != ST_OK)
    return rc;
  o->yarn = 0;
  o->yarn_factor = 1.0;
  o->yarn_original_max_position = (double)o->max_position_embeddings;
  o->yarn_beta_fast = 32.0;
  o->yarn_beta_slow = 1.0;
  o->yarn_attention_factor = 1.0;

  json_t *rp = field_get(c->root, "rope_parameters");
  if (rp && !json_is_object(rp))
    return st_fail(ST_EFORMAT, "%s: field \"rope_parameters\" must be an object, found %s",
                   c->origin, json_kind(rp));
  json_t *main_p = rp ? field_get(rp, "main") : NULL;
  json_t *compress_p = rp ? field_get(rp, "compress") : NULL;
  if (json_is_object(main_p) && json_is_object(compress_p)) {
    char type[32];
    const char *type_field = field_get(main_p, "rope_type") ? "rope_type" : "type";
    if ((rc = get_string_in(c, main_p, "rope_parameters.main.", type_field, "default", type,
                            sizeof type)) != ST_OK)
      return rc;
    if (strcmp(type, "default") != 0)
      return st_fail(ST_EUNSUPPORTED, "%s: field \"rope_parameters.main.%s\" = \"%s\": the main "
                     "(sliding-window) RoPE must be default", c->origin, type_field, type);
    if ((rc = get_num_range(c, main_p, "rope_parameters.main.", "rope_theta", o->rope_theta,
                            -ST_CONFIG_MAX_THETA, ST_CONFIG_MAX_THETA, &o->rope_theta)) != ST_OK ||
        (rc = get_num_range(c, compress_p, "rope_parameters.compress.", "rope_theta",
                            o->compress_rope_theta, -ST_CONFIG_MAX_THETA, ST_CONFIG_MAX_THETA,
                            &o->compress_rope_theta)) != ST_OK)
      return rc;
    if (!(o->rope_theta > 0) || !(o->compress_rope_theta > 0))
      return st_fail(ST_EFORMAT, "%s: field \"rope_parameters.*.rope_theta\" must be positive",
                     c->origin);
    return parse_compress_rope(c, compress_p, "rope_parameters.compress.", 0, o);
  }
  /* flat: rope_parameters without {main, compress}, else legacy rope_scaling; the main theta is
  ** always the top-level rope_theta and the compressed one compress_rope_theta */
  const char *where = "rope_parameters.";
  json_t *flat = rp;
  if (!flat) {
    flat = field_get(c->root, "rope_scaling");
    where = "rope_scaling.";
    if (flat && !json_is_object(flat))
      return st_fail(ST_EFORMAT, "%s: field \"rope_scaling\" must be an object, found %s",
                     c->origin, json_kind(flat));
  }
  if (!flat) return ST_OK;
  return parse_compress_rope(c, flat, where, 1, o);
}

/* ------------------------------------------------------------------ quantization_config */

static st_status parse_quantization(const cfg *c, st_config *o) {
  st_status rc;
  o->quantized = 0;
  o->weight_block[0] = o->weight_block[1] = 128;
  o->scale_ue8m0 = 0;
  json_t *q = field_get(c->root, "quantization_config");
  if (!q) return ST_OK;
  if (!json_is_object(q))
    return st_fail(ST_EFORMAT, "%s: field \"quantization_config\" must be an object, found %s",
                   c->origin, json_kind(q));
  char method[32], scale_fmt[32];
  if ((rc = get_string_in(c, q, "quantization_config.", "quant_method", "", method,
                          sizeof method)) != ST_OK ||
      (rc = get_string_in(c, q, "quantization_config.", "scale_fmt", "", scale_fmt,
                          sizeof scale_fmt)) != ST_OK)
    return rc;
  o->quantized = strcmp(method, "fp8") == 0;
  o->scale_ue8m0 = strcmp(scale_fmt, "ue8m0") == 0;
  json_t *wb = field_get(q, "weight_block_size");
  if (wb) {
    /* Values are stored as read; the loader refuses block sizes it cannot dequantise (only 64
    ** and 128) when an FP8 tensor is actually loaded, naming that tensor. */
    if (!json_is_array(wb) || json_array_size(wb) != 2 ||
        !json_is_integer(json_array_get(wb, 0)) || !json_is_integer(json_array_get(wb, 1)) ||
        json_integer_value(json_array_get(wb, 0)) <= 0 ||
        json_integer_value(json_array_get(wb, 1)) <= 0 ||
        json_integer_value(json_array_get(wb, 0)) > ST_CONFIG_MAX_HIDDEN ||
        json_integer_value(json_array_get(wb, 1)) > ST_CONFIG_MAX_HIDDEN)
      return st_fail(ST_EFORMAT, "%s: field \"quantization_config.weight_block_size\" must be "
                     "[rows, cols] integers in [1, %d]", c->origin, ST_CONFIG_MAX_HIDDEN);
    o->weight_block[0] = (int)json_integer_value(json_array_get(wb, 0));
    o->weight_block[1] = (int)json_integer_value(json_array_get(wb, 1));
  }
  return ST_OK;
}

/* ------------------------------------------------------------------ buffer sizes */

/* a * b in int64, or -1 when it would exceed ST_CONFIG_MAX_TENSOR (both non-negative). */
static int64_t checked_mul(int64_t a, int64_t b) {
  if (a < 0 || b < 0) return -1;
  if (a != 0 && b > ST_CONFIG_MAX_TENSOR / a) return -1;
  return a * b;
}

/* The products that size the engine's tensors and buffers, in int64: each must stay within
** ST_CONFIG_MAX_TENSOR elements, and those the engine keeps in an int within INT_MAX. */
static st_status check_products(const cfg *c, const st_config *o) {
  int64_t mixes = (int64_t)(2 + o->hc_mult) * o->hc_mult;
  int64_t ffn_width = o->hidden_size > o->moe_intermediate_size ? o->hidden_size
                                                                 : o->moe_intermediate_size;
  const struct {
    const char *what; /* the fields, as named in the message */
    int64_t a, b;
    int64_t limit;
  } p[] = {
    {"vocab_size*hidden_size (embed, head)", o->vocab_size, o->hidden_size, ST_CONFIG_MAX_TENSOR},
    {"num_attention_heads*head_dim (wq_b, wo_a)", o->num_attention_heads, o->head_dim, INT_MAX},
    {"index_n_heads*index_head_dim (indexer wq_b)", o->index_n_heads, o->index_head_dim, INT_MAX},
    {"o_groups*o_lora_rank (wo_a, wo_b)", o->o_groups, o->o_lora_rank, INT_MAX},
    {"hc_mult*hidden_size (residual streams)", o->hc_mult, o->hidden_size, INT_MAX},
    {"(2+hc_mult)*hc_mult*hc_mult*hidden_size (hc_attn_fn)", mixes, (int64_t)o->hc_mult * o->hidden_size,
     INT_MAX},
    {"num_experts_per_tok*max(hidden_size, moe_intermediate_size)", o->num_experts_per_tok,
     ffn_width, INT_MAX},
    {"moe_intermediate_size*hidden_size (an expert)", o->moe_intermediate_size, o->hidden_size,
     ST_CONFIG_MAX_TENSOR},
    {"n_routed_experts*moe_intermediate_size*hidden_size (a layer's experts)", o->n_routed_experts,
     (int64_t)o->moe_intermediate_size * o->hidden_size, ST_CONFIG_MAX_TENSOR},
    {"vocab_size*num_experts_per_tok (tid2eid)", o->vocab_size, o->num_experts_per_tok, INT_MAX},
  };
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
    int64_t v = checked_mul(p[i].a, p[i].b);
    if (v < 0 || v > p[i].limit)
      return st_fail(ST_EFORMAT, "%s: fields %s = %lld x %lld exceed %lld elements", c->origin,
                     p[i].what, (long long)p[i].a, (long long)p[i].b, (long long)p[i].limit);
  }
  return ST_OK;
}

/* ------------------------------------------------------------------ entry points */

static st_status parse_root(const cfg *c, st_config *o) {
  st_status rc;
  memset(o, 0, sizeof *o);
  json_t *mt = field_get(c->root, "model_type");
  if (!mt)
    return st_fail(ST_EUNSUPPORTED, "%s: field \"model_type\" is missing (expected \"deepseek_v4\")",
                   c->origin);
  if (!json_is_string(mt))
    return st_fail(ST_EFORMAT, "%s: field \"model_type\" must be a string, found %s", c->origin,
                   json_kind(mt));
  if (strcmp(json_string_value(mt), "deepseek_v4") != 0)
    return st_fail(ST_EUNSUPPORTED, "%s: field \"model_type\" = \"%.64s\" is not supported "
                   "(expected \"deepseek_v4\")", c->origin, json_string_value(mt));
  snprintf(o->model_type, sizeof o->model_type, "%s", "deepseek_v4");

  /* Bounds (config.h, ST_CONFIG_MAX_*): generous for V4-Pro-scale models, small enough that every
  ** product the engine forms from them fits its integer types (checked below in int64). */
#define INT_FIELD(name, def, lo, hi)                                                               \
  if ((rc = get_int(c, #name, def, lo, hi, &o->name)) != ST_OK) return rc;
  INT_FIELD(vocab_size, 129280, 1, ST_CONFIG_MAX_VOCAB)
  INT_FIELD(hidden_size, 4096, 1, ST_CONFIG_MAX_HIDDEN)
  INT_FIELD(num_hidden_layers, 43, 1, 65536) /* above ST_MAX_LAYERS: ST_EUNSUPPORTED below */
  INT_FIELD(num_attention_heads, 64, 1, ST_CONFIG_MAX_HEADS)
  INT_FIELD(num_key_value_heads, 1, 1, ST_CONFIG_MAX_HEADS)
  INT_FIELD(head_dim, 512, 1, ST_CONFIG_MAX_HEAD_DIM)
  INT_FIELD(q_lora_rank, 1024, 1, ST_CONFIG_MAX_HIDDEN)
  INT_FIELD(o_groups, 8, 1, ST_CONFIG_MAX_HEADS)
  INT_FIELD(o_lora_rank, 1024, 1, ST_CONFIG_MAX_HIDDEN)
  INT_FIELD(sliding_window, 128, 1, ST_CONFIG_MAX_WINDOW)
  INT_FIELD(index_n_heads, 64, 1, ST_CONFIG_MAX_HEADS)
  INT_FIELD(index_head_dim, 128, 1, ST_CONFIG_MAX_HEAD_DIM)
  INT_FIELD(index_topk, 512, 1, ST_CONFIG_MAX_TOPK)
  INT_FIELD(n_routed_experts, 256, 1, ST_CONFIG_MAX_EXPERTS)
  INT_FIELD(num_experts_per_tok, 6, 1, ST_CONFIG_MAX_EXPERTS_PER_TOK)
  INT_FIELD(n_shared_experts, 1, 0, ST_CONFIG_MAX_EXPERTS_PER_TOK)
  INT_FIELD(moe_intermediate_size, 2048, 1, ST_CONFIG_MAX_FFN)
  INT_FIELD(hc_mult, 4, 1, ST_CONFIG_MAX_HC)
  INT_FIELD(hc_sinkhorn_iters, 20, 1, ST_CONFIG_MAX_SINKHORN_ITERS)
  INT_FIELD(num_nextn_predict_layers, 1, 0, ST_MAX_LAYERS)
#undef INT_FIELD
  long long max_pos;
  if ((rc = get_int_in(c, c->root, "", "max_position_embeddings", 1048576, 1,
                       ST_CONFIG_MAX_POSITIONS, &max_pos)) != ST_OK)
    return rc;
  o->max_position_embeddings = max_pos;
  if ((rc = get_nonnegative(c, "hc_eps", 1e-6, 1.0, &o->hc_eps)) != ST_OK ||
      (rc = get_nonnegative(c, "rms_norm_eps", 1e-6, 1.0, &o->rms_norm_eps)) != ST_OK ||
      (rc = get_positive(c, "routed_scaling_factor", 1.5, ST_CONFIG_MAX_SCALE,
                         &o->routed_scaling_factor)) != ST_OK ||
      (rc = get_positive(c, "swiglu_limit", 10.0, ST_CONFIG_MAX_SCALE, &o->swiglu_limit)) != ST_OK ||
      (rc = get_string_in(c, c->root, "", "scoring_func", "sqrtsoftplus", o->scoring_func,
                          sizeof o->scoring_func)) != ST_OK ||
      (rc = get_string_in(c, c->root, "", "expert_dtype", "", o->expert_dtype,
                          sizeof o->expert_dtype)) != ST_OK ||
      (rc = get_token_id(c, "bos_token_id", 0, &o->bos_token_id)) != ST_OK ||
      (rc = get_token_id(c, "eos_token_id", 1, &o->eos_token_id)) != ST_OK ||
      (rc = get_bool(c, "tie_word_embeddings", 0, &o->tie_word_embeddings)) != ST_OK)
    return rc;
  if (strcmp(o->scoring_func, "sqrtsoftplus") != 0 && strcmp(o->scoring_func, "sigmoid") != 0 &&
      strcmp(o->scoring_func, "softmax") != 0)
    return st_fail(ST_EUNSUPPORTED, "%s: field \"scoring_func\" = \"%s\" is not sqrtsoftplus, "
                   "sigmoid or softmax", c->origin, o->scoring_func);

  /* rope_head_dim exactly as transformers computes it */
  json_t *prf = field_get(c->root, "partial_rotary_factor");
  json_t *qkr = field_get(c->root, "qk_rope_head_dim");
  double factor;
  if (prf) {
    if ((rc = get_num_range(c, c->root, "", "partial_rotary_factor", 0, 0, 1, &factor)) != ST_OK)
      return rc;
  } else if (qkr) {
    int r;
    if ((rc = get_int(c, "qk_rope_head_dim", 0, 0, ST_CONFIG_MAX_HEAD_DIM, &r)) != ST_OK) return rc;
    factor = (double)r / (double)o->head_dim;
  } else {
    factor = 64.0 / 512.0;
  }
  double rope = (double)o->head_dim * factor;
  if (!(rope >= 0) || rope > (double)o->head_dim)
    return st_fail(ST_EFORMAT, "%s: field \"%s\" gives %g rotary dims for head_dim %d", c->origin,
                   prf ? "partial_rotary_factor" : "qk_rope_head_dim", rope, o->head_dim);
  o->rope_head_dim = (int)rope;

  if (o->num_key_value_heads != 1)
    return st_fail(ST_EUNSUPPORTED, "%s: field \"num_key_value_heads\" = %d: DeepSeek-V4 shares one "
                   "KV head (must be 1)", c->origin, o->num_key_value_heads);
  const char *rope_field = prf ? "partial_rotary_factor" : qkr ? "qk_rope_head_dim" : "head_dim";
  if (o->rope_head_dim <= 0 || o->rope_head_dim % 2)
    return st_fail(ST_EUNSUPPORTED, "%s: field \"%s\": rope_head_dim %d must be even and positive "
                   "(interleaved pairs)", c->origin, rope_field, o->rope_head_dim);
  if (o->head_dim <= o->rope_head_dim)
    return st_fail(ST_EUNSUPPORTED, "%s: field \"head_dim\" = %d must exceed rope_head_dim %d",
                   c->origin, o->head_dim, o->rope_head_dim);
  if (o->index_head_dim < o->rope_head_dim)
    return st_fail(ST_EUNSUPPORTED, "%s: field \"index_head_dim\" = %d is smaller than "
                   "rope_head_dim %d", c->origin, o->index_head_dim, o->rope_head_dim);
  if (o->num_hidden_layers > ST_MAX_LAYERS)
    return st_fail(ST_EUNSUPPORTED, "%s: field \"num_hidden_layers\" = %d exceeds %d", c->origin,
                   o->num_hidden_layers, ST_MAX_LAYERS);
  if (((int64_t)o->num_attention_heads * o->head_dim) % o->o_groups != 0)
    return st_fail(ST_EUNSUPPORTED, "%s: field \"o_groups\" = %d does not divide "
                   "num_attention_heads*head_dim = %lld", c->origin, o->o_groups,
                   (long long)o->num_attention_heads * o->head_dim);
  if (o->num_experts_per_tok > o->n_routed_experts)
    return st_fail(ST_EFORMAT, "%s: field \"num_experts_per_tok\" = %d exceeds n_routed_experts %d",
                   c->origin, o->num_experts_per_tok, o->n_routed_experts);
  if ((rc = check_products(c, o)) != ST_OK) return rc;

  if ((rc = parse_compress_rates(c, o)) != ST_OK || (rc = parse_layer_types(c, o)) != ST_OK ||
      (rc = parse_mlp_types(c, o)) != ST_OK || (rc = parse_rope(c, o)) != ST_OK ||
      (rc = parse_quantization(c, o)) != ST_OK)
    return rc;
  return ST_OK;
}

st_status st_config_parse(const char *json_text, const char *origin, st_config *out) {
  json_error_t jerr;
  memset(out, 0, sizeof *out);
  errno = 0;
  json_t *root = json_loads(json_text, JSON_REJECT_DUPLICATES, &jerr);
  if (!root && st_json_out_of_memory(&jerr)) return st_fail(ST_ENOMEM, "parsing %s", origin);
  if (!root)
    return st_fail(ST_EFORMAT, "%s: line %d column %d: %s", origin, jerr.line, jerr.column,
                   jerr.text);
  st_status rc;
  if (!json_is_object(root)) {
    rc = st_fail(ST_EFORMAT, "%s: top level is %s, not an object", origin, json_kind(root));
  } else {
    cfg c = {root, origin};
    rc = parse_root(&c, out);
  }
  json_decref(root);
  if (rc != ST_OK) memset(out, 0, sizeof *out);
  return rc;
}

st_status st_config_load(const char *path, st_config *out) {
  memset(out, 0, sizeof *out);
  FILE *f = fopen(path, "rb");
  if (!f) return st_fail(ST_EIO, "%s: cannot open: %s", path, strerror(errno));
  st_status rc = ST_OK;
  char *text = NULL;
  if (fseek(f, 0, SEEK_END) != 0) {
    rc = st_fail(ST_EIO, "%s: cannot seek: %s", path, strerror(errno));
    goto out;
  }
  long size = ftell(f);
  if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
    rc = st_fail(ST_EIO, "%s: cannot size: %s", path, strerror(errno));
    goto out;
  }
  if (size > 64L * 1024 * 1024) {
    rc = st_fail(ST_EFORMAT, "%s: %ld bytes is too large for a config", path, size);
    goto out;
  }
  text = malloc((size_t)size + 1);
  if (!text) {
    rc = st_fail(ST_ENOMEM, "%s: out of memory", path);
    goto out;
  }
  if (fread(text, 1, (size_t)size, f) != (size_t)size) {
    rc = st_fail(ST_EIO, "%s: short read", path);
    goto out;
  }
  text[size] = 0;
  if (strlen(text) != (size_t)size) {
    rc = st_fail(ST_EFORMAT, "%s: contains a NUL byte", path);
    goto out;
  }
  rc = st_config_parse(text, path, out);
out:
  free(text);
  fclose(f);
  return rc;
}
