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

#include "common/base.h"
#include "config.h"
#include "kernels/backend.h"

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

/* A 2-D weight [rows, cols] in its stored format, mapped from the checkpoint (nothing is
** converted or copied): F32, BF16, F16, FP8 e4m3 with its block scales, packed FP4 e2m1 with its
** ue8m0 scales. data/scales point into the mapped shard and stay valid until
** st_checkpoint_close. The same checks as st_checkpoint_load_f32; ST_EUNSUPPORTED for a dtype no
** backend reads (the caller may load it as fp32 instead). */
st_status st_checkpoint_view(st_checkpoint *ck, const char *canonical, int64_t rows, int64_t cols,
                             st_weight *out);

/* Loads an integer tensor (I64, I32, I16, I8, U8) as int32, range-checked. */
st_status st_checkpoint_read_i32(st_checkpoint *ck, const char *canonical, int rank,
                                 const int64_t *shape, int32_t *dst);

/* Stored dtype of a tensor (after name mapping), for reports. */
st_status st_checkpoint_dtype(const st_checkpoint *ck, const char *canonical, st_dtype *out);

/* ---- Additions (below the original contract; nothing above changed) ---- */

/* Stored layout of a tensor, for reports and for callers that size buffers from the file.
** Pointers borrow from ck and stay valid until st_checkpoint_close. */
typedef struct st_checkpoint_tensor_info {
  const char *canonical; /* reference-dialect name */
  const char *stored;    /* name as written in the shard */
  const char *file;      /* shard path */
  const char *dtype;     /* on-disk dtype string: "BF16", "F8_E4M3", "I8", ... */
  int rank;
  int64_t shape[8];      /* stored shape (FP4 packed: [out, in/2]) */
  uint64_t n_bytes;
} st_checkpoint_tensor_info;

/* ST_ENOTFOUND (message names the directory and tensor) when absent. */
st_status st_checkpoint_info(const st_checkpoint *ck, const char *canonical,
                             st_checkpoint_tensor_info *out);

/* Canonical names of every tensor, sorted; i < st_checkpoint_count. "mtp.*" tensors are not
** listed (the MTP block is not part of the engine's model). */
size_t st_checkpoint_count(const st_checkpoint *ck);
const char *st_checkpoint_name_at(const st_checkpoint *ck, size_t i);

/* Like st_checkpoint_read_i32, but every value must also lie in [lo, hi] (tid2eid: [0, E-1]);
** the message names the tensor, the flat index and the value. */
st_status st_checkpoint_read_i32_in(st_checkpoint *ck, const char *canonical, int rank,
                                    const int64_t *shape, int64_t lo, int64_t hi, int32_t *dst);

/* Bytes of tensor data (weights and their scales) read so far through this handle; opening
** reads none. Lets tests and `inspect` prove that loading one layer touches only that layer. */
uint64_t st_checkpoint_bytes_read(const st_checkpoint *ck);

/* Maps a stored tensor name of either dialect to its canonical name through the loader's name
** table. Returns 1 and fills buf, 0 when the name is deliberately ignored ("mtp.*"), -1 when buf
** is too small. */
int st_checkpoint_canonical_name(const char *stored, char *buf, size_t size);

#endif
