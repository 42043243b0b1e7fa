/* settings.c — parsing, resolving and printing engine settings (schemas/settings.def). */
#include "settings.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schemas/catalogue.h"

static const char *const format_names[] = {
  [ST_FORMAT_AUTO] = "auto", [ST_FORMAT_FP32] = "fp32", [ST_FORMAT_BF16] = "bf16",
  [ST_FORMAT_FP8_E4M3FN] = "fp8_e4m3fn", [ST_FORMAT_FP8_E4M3FNUZ] = "fp8_e4m3fnuz",
  [ST_FORMAT_FP4_E2M1] = "fp4_e2m1", [ST_FORMAT_FP8_E4M3FN_AS_FNUZ] = "fp8_e4m3fn_as_fnuz",
};

const char *st_number_format_name(st_number_format f) {
  return (unsigned)f <= ST_FORMAT_FP8_E4M3FN_AS_FNUZ ? format_names[f] : "?";
}

void st_settings_default(st_settings *s) {
  memset(s, 0, sizeof *s);
  s->precision = ST_PRECISION_EXACT;
  s->index_k = s->index_q = ST_FORMAT_AUTO;
  s->rotate = -1;
  s->topk = 0;
  s->index_rope_neox = 0;
  s->compress_rope_theta = 0;
  s->yarn = 1;
  s->index_topk_reuse = 1;
}

static st_status bad_value(const char *key, const char *value) {
  int id = st_setting_find(key);
  return st_fail(ST_EINVAL, "--set %s=%s: allowed values are %s%s", key, value,
                 st_setting_catalogue[id].values,
                 strcmp(st_setting_catalogue[id].default_value, "auto") ? "" : "|auto (the default)");
}

st_status st_settings_set(st_settings *s, const char *key_value) {
  const char *eq = strchr(key_value, '=');
  if (!eq || eq == key_value)
    return st_fail(ST_EINVAL, "--set '%s': expected key=value (see 'sparsetrace settings')",
                   key_value);
  char key[64];
  size_t klen = (size_t)(eq - key_value);
  if (klen >= sizeof key) return st_fail(ST_EINVAL, "--set '%s': key too long", key_value);
  memcpy(key, key_value, klen);
  key[klen] = 0;
  const char *v = eq + 1;
  int id = st_setting_find(key);
  if (id < 0)
    return st_fail(ST_EINVAL, "--set %s: unknown setting (see 'sparsetrace settings')", key);
  switch ((st_setting_id)id) {
  case ST_SET_PRECISION:
    if (!strcmp(v, "exact")) s->precision = ST_PRECISION_EXACT;
    else if (!strcmp(v, "reference")) s->precision = ST_PRECISION_REFERENCE;
    else return bad_value(key, v);
    return ST_OK;
  case ST_SET_INDEX_K:
  case ST_SET_INDEX_Q: {
    st_number_format f = ST_FORMAT_AUTO;
    if (!strcmp(v, "auto")) { /* the default (settings.def): resolved from precision */
      if (id == ST_SET_INDEX_K) s->index_k = f;
      else s->index_q = f;
      return ST_OK;
    }
    for (int i = ST_FORMAT_FP32; i <= ST_FORMAT_FP8_E4M3FN_AS_FNUZ; i++)
      if (!strcmp(v, format_names[i])) f = (st_number_format)i;
    if (f == ST_FORMAT_AUTO) return bad_value(key, v);
    if (id == ST_SET_INDEX_K) s->index_k = f;
    else s->index_q = f;
    return ST_OK;
  }
  case ST_SET_ROTATE:
    if (!strcmp(v, "auto")) s->rotate = -1; /* the default: resolved from precision */
    else if (!strcmp(v, "none")) s->rotate = 0;
    else if (!strcmp(v, "q")) s->rotate = ST_ROTATE_Q;
    else if (!strcmp(v, "k")) s->rotate = ST_ROTATE_K;
    else if (!strcmp(v, "both")) s->rotate = ST_ROTATE_Q | ST_ROTATE_K;
    else return bad_value(key, v);
    return ST_OK;
  case ST_SET_TOPK: {
    if (!strcmp(v, "all")) { s->topk = -1; return ST_OK; }
    if (!strcmp(v, "config")) { s->topk = 0; return ST_OK; }
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    /* digits only: strtol would also skip leading blanks and take a sign */
    if (!isdigit((unsigned char)*v) || *end || errno || n < 1 || n > INT32_MAX - 1) return bad_value(key, v);
    s->topk = (int)n;
    return ST_OK;
  }
  case ST_SET_INDEX_ROPE:
    if (!strcmp(v, "interleaved")) s->index_rope_neox = 0;
    else if (!strcmp(v, "neox")) s->index_rope_neox = 1;
    else return bad_value(key, v);
    return ST_OK;
  case ST_SET_COMPRESS_ROPE_THETA: {
    if (!strcmp(v, "config")) { s->compress_rope_theta = 0; return ST_OK; }
    char *end;
    double t = strtod(v, &end);
    /* a plain number: strtod would also skip leading blanks */
    if (!(isdigit((unsigned char)*v) || *v == '.') || *end || !isfinite(t) || t <= 1.0) return bad_value(key, v);
    s->compress_rope_theta = t;
    return ST_OK;
  }
  case ST_SET_YARN:
    if (!strcmp(v, "on")) s->yarn = 1;
    else if (!strcmp(v, "off")) s->yarn = 0;
    else return bad_value(key, v);
    return ST_OK;
  case ST_SET_INDEX_TOPK_REUSE: {
    if (*v >= '0' && *v <= '9') {
      char *end;
      errno = 0;
      long n = strtol(v, &end, 10);
      if (*end || errno || n < 1 || n > ST_MAX_LAYERS) return bad_value(key, v);
      s->index_topk_reuse = (int)n;
      s->index_topk_pattern[0] = 0;
      return ST_OK;
    }
    size_t len = strlen(v);
    if (len == 0 || len > ST_MAX_LAYERS || strspn(v, "FS") != len)
      return st_fail(ST_EINVAL, "--set %s=%s: allowed values are a number 1..%d or a pattern of F "
                     "(computes its top-k) and S (reuses the last one), one per model layer", key, v,
                     ST_MAX_LAYERS);
    memcpy(s->index_topk_pattern, v, len + 1);
    s->index_topk_reuse = 1;
    return ST_OK;
  }
  case ST_SETTING_COUNT: break;
  }
  return bad_value(key, v);
}

void st_settings_resolve(st_settings *s, const st_config *cfg) {
  int ref = s->precision == ST_PRECISION_REFERENCE;
  if (s->index_k == ST_FORMAT_AUTO) s->index_k = ref ? ST_FORMAT_FP4_E2M1 : ST_FORMAT_FP32;
  if (s->index_q == ST_FORMAT_AUTO) s->index_q = ref ? ST_FORMAT_FP4_E2M1 : ST_FORMAT_FP32;
  if (s->rotate < 0) s->rotate = ref ? (ST_ROTATE_Q | ST_ROTATE_K) : 0;
  if (s->compress_rope_theta == 0) s->compress_rope_theta = cfg->compress_rope_theta;
  if (s->topk == 0) s->topk = cfg->index_topk;
}

int st_settings_topk(const st_settings *s, const st_config *cfg) {
  if (s->topk < 0) return INT32_MAX;
  return s->topk == 0 ? cfg->index_topk : s->topk;
}

int st_settings_topk_source(const st_settings *s, const st_config *cfg, int layer) {
  if (layer < 0 || layer >= cfg->num_hidden_layers || cfg->layer_kind[layer] != ST_LAYER_CSA) return -1;
  int source = -1, ordinal = 0, reuse = s->index_topk_reuse > 0 ? s->index_topk_reuse : 1;
  size_t plen = strlen(s->index_topk_pattern);
  for (int l = 0; l <= layer; l++) {
    if (cfg->layer_kind[l] != ST_LAYER_CSA) continue;
    int computes = plen ? ((size_t)l >= plen || s->index_topk_pattern[l] != 'S') : ordinal % reuse == 0;
    if (computes) source = l;
    ordinal++;
  }
  return source;
}

st_status st_settings_check(const st_settings *s, const st_config *cfg) {
  size_t plen = strlen(s->index_topk_pattern);
  if (!plen) return ST_OK;
  if (plen != (size_t)cfg->num_hidden_layers)
    return st_fail(ST_EINVAL, "--set index_topk_reuse=%s: the pattern has %zu letters, the model %d "
                   "layers (one F or S per layer)", s->index_topk_pattern, plen, cfg->num_hidden_layers);
  for (int l = 0; l < cfg->num_hidden_layers; l++)
    if (cfg->layer_kind[l] == ST_LAYER_CSA) {
      if (s->index_topk_pattern[l] == 'S')
        return st_fail(ST_EINVAL, "--set index_topk_reuse=%s: layer %d, the first CSA layer, is S: "
                       "there is no earlier top-k to reuse", s->index_topk_pattern, l);
      break;
    }
  return ST_OK;
}

int st_settings_json(const st_settings *s, char *buf, size_t size) {
  static const char *const rotate_names[] = {"none", "q", "k", "both"};
  char topk[24], theta[32], reuse[ST_MAX_LAYERS + 3];
  if (s->index_topk_pattern[0]) snprintf(reuse, sizeof reuse, "\"%s\"", s->index_topk_pattern);
  else snprintf(reuse, sizeof reuse, "%d", s->index_topk_reuse > 0 ? s->index_topk_reuse : 1);
  if (s->topk < 0) snprintf(topk, sizeof topk, "\"all\"");
  else if (s->topk == 0) snprintf(topk, sizeof topk, "\"config\"");
  else snprintf(topk, sizeof topk, "%d", s->topk);
  if (s->compress_rope_theta == 0) snprintf(theta, sizeof theta, "\"config\"");
  else snprintf(theta, sizeof theta, "%.17g", s->compress_rope_theta);
  return snprintf(buf, size,
                  "{\"precision\":\"%s\",\"index_k\":\"%s\",\"index_q\":\"%s\",\"rotate\":\"%s\","
                  "\"topk\":%s,\"index_rope\":\"%s\",\"compress_rope_theta\":%s,\"yarn\":\"%s\","
                  "\"index_topk_reuse\":%s}",
                  s->precision == ST_PRECISION_EXACT ? "exact" : "reference",
                  st_number_format_name(s->index_k), st_number_format_name(s->index_q),
                  s->rotate < 0 ? "auto" : rotate_names[s->rotate & 3], topk,
                  s->index_rope_neox ? "neox" : "interleaved", theta, s->yarn ? "on" : "off", reuse);
}
