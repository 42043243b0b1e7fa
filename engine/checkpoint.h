/*
** checkpoint.h — a DeepSeek-V4 checkpoint directory: config.json plus model.safetensors or a
** sharded model.safetensors.index.json, every shard mmap'd and validated against its size.
**
** Tensors are addressed by their canonical name: the reference dialect of SPEC-dsv4 §5
** ("embed.weight", "head.weight", "norm.weight", "hc_head_fn", "layers.3.attn.wq_a.weight",
** "layers.3.attn.kv_norm.weight", "layers.0.ffn.experts.7.w1.weight", ...). The HF-saved
** dialect ("model.embed_tokens.weight", "model.layers.3.attn.norm.weight",
** "model.hc_head.hc_fn", ...) is mapped onto it through one table. Loading converts to fp32:
** bf16, fp16 and fp32 directly; FP8 e4m3 with its "<name minus .weight>.scale" 128x128 block scales
** (ue8m0 or fp32); FP4 e2m1 packed experts (I8 [out, in/2] + ue8m0 [out, in/32]). Only the
** tensors asked for are touched, so one layer can be loaded alone.
*/
#ifndef ST_CHECKPOINT_H
#define ST_CHECKPOINT_H

#include <stdint.h>

#include "base.h"
#include "config.h"

typedef struct st_checkpoint st_checkpoint;

/* Opens DIR. On failure *out is NULL and the message names the file (and tensor). */
st_status st_checkpoint_open(const char *dir, st_checkpoint **out);
void st_checkpoint_close(st_checkpoint *ck); /* accepts NULL */

const st_config *st_checkpoint_config(const st_checkpoint *ck);
const char *st_checkpoint_dir(const st_checkpoint *ck);

/* 1 if a tensor with this canonical name exists in either dialect. */
int st_checkpoint_has(const st_checkpoint *ck, const char *canonical);

/* Loads a tensor as fp32 into a new malloc'd buffer (caller frees), checking that its logical
** shape equals shape[0..rank). Errors (ST_ENOTFOUND, ST_EFORMAT, ST_EUNSUPPORTED) name the file
** and tensor and state the expected and found shape/dtype. */
st_status st_checkpoint_load_f32(st_checkpoint *ck, const char *canonical, int rank,
                                 const int64_t *shape, float **out);

/* Same, into caller memory of shape-product floats. */
st_status st_checkpoint_read_f32(st_checkpoint *ck, const char *canonical, int rank,
                                 const int64_t *shape, float *dst);

/* Loads an integer tensor (I64, I32, I16, I8, U8) as int32, range-checked. */
st_status st_checkpoint_read_i32(st_checkpoint *ck, const char *canonical, int rank,
                                 const int64_t *shape, int32_t *dst);

/* Stored dtype of a tensor (after name mapping), for reports. */
st_status st_checkpoint_dtype(const st_checkpoint *ck, const char *canonical, st_dtype *out);

#endif
