#!/usr/bin/env python3
"""Convert a DeepSeek-V4 checkpoint between the transformers dialect and the release format.

    convert_release.py to-release SRC_DIR DST_DIR [--expert-dtype fp4|fp8] [--max-shard-bytes N]
    convert_release.py to-hf RELEASE_DIR DST_DIR [--dtype auto|float32|bfloat16]

to-release reads what transformers' save_pretrained writes (config.json + model.safetensors, or
shards + model.safetensors.index.json) and writes what DeepSeek releases (SPEC-dsv4 §4, §5):

  names     the reference dialect the engine's loader calls canonical (engine/checkpoint.c,
            name_rules): embed.weight, layers.N.attn.wq_a.weight, layers.N.attn.kv_norm.weight,
            layers.N.ffn.experts.E.w1.weight, hc_head_fn, ... (no "model." prefix). The input
            may also use transformers' module names (self_attn.q_a_proj, mlp.experts.gate_up_proj
            [E, 2I, D], ...), which save_pretrained does not write but a raw state_dict has.
  FP8       the attention linears (wq_a, wq_b, wkv, wo_a, wo_b), the indexer's wq_b and the shared
            expert: F8_E4M3 (OCP e4m3fn) [out, in] + "<base>.scale" F8_E8M0 [ceil(out/128),
            ceil(in/128)], one power-of-two scale per 128 x 128 tile, s = 2^ceil(log2(amax/448))
            with amax = max(|tile|, 1e-4) (SPEC §4.1), q = e4m3(x / s), round to nearest even.
            A partial tile at the right or bottom edge (dims not a multiple of 128) gets its own
            scale from the elements it has; the engine reads that layout (ceil-sized scales).
  FP4       the routed experts (expert_dtype "fp4"): I8 [out, in/2], element 2k in the low nibble,
            + "<base>.scale" F8_E8M0 [out, in/32], s = 2^ceil(log2(amax/6)) with
            amax = max(|block|, 6 * 2^-126) (SPEC §4.2). `in` must be a multiple of 32: other
            shapes are refused, naming the tensor (the format has no partial block). With
            --expert-dtype fp8 the experts are FP8 like the other linears (Flash-Base's layout).
  kept      BF16: embed, head, every RMSNorm weight, compressor and indexer-compressor wkv/wgate,
            indexer weights_proj, gate weight. F32: mHC fn/base/scale, attn_sink, compressor ape,
            gate bias. I64: tid2eid. (SPEC §5.) Where the source is wider (transformers keeps the
            norms in fp32; the oracle fixtures hold bf16 values there) the cast rounds to nearest
            even and the summary reports the error; SPEC wins over transformers'
            _keep_in_fp32_modules, which would keep the norms in fp32 (SPEC §5 says BF16).
  config    config.json with the released field names (SPEC §1.1: compress_ratios with one 0 per
            MTP block, num_hash_layers, qk_rope_head_dim, rope_scaling, expert_dtype,
            quantization_config {fp8, e4m3, ue8m0, dynamic, [128, 128]}, topk_method ...), which
            engine/config.c reads through its legacy-field path.
  sidecars  hf_config.json (the source config.json, verbatim) and hf_dtypes.json (each tensor's
            source dtype by canonical name), so to-hf can give back the source's exact layout.
            tokenizer.json, tokenizer_config.json, generation_config.json ... are copied.

to-hf dequantises a release directory (ours or DeepSeek's) into what save_pretrained writes, so
DeepseekV4ForCausalLM.from_pretrained loads it: the "model."-prefixed names of the committed
fixtures (tests/data/oracle/tiny: model.layers.N.attn.norm.weight for the window-KV norm,
head.weight, per-expert w1/w2/w3), FP8 and FP4 decoded exactly (every code times a power of two
is a bf16 value), no quantization_config. config.json is hf_config.json when the release has one,
else it is rebuilt from the release config (layer_types, mlp_layer_types, rope_parameters
{main, compress}, partial_rotary_factor, compress_rates, transformers' defaults for the rest).
--dtype auto (default) writes each tensor in its recorded source dtype, else in its release dtype
(bf16 for decoded FP8/FP4); bfloat16 writes every tensor whose values bf16 holds exactly in bf16
(the F32 release tensors stay F32: transformers keeps those in fp32 anyway); float32 writes all
floating tensors as F32.

Quantisation is deterministic and exact: everything is computed in float64 on values that
float64 holds exactly, scales are found by comparing mantissas (never a rounded log2), and each
quantised tensor is checked after encoding against an independent decode of its codes (the
error of every element at most half a step of its block's grid). Errors name the file, the
tensor and, for a damaged safetensors file, the byte offset.

Only python3 and numpy (Debian's python3-numpy); no torch, no safetensors package.
"""
import argparse
import json
import os
import re
import shutil
import struct
import sys

import numpy as np

FP8_MAX = 448.0           # e4m3fn
FP4_MAX = 6.0             # e2m1
FP8_AMAX_FLOOR = 1e-4     # act_quant's floor (SPEC §4.1)
FP4_AMAX_FLOOR = 6.0 * 2.0 ** -126  # fp4_quant's floor (SPEC §4.2)
FP8_BLOCK = (128, 128)
FP4_BLOCK = 32
COPIED_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                "generation_config.json", "chat_template.jinja")


class ConvertError(Exception):
    """A problem with the user's input: the message names the file and the tensor or field."""


# ------------------------------------------------------------------------------------------------
# Low-precision formats (SPEC §4). Encoders take float64 arrays; every input value is exact.

def e4m3fn_table():
    """float64 value of each of the 256 e4m3fn codes (bias 7, 3 mantissa bits, 0x7f/0xff NaN)."""
    v = np.empty(256)
    for c in range(256):
        e, m = (c >> 3) & 0xF, c & 7
        if e == 0xF and m == 7:
            mag = np.nan
        elif e == 0:
            mag = m * 2.0 ** -9
        else:
            mag = (1 + m / 8) * 2.0 ** (e - 7)
        v[c] = -mag if c & 0x80 else mag
    return v


def e2m1_table():
    """float64 value of each of the 16 e2m1 codes (bias 1, 1 mantissa bit, no NaN/inf)."""
    v = np.empty(16)
    for c in range(16):
        e, m = (c >> 1) & 3, c & 1
        mag = m * 0.5 if e == 0 else (1 + m / 2) * 2.0 ** (e - 1)
        v[c] = -mag if c & 8 else mag
    return v


E4M3_VALUES = e4m3fn_table()
E2M1_VALUES = e2m1_table()


def _encode_small_float(y, mbits, emin, max_value):
    """Sign-magnitude code of y in a format with `mbits` mantissa bits and smallest normal
    exponent `emin` (subnormals below it), rounded to nearest with ties to even, |y| saturated at
    max_value. With E the binade of |y| (at least emin), the step is 2^(E - mbits) and
    r = rint(|y| / step) (exact division; numpy's rint is round-half-even); the code is then
    2^mbits * (E - emin) + r, whose low bit is r's: ties to even on r are ties to the even code,
    and r = 2^(mbits+1) carries into the next binade by itself. Returns (magnitude code, sign)."""
    a = np.minimum(np.abs(y), max_value)
    _, e = np.frexp(a)
    binade = np.where(a > 0, np.maximum(e - 1, emin), emin)
    r = np.rint(np.ldexp(a, mbits - binade))
    code = (binade - emin) * (1 << mbits) + r.astype(np.int64)
    return code.astype(np.int64), np.signbit(y)


def encode_e4m3fn(y):
    """float64 array -> uint8 e4m3fn codes: round to nearest even, saturate at +-448 (inf too),
    NaN -> 0x7f with the sign bit, -0.0 -> 0x80."""
    y = np.asarray(y, dtype=np.float64)
    nan = np.isnan(y)
    code, _ = _encode_small_float(np.where(nan, 0.0, y), 3, -6, FP8_MAX)
    code = np.where(nan, 0x7F, code)
    return (code | (np.signbit(y).astype(np.int64) << 7)).astype(np.uint8)


def encode_e2m1(y):
    """float64 array -> e2m1 nibbles: round to nearest even, saturate at +-6; the format has no
    NaN (NaN -> 0x7 with the sign, as kernels/lowp.h); -0.0 -> 0x8."""
    y = np.asarray(y, dtype=np.float64)
    nan = np.isnan(y)
    code, _ = _encode_small_float(np.where(nan, FP4_MAX, y), 1, 0, FP4_MAX)
    return (code | (np.signbit(y).astype(np.int64) << 3)).astype(np.uint8)


def ue8m0_exponent(amax, qmax):
    """k = ceil(log2(amax / qmax)) exactly, clamped to the e8m0 range [-127, 127] (amax > 0,
    finite): with amax = ma 2^ea and qmax = mq 2^eq (ma, mq in [1/2, 1)), the quotient is
    2^(ea-eq) times ma/mq, which lies in (1/2, 1] when ma <= mq and in (1, 2) otherwise."""
    ma, ea = np.frexp(np.asarray(amax, dtype=np.float64))
    mq, eq = np.frexp(np.float64(qmax))
    k = ea - eq + (ma > mq)
    return np.clip(k, -127, 127).astype(np.int64)


def f32_to_bf16_bits(x):
    """float32 array -> uint16 bf16 bits, round to nearest even (NaN kept quiet)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    r = np.where(nan, (u >> 16) | 0x40, r)
    return r.astype(np.uint16)


def bf16_bits_to_f32(h):
    return (np.asarray(h, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def quantize_fp8_blocks(x, block=FP8_BLOCK):
    """x [out, in] float64 -> (codes uint8 [out, in], exponents int [ceil(out/bo), ceil(in/bi)]).
    Each tile, including a partial edge tile, gets s = 2^k, k = ceil(log2(max(amax, 1e-4)/448))."""
    bo, bi = block
    out, inn = x.shape
    ro, ci = -(-out // bo), -(-inn // bi)
    padded = np.zeros((ro * bo, ci * bi))
    padded[:out, :inn] = np.abs(x)
    amax = padded.reshape(ro, bo, ci, bi).max(axis=(1, 3))
    k = ue8m0_exponent(np.maximum(amax, FP8_AMAX_FLOOR), FP8_MAX)
    s = np.repeat(np.repeat(np.ldexp(1.0, k), bo, axis=0), bi, axis=1)[:out, :inn]
    y = np.clip(x / s, -FP8_MAX, FP8_MAX)
    return encode_e4m3fn(y), k


def dequantize_fp8_blocks(codes, scales, block=FP8_BLOCK):
    """codes uint8 [out, in] and per-tile scale values [ceil(out/bo), ceil(in/bi)] -> float64."""
    bo, bi = block
    out, inn = codes.shape
    s = np.repeat(np.repeat(np.asarray(scales, dtype=np.float64), bo, axis=0), bi, axis=1)
    return E4M3_VALUES[codes] * s[:out, :inn]


def quantize_fp4_rows(x, block=FP4_BLOCK):
    """x [out, in] float64, in % 32 == 0 -> (packed uint8 [out, in/2], exponents [out, in/32])."""
    out, inn = x.shape
    xb = x.reshape(out, inn // block, block)
    amax = np.abs(xb).max(axis=2)
    k = ue8m0_exponent(np.maximum(amax, FP4_AMAX_FLOOR), FP4_MAX)
    y = np.clip(xb / np.ldexp(1.0, k)[:, :, None], -FP4_MAX, FP4_MAX)
    nib = encode_e2m1(y).reshape(out, inn // 2, 2)
    return (nib[:, :, 0] | (nib[:, :, 1] << 4)).astype(np.uint8), k


def dequantize_fp4_rows(packed, scales, block=FP4_BLOCK):
    """packed uint8 [out, in/2] (element 2k = low nibble) and scale values [out, in/32]."""
    out, half = packed.shape
    nib = np.stack([packed & 0xF, packed >> 4], axis=2).reshape(out, 2 * half)
    s = np.repeat(np.asarray(scales, dtype=np.float64), block, axis=1)
    return E2M1_VALUES[nib] * s


def grid_half_step(y, mbits, emin):
    """Half the spacing of the grid around each |y| (y already divided by its scale): the largest
    error round-to-nearest may make there."""
    a = np.abs(y)
    _, e = np.frexp(a)
    binade = np.where(a > 0, np.maximum(e - 1, emin), emin)
    return np.ldexp(1.0, binade - mbits - 1)


# ------------------------------------------------------------------------------------------------
# safetensors: u64 LE header length N, N bytes of JSON {name: {dtype, shape, data_offsets}} plus an
# optional "__metadata__" of strings, then the data; offsets count from the start of the data.

DTYPES = {  # name -> (bytes per element, numpy dtype of the stored bits)
    "F64": (8, "<f8"), "F32": (4, "<f4"), "F16": (2, "<f2"), "BF16": (2, "<u2"),
    "F8_E4M3": (1, "u1"), "F8_E5M2": (1, "u1"), "F8_E8M0": (1, "u1"),
    "I64": (8, "<i8"), "I32": (4, "<i4"), "I16": (2, "<i2"), "I8": (1, "i1"), "U8": (1, "u1"),
    "BOOL": (1, "u1"),
}
MAX_HEADER = 100 * 1024 * 1024


class Tensor:
    """One entry of a safetensors header; `offset` counts from the start of the file."""

    def __init__(self, file, name, dtype, shape, offset, nbytes):
        self.file, self.name, self.dtype, self.shape = file, name, dtype, tuple(shape)
        self.offset, self.nbytes = offset, nbytes

    def raw(self):
        """The stored elements as a read-only numpy view of the mapped file (stored bits)."""
        count = int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1
        a = np.frombuffer(self.file.data, dtype=DTYPES[self.dtype][1], count=count,
                          offset=self.offset)
        return a.reshape(self.shape)

    def values(self, index=None):
        """Floating tensors (or raw()[index] of them) as exact float64; F8 types are refused
        (they need their scale)."""
        a = self.raw() if index is None else self.raw()[index]
        if self.dtype == "BF16":
            return bf16_bits_to_f32(a).astype(np.float64)
        if self.dtype in ("F32", "F16", "F64"):
            return a.astype(np.float64)
        raise ConvertError(f"{self.file.path}: tensor '{self.name}': dtype {self.dtype} is not a "
                           f"plain floating type")


class SafetensorsFile:
    """A validated, memory-mapped safetensors file (read-only), checked as the engine's reader
    checks it: header length and JSON, each entry, byte counts, and that the tensors tile the
    data with no gap or overlap."""

    def __init__(self, path):
        self.path = path
        try:
            size = os.path.getsize(path)
        except OSError as e:
            raise ConvertError(f"{path}: cannot open: {e.strerror}") from None
        if size < 8:
            raise ConvertError(f"{path}: not a safetensors file ({size} bytes, shorter than the "
                               f"8-byte header length at offset 0)")
        self.data = np.memmap(path, dtype=np.uint8, mode="r") if size else b""
        (n,) = struct.unpack("<Q", bytes(self.data[:8]))
        if n == 0 or n > MAX_HEADER:
            raise ConvertError(f"{path}: not a safetensors file (header length {n} at offset 0 is "
                               f"implausible)")
        if n > size - 8:
            raise ConvertError(f"{path}: header of {n} bytes at offset 8 runs past the end of the "
                               f"{size}-byte file (truncated?)")
        try:
            header = json.loads(bytes(self.data[8:8 + n]).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            where = f"line {e.lineno} column {e.colno}: {e.msg}" if isinstance(
                e, json.JSONDecodeError) else str(e)
            raise ConvertError(f"{path}: header JSON (bytes 8..{8 + n}): {where}") from None
        if not isinstance(header, dict):
            raise ConvertError(f"{path}: header (offset 8) is not a JSON object")
        self.metadata = header.pop("__metadata__", None)
        if self.metadata is not None and not isinstance(self.metadata, dict):
            raise ConvertError(f"{path}: \"__metadata__\" is not an object")
        start, data_size = 8 + n, size - 8 - n
        self.tensors = {}
        for name, entry in header.items():
            self.tensors[name] = self._entry(name, entry, start, data_size)
        expect = start
        for t in sorted(self.tensors.values(), key=lambda t: (t.offset, t.nbytes)):
            if t.offset != expect:
                what = "overlapping the tensor before it" if t.offset < expect else \
                    f"leaving a gap after file offset {expect}"
                raise ConvertError(f"{path}: tensor '{t.name}': data begins at file offset "
                                   f"{t.offset}, {what}")
            expect = t.offset + t.nbytes
        if expect != size:
            raise ConvertError(f"{path}: the tensors end at file offset {expect} but the file has "
                               f"{size} bytes")

    def _entry(self, name, entry, start, data_size):
        path = self.path
        if not isinstance(entry, dict):
            raise ConvertError(f"{path}: tensor '{name}': header entry is not an object")
        dtype, shape, offs = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in DTYPES:
            raise ConvertError(f"{path}: tensor '{name}': unknown dtype {dtype!r} (expected one of "
                               f"{' '.join(DTYPES)})")
        if not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise ConvertError(f"{path}: tensor '{name}': \"shape\" must be a list of "
                               f"non-negative integers")
        if not (isinstance(offs, list) and len(offs) == 2 and all(
                isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offs)):
            raise ConvertError(f"{path}: tensor '{name}': \"data_offsets\" must be [begin, end] "
                               f"non-negative integers")
        begin, end = offs
        if end < begin:
            raise ConvertError(f"{path}: tensor '{name}': data_offsets [{begin}, {end}] end "
                               f"before they begin")
        if end > data_size:
            raise ConvertError(f"{path}: tensor '{name}': data_offsets [{begin}, {end}] end at file "
                               f"offset {start + end}, beyond the end of the file at offset "
                               f"{start + data_size} (truncated?)")
        need = int(np.prod(shape, dtype=object)) * DTYPES[dtype][0]
        if need != end - begin:
            raise ConvertError(f"{path}: tensor '{name}': {dtype} {shape} needs {need} bytes but "
                               f"data_offsets [{begin}, {end}] give {end - begin}")
        return Tensor(self, name, dtype, shape, start + begin, end - begin)


def write_safetensors(path, entries, metadata=None):
    """entries: list of (name, dtype, shape, producer) where producer() returns the bytes; tensors
    are written in list order, one at a time. The header is padded with spaces to 8 bytes."""
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, _ in entries:
        n = int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype][0]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, dtype, shape, producer in entries:
            data = producer()
            n = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            assert len(data) == n, (name, len(data), n)
            f.write(data)
    os.replace(tmp, path)
    return 8 + len(text) + offset


def open_checkpoint(directory):
    """The tensors of a checkpoint directory: model.safetensors.index.json's shards, else
    model.safetensors. Returns {stored name: Tensor}."""
    index = os.path.join(directory, "model.safetensors.index.json")
    single = os.path.join(directory, "model.safetensors")
    if os.path.exists(index):
        doc = load_json(index)
        wmap = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(wmap, dict) or not wmap:
            raise ConvertError(f"{index}: field \"weight_map\" is missing, empty or not an object")
        files = {}
        for name, shard in wmap.items():
            if not isinstance(shard, str) or shard.startswith("/") or ".." in shard.split("/"):
                raise ConvertError(f"{index}: tensor '{name}': weight_map value must be a file "
                                   f"name inside the checkpoint directory")
            if shard not in files:
                files[shard] = SafetensorsFile(os.path.join(directory, shard))
            if name not in files[shard].tensors:
                raise ConvertError(f"{index}: tensor '{name}' is mapped to shard '{shard}', which "
                                   f"does not hold it")
        tensors = {}
        for f in files.values():
            for name, t in f.tensors.items():
                if name in tensors:
                    raise ConvertError(f"{directory}: tensor '{name}' is stored in both "
                                       f"{tensors[name].file.path} and {f.path}")
                tensors[name] = t
        return tensors
    if not os.path.exists(single):
        raise ConvertError(f"{directory}: neither model.safetensors nor "
                           f"model.safetensors.index.json is there")
    return dict(SafetensorsFile(single).tensors)


def load_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise ConvertError(f"{path}: cannot open: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ConvertError(f"{path}: line {e.lineno} column {e.colno}: {e.msg}") from None


def write_json(path, doc):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, sort_keys=False)
        f.write("\n")


# ------------------------------------------------------------------------------------------------
# Names. ENGINE_NAME_RULES mirrors engine/checkpoint.c name_rules row for row (same kinds, same
# order; tests/release_convert_check.py compares the two tables): it turns any name the engine
# accepts into the canonical reference name. TRANSFORMERS_MODULE_TAILS maps the module names of
# transformers' DeepseekV4 classes (what a raw state_dict holds) onto the reference tails;
# save_pretrained itself already writes the reference tails with a "model." prefix.

ENGINE_NAME_RULES = [
    ("exact", "model.embed_tokens.weight", "embed.weight"),
    ("exact", "model.norm.weight", "norm.weight"),
    ("exact", "model.hc_head.hc_fn", "hc_head_fn"),
    ("exact", "model.hc_head.hc_base", "hc_head_base"),
    ("exact", "model.hc_head.hc_scale", "hc_head_scale"),
    ("exact", "lm_head.weight", "head.weight"),
    ("ignore_prefix", "mtp.", None),
    ("ignore_prefix", "model.mtp.", None),
    ("prefix", "model.layers.", "layers."),
    ("segment", "self_attn", "attn"),
    ("segment", "mlp", "ffn"),
    ("suffix", ".weight_scale_inv", ".scale"),
    ("layer_tail", "attn.norm.weight", "attn.kv_norm.weight"),
    ("layer_tail", "ffn.gate.e_score_correction_bias", "ffn.gate.bias"),
]

TRANSFORMERS_MODULE_TAILS = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "attn_hc.fn": "hc_attn_fn", "attn_hc.base": "hc_attn_base", "attn_hc.scale": "hc_attn_scale",
    "ffn_hc.fn": "hc_ffn_fn", "ffn_hc.base": "hc_ffn_base", "ffn_hc.scale": "hc_ffn_scale",
    "self_attn.q_a_proj.weight": "attn.wq_a.weight",
    "self_attn.q_a_norm.weight": "attn.q_norm.weight",
    "self_attn.q_b_proj.weight": "attn.wq_b.weight",
    "self_attn.kv_proj.weight": "attn.wkv.weight",
    "self_attn.kv_norm.weight": "attn.kv_norm.weight",
    "self_attn.o_a_proj.weight": "attn.wo_a.weight",
    "self_attn.o_b_proj.weight": "attn.wo_b.weight",
    "self_attn.sinks": "attn.attn_sink",
    "self_attn.compressor.kv_proj.weight": "attn.compressor.wkv.weight",
    "self_attn.compressor.gate_proj.weight": "attn.compressor.wgate.weight",
    "self_attn.compressor.position_bias": "attn.compressor.ape",
    "self_attn.compressor.kv_norm.weight": "attn.compressor.norm.weight",
    "self_attn.compressor.indexer.kv_proj.weight": "attn.indexer.compressor.wkv.weight",
    "self_attn.compressor.indexer.gate_proj.weight": "attn.indexer.compressor.wgate.weight",
    "self_attn.compressor.indexer.position_bias": "attn.indexer.compressor.ape",
    "self_attn.compressor.indexer.kv_norm.weight": "attn.indexer.compressor.norm.weight",
    "self_attn.compressor.indexer.q_b_proj.weight": "attn.indexer.wq_b.weight",
    "self_attn.compressor.indexer.scorer.weights_proj.weight": "attn.indexer.weights_proj.weight",
    "mlp.gate.weight": "ffn.gate.weight",
    "mlp.gate.e_score_correction_bias": "ffn.gate.bias",
    "mlp.gate.tid2eid": "ffn.gate.tid2eid",
    "mlp.shared_experts.gate_proj.weight": "ffn.shared_experts.w1.weight",
    "mlp.shared_experts.up_proj.weight": "ffn.shared_experts.w3.weight",
    "mlp.shared_experts.down_proj.weight": "ffn.shared_experts.w2.weight",
}
STACKED_EXPERTS = {"mlp.experts.gate_up_proj": ("w1", "w3"), "mlp.experts.down_proj": ("w2",)}

LAYER_RE = re.compile(r"^(model\.)?layers\.(\d+)\.(.*)$")


def layer_prefix_len(s):
    m = re.match(r"^layers\.\d+\.", s)
    return m.end() if m else 0


def engine_canonical_name(stored):
    """What engine/checkpoint.c's st_checkpoint_canonical_name gives: the canonical name, or None
    for a name the engine ignores (MTP)."""
    cur = stored
    for kind, src, dst in ENGINE_NAME_RULES:
        if kind == "exact":
            if cur == src:
                cur = dst
        elif kind == "ignore_prefix":
            if cur.startswith(src):
                return None
        elif kind == "prefix":
            if cur.startswith(src):
                cur = dst + cur[len(src):]
        elif kind == "segment":
            cur = ".".join(dst if seg == src else seg for seg in cur.split("."))
        elif kind == "suffix":
            if cur.endswith(src):
                cur = cur[:-len(src)] + dst
        elif kind == "layer_tail":
            p = layer_prefix_len(cur)
            if p and cur[p:] == src:
                cur = cur[:p] + dst
    return cur


def source_entries(tensors):
    """Maps stored names to canonical ones. Returns ({canonical: (Tensor, index or None)}, dropped
    names); index (expert, row slice) picks one expert out of a stacked transformers tensor."""
    out, dropped = {}, []

    def add(canonical, tensor, pick=None):
        if canonical in out:
            other = out[canonical][0]
            raise ConvertError(f"tensor '{canonical}' is stored twice: as '{other.name}' in "
                               f"{other.file.path} and as '{tensor.name}' in {tensor.file.path}")
        out[canonical] = (tensor, pick)

    for name, t in tensors.items():
        m = LAYER_RE.match(name)
        tail = m.group(3) if m else None
        if m and tail in TRANSFORMERS_MODULE_TAILS:
            add(f"layers.{m.group(2)}.{TRANSFORMERS_MODULE_TAILS[tail]}", t)
            continue
        if m and tail in STACKED_EXPERTS:
            if len(t.shape) != 3:
                raise ConvertError(f"{t.file.path}: tensor '{name}': stacked experts must be 3-D "
                                   f"[E, out, in], found {list(t.shape)}")
            parts = STACKED_EXPERTS[tail]
            rows = t.shape[1] // len(parts)
            if rows * len(parts) != t.shape[1]:
                raise ConvertError(f"{t.file.path}: tensor '{name}': {t.shape[1]} rows do not "
                                   f"split into gate and up halves")
            for e in range(t.shape[0]):
                for i, w in enumerate(parts):
                    add(f"layers.{m.group(2)}.ffn.experts.{e}.{w}.weight", t,
                        (e, slice(i * rows, (i + 1) * rows)))
            continue
        canonical = engine_canonical_name(name)
        if canonical is None:
            dropped.append(name)
            continue
        add(canonical, t)
    return out, dropped


def read_source(tensor, pick):
    if pick is None:
        return tensor.values()
    e, rows = pick
    return tensor.values((e, rows, slice(None)))


def source_shape(tensor, pick):
    return tensor.shape if pick is None else (pick[1].stop - pick[1].start, tensor.shape[2])


def hf_stored_name(canonical):
    """The name save_pretrained (transformers 5.17) writes for a canonical tensor, as in the
    committed fixtures: "model." before layers / embed / norm / hc_head, attn.norm for the
    window-KV norm, head.weight as it is."""
    fixed = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "hc_head_fn": "model.hc_head.hc_fn", "hc_head_base": "model.hc_head.hc_base",
             "hc_head_scale": "model.hc_head.hc_scale", "head.weight": "head.weight"}
    if canonical in fixed:
        return fixed[canonical]
    p = layer_prefix_len(canonical)
    if not p:
        raise ConvertError(f"tensor '{canonical}': no transformers name is known for it")
    tail = canonical[p:]
    if tail == "attn.kv_norm.weight":
        tail = "attn.norm.weight"
    return "model." + canonical[:p] + tail


# ------------------------------------------------------------------------------------------------
# What the release stores for each canonical tensor (SPEC §5).

L = r"layers\.\d+\."
TENSOR_CLASSES = [  # (regex on the canonical name, storage)
    (r"embed\.weight|head\.weight|norm\.weight", "bf16"),
    (r"hc_head_(fn|base|scale)", "f32"),
    (L + r"(attn_norm|ffn_norm)\.weight", "bf16"),
    (L + r"hc_(attn|ffn)_(fn|base|scale)", "f32"),
    (L + r"attn\.(wq_a|wq_b|wkv|wo_a|wo_b)\.weight", "fp8"),
    (L + r"attn\.(q_norm|kv_norm)\.weight", "bf16"),
    (L + r"attn\.attn_sink", "f32"),
    (L + r"attn\.(indexer\.)?compressor\.(wkv|wgate)\.weight", "bf16"),
    (L + r"attn\.(indexer\.)?compressor\.ape", "f32"),
    (L + r"attn\.(indexer\.)?compressor\.norm\.weight", "bf16"),
    (L + r"attn\.indexer\.wq_b\.weight", "fp8"),
    (L + r"attn\.indexer\.weights_proj\.weight", "bf16"),
    (L + r"ffn\.gate\.weight", "bf16"),
    (L + r"ffn\.gate\.bias", "f32"),
    (L + r"ffn\.gate\.tid2eid", "i64"),
    (L + r"ffn\.experts\.\d+\.w[123]\.weight", "expert"),
    (L + r"ffn\.shared_experts\.w[123]\.weight", "fp8"),
]
TENSOR_CLASSES = [(re.compile("^(" + p + ")$"), c) for p, c in TENSOR_CLASSES]


def storage_class(canonical):
    for rx, c in TENSOR_CLASSES:
        if rx.match(canonical):
            return c
    return None


def natural_key(name):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


# ------------------------------------------------------------------------------------------------
# Configs.

HF_DEFAULTS = {  # what DeepseekV4Config / save_pretrained write for fields the release lacks
    "attention_bias": False, "attention_dropout": 0.0, "hidden_act": "silu",
    "initializer_range": 0.02, "mlp_bias": False, "output_router_logits": False,
    "pad_token_id": None, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0,
    "use_cache": True,
}
# Fields copied unchanged between the two configs (SPEC §1.1, left column).
SHARED_FIELDS = [
    "vocab_size", "hidden_size", "num_hidden_layers", "num_nextn_predict_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "q_lora_rank", "o_lora_rank",
    "o_groups", "sliding_window", "compress_rope_theta", "rope_theta", "max_position_embeddings",
    "index_n_heads", "index_head_dim", "index_topk", "n_routed_experts", "num_experts_per_tok",
    "n_shared_experts", "moe_intermediate_size", "scoring_func", "norm_topk_prob",
    "routed_scaling_factor", "swiglu_limit", "hc_mult", "hc_sinkhorn_iters", "hc_eps",
    "rms_norm_eps", "tie_word_embeddings", "bos_token_id", "eos_token_id",
]
# Fields that may be absent, with DeepseekV4Config's defaults (engine/config.c has the same).
OPTIONAL_FIELDS = {
    "num_nextn_predict_layers": 1, "scoring_func": "sqrtsoftplus", "norm_topk_prob": True,
    "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1, "hc_eps": 1e-6,
    "rms_norm_eps": 1e-6, "swiglu_limit": 10.0, "hc_sinkhorn_iters": 20,
}
RATIO_OF_TYPE = {"sliding_attention": 0, "compressed_sparse_attention": 4,
                 "heavily_compressed_attention": 128}
TYPE_OF_RATIO = {v: k for k, v in RATIO_OF_TYPE.items()}
ROPE_FIELDS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow")


def release_config(hf, origin, expert_dtype):
    """The release config.json for a transformers config (SPEC §1.1 field names)."""
    def need(field):
        if field not in hf or hf[field] is None:
            raise ConvertError(f"{origin}: field \"{field}\" is missing")
        return hf[field]

    if hf.get("model_type") != "deepseek_v4":
        raise ConvertError(f"{origin}: field \"model_type\" = {hf.get('model_type')!r} is not "
                           f"\"deepseek_v4\"")
    n = need("num_hidden_layers")
    n_mtp = hf.get("num_nextn_predict_layers", 1) or 0
    rates = dict(hf.get("compress_rates") or {})
    for legacy, kind in (("compress_rate_csa", "compressed_sparse_attention"),
                         ("compress_rate_hca", "heavily_compressed_attention")):
        if hf.get(legacy) is not None:
            rates[kind] = hf[legacy]
    for kind, rate in rates.items():
        if RATIO_OF_TYPE.get(kind, rate) != rate:
            raise ConvertError(
                f"{origin}: field \"compress_rates.{kind}\" = {rate}: the release config can only "
                f"say 4 (CSA) or 128 (HCA) in compress_ratios, and transformers and the engine "
                f"read those literal values as layer types")
    if hf.get("layer_types") is not None:
        types = hf["layer_types"]
        if len(types) < n or any(t not in RATIO_OF_TYPE for t in types[:n]):
            raise ConvertError(f"{origin}: field \"layer_types\" must list {n} of "
                               f"{', '.join(RATIO_OF_TYPE)}")
        ratios = [RATIO_OF_TYPE[t] for t in types[:n]]
    elif hf.get("compress_ratios") is not None:
        ratios = list(hf["compress_ratios"][:n])
    else:
        raise ConvertError(f"{origin}: neither \"layer_types\" nor \"compress_ratios\" is there")
    if any(r not in TYPE_OF_RATIO for r in ratios):
        raise ConvertError(f"{origin}: compress ratios {ratios} must be 0, 4 or 128")
    if hf.get("mlp_layer_types") is not None:
        mlp = hf["mlp_layer_types"][:n]
        n_hash = sum(1 for t in mlp if t == "hash_moe")
        if mlp != ["hash_moe"] * n_hash + ["moe"] * (n - n_hash):
            raise ConvertError(f"{origin}: field \"mlp_layer_types\" = {mlp}: the release config "
                               f"(num_hash_layers) can only say \"the first k layers are hash_moe\"")
    else:
        n_hash = need("num_hash_layers")
    head_dim = need("head_dim")
    if hf.get("partial_rotary_factor") is not None:
        rope_dims = int(head_dim * hf["partial_rotary_factor"])  # as transformers computes it
    else:
        rope_dims = need("qk_rope_head_dim")
    rope_main, rope_compress = None, None
    rp = hf.get("rope_parameters")
    if isinstance(rp, dict) and isinstance(rp.get("main"), dict):
        rope_main, rope_compress = rp["main"], rp.get("compress")
    elif isinstance(rp, dict):
        rope_compress = rp
    elif isinstance(hf.get("rope_scaling"), dict):
        rope_compress = hf["rope_scaling"]
    if rope_main and rope_main.get("rope_type", rope_main.get("type", "default")) != "default":
        raise ConvertError(f"{origin}: field \"rope_parameters.main.rope_type\" must be default "
                           f"(sliding layers use plain RoPE)")
    theta = (rope_main or {}).get("rope_theta", hf.get("rope_theta", 10000.0))
    ctheta = (rope_compress or {}).get("rope_theta", hf.get("compress_rope_theta", 160000.0))
    rope_scaling = None
    if rope_compress and rope_compress.get("rope_type", rope_compress.get("type")) == "yarn":
        af = rope_compress.get("attention_factor")
        if af is not None and af != 1.0:
            raise ConvertError(f"{origin}: field \"rope_parameters.compress.attention_factor\" = "
                               f"{af}: the release's rope_scaling has no attention factor "
                               f"(DeepSeek-V4 uses 1.0)")
        rope_scaling = {"type": "yarn"}
        for k in ROPE_FIELDS:
            if k in rope_compress:
                rope_scaling[k] = rope_compress[k]
    elif rope_compress and rope_compress.get("rope_type", rope_compress.get("type")) not in (
            None, "default"):
        raise ConvertError(f"{origin}: compressed-layer RoPE type "
                           f"{rope_compress.get('rope_type', rope_compress.get('type'))!r} is "
                           f"not yarn or default")

    doc = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4"}
    for f in SHARED_FIELDS:
        if f in OPTIONAL_FIELDS:
            doc[f] = hf.get(f, OPTIONAL_FIELDS[f])
        elif f not in ("compress_rope_theta", "rope_theta"):
            doc[f] = need(f)
    doc["num_nextn_predict_layers"] = n_mtp
    doc["qk_rope_head_dim"] = rope_dims
    doc["compress_ratios"] = ratios + [0] * n_mtp
    doc["rope_theta"] = theta
    doc["compress_rope_theta"] = ctheta
    if rope_scaling:
        doc["rope_scaling"] = rope_scaling
    doc["num_hash_layers"] = n_hash
    doc["topk_method"] = "noaux_tc"
    doc["expert_dtype"] = expert_dtype
    doc["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                  "activation_scheme": "dynamic",
                                  "weight_block_size": list(FP8_BLOCK)}
    return doc


def hf_config_from_release(rel, origin, dtype_name):
    """A transformers config.json rebuilt from a release config: the modern fields
    (layer_types, mlp_layer_types, rope_parameters, partial_rotary_factor, compress_rates) as
    save_pretrained writes them, transformers' defaults for what the release does not carry."""
    def need(field):
        if field not in rel:
            raise ConvertError(f"{origin}: field \"{field}\" is missing")
        return rel[field]

    n = need("num_hidden_layers")
    ratios = need("compress_ratios")
    if len(ratios) < n or any(r not in TYPE_OF_RATIO for r in ratios[:n]):
        raise ConvertError(f"{origin}: field \"compress_ratios\" must give 0, 4 or 128 for each "
                           f"of the {n} layers")
    n_hash = rel.get("num_hash_layers", 3)
    head_dim = need("head_dim")
    rope_dims = rel.get("qk_rope_head_dim", 64)
    prf = rope_dims / head_dim
    doc = dict(HF_DEFAULTS)
    doc["architectures"] = ["DeepseekV4ForCausalLM"]
    doc["model_type"] = "deepseek_v4"
    for f in SHARED_FIELDS:
        if f in rel:
            doc[f] = rel[f]
    doc["compress_rates"] = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
    doc["layer_types"] = [TYPE_OF_RATIO[r] for r in ratios[:n]]
    doc["mlp_layer_types"] = ["hash_moe" if i < n_hash else "moe" for i in range(n)]
    doc["partial_rotary_factor"] = prf
    doc["qk_rope_head_dim"] = rope_dims
    main = {"partial_rotary_factor": prf, "rope_theta": rel.get("rope_theta", 10000.0),
            "rope_type": "default"}
    compress = {"partial_rotary_factor": prf,
                "rope_theta": rel.get("compress_rope_theta", 160000.0), "rope_type": "default"}
    rs = rel.get("rope_scaling")
    if isinstance(rs, dict) and rs.get("type", rs.get("rope_type")) == "yarn":
        compress.update({k: rs[k] for k in ROPE_FIELDS if k in rs})
        compress.update({"attention_factor": 1.0, "rope_type": "yarn", "type": "yarn"})
    doc["rope_parameters"] = {"compress": dict(sorted(compress.items())), "main": main}
    doc["dtype"] = dtype_name
    return dict(sorted(doc.items()))


# ------------------------------------------------------------------------------------------------
# to-release

class Summary:
    """Counts and errors for the report printed at the end."""

    def __init__(self):
        self.by_dtype = {}     # dtype -> [count, bytes]
        self.errors = {}       # class -> (max relative error, rms relative error, tensor)

    def tensor(self, dtype, nbytes):
        c = self.by_dtype.setdefault(dtype, [0, 0])
        c[0] += 1
        c[1] += nbytes

    def error(self, cls, name, x, y):
        amax = float(np.max(np.abs(x))) if x.size else 0.0
        err = np.abs(np.asarray(y, dtype=np.float64) - x)
        rel = float(err.max()) / amax if amax > 0 else 0.0
        norm = float(np.sqrt(np.sum(x * x)))
        rms = float(np.sqrt(np.sum(err * err))) / norm if norm > 0 else 0.0
        prev = self.errors.get(cls)
        if prev is None or rel > prev[0]:
            self.errors[cls] = (rel, max(rms, prev[1] if prev else 0.0), name)
        else:
            self.errors[cls] = (prev[0], max(rms, prev[1]), prev[2])


def check_finite(x, tensor):
    if not np.all(np.isfinite(x)):
        bad = np.flatnonzero(~np.isfinite(x.reshape(-1)))[0]
        raise ConvertError(f"{tensor.file.path}: tensor '{tensor.name}': element {bad} is "
                           f"{x.reshape(-1)[bad]}; a release cannot quantise non-finite weights")


def checked_fp8(canonical, x, codes, k):
    """Independent decode of the FP8 codes: every element within half a step of its tile's grid
    and no better code available (the error of the chosen code is at most that of its
    neighbours)."""
    s = np.repeat(np.repeat(np.ldexp(1.0, k), FP8_BLOCK[0], axis=0), FP8_BLOCK[1],
                  axis=1)[:x.shape[0], :x.shape[1]]
    y = E4M3_VALUES[codes] * s
    if not np.all(np.abs(y - x) <= grid_half_step(x / s, 3, -6) * s):
        raise AssertionError(f"FP8 encoding of {canonical} is off the nearest grid point")
    return y


def checked_fp4(canonical, x, packed, k):
    y = dequantize_fp4_rows(packed, np.ldexp(1.0, k))
    s = np.repeat(np.ldexp(1.0, k), FP4_BLOCK, axis=1)
    if not np.all(np.abs(y - x) <= grid_half_step(x / s, 1, 0) * s):
        raise AssertionError(f"FP4 encoding of {canonical} is off the nearest grid point")
    return y


def to_release(args):
    src, dst = args.src, args.dst
    cfg_path = os.path.join(src, "config.json")
    hf = load_json(cfg_path)
    if not isinstance(hf, dict):
        raise ConvertError(f"{cfg_path}: top level is not an object")
    rel_cfg = release_config(hf, cfg_path, args.expert_dtype)
    entries, dropped = source_entries(open_checkpoint(src))
    n_experts = rel_cfg["n_routed_experts"]

    plan, hf_dtypes, partial_tiles = [], {}, []
    for canonical in sorted(entries, key=natural_key):
        tensor, pick = entries[canonical]
        cls = storage_class(canonical)
        if cls is None:
            if canonical.endswith(".scale") or tensor.dtype in ("F8_E4M3", "F8_E8M0", "I8"):
                raise ConvertError(f"{tensor.file.path}: tensor '{tensor.name}' ({tensor.dtype}) "
                                   f"is already quantised; convert the directory with to-hf "
                                   f"first")
            raise ConvertError(f"{tensor.file.path}: tensor '{tensor.name}' (canonical "
                               f"'{canonical}') is not a DeepSeek-V4 tensor this converter knows")
        shape = source_shape(tensor, pick)
        if cls == "i64":
            if not tensor.dtype.startswith(("I", "U")):
                raise ConvertError(f"{tensor.file.path}: tensor '{tensor.name}': {tensor.dtype} "
                                   f"is not an integer type")
        elif tensor.dtype not in ("F32", "BF16", "F16", "F64"):
            raise ConvertError(f"{tensor.file.path}: tensor '{tensor.name}': dtype {tensor.dtype} "
                               f"is not a floating type the converter reads (F32, BF16, F16)")
        if cls == "expert":
            cls = "fp4" if args.expert_dtype == "fp4" else "fp8-expert"
        if cls in ("fp8", "fp8-expert", "fp4") and len(shape) != 2:
            raise ConvertError(f"{tensor.file.path}: tensor '{tensor.name}': a quantised linear "
                               f"must be 2-D, found {list(shape)}")
        if cls == "fp4" and shape[1] % FP4_BLOCK:
            raise ConvertError(
                f"{tensor.file.path}: tensor '{tensor.name}' ({canonical}, {list(shape)}): FP4 "
                f"needs the input dimension ({shape[1]}) to be a multiple of {FP4_BLOCK} (one "
                f"ue8m0 scale per {FP4_BLOCK} elements, no partial block); use --expert-dtype fp8")
        if cls in ("fp8", "fp8-expert") and (shape[0] % FP8_BLOCK[0] or shape[1] % FP8_BLOCK[1]):
            partial_tiles.append(f"{canonical} {list(shape)}")
        hf_dtypes[canonical] = tensor.dtype
        plan.append((canonical, cls, tensor, pick, shape))

    summary = Summary()
    out_entries = []
    for canonical, cls, tensor, pick, shape in plan:
        out_entries.extend(release_outputs(canonical, cls, tensor, pick, shape, n_experts,
                                           summary))

    os.makedirs(dst, exist_ok=True)
    total = write_checkpoint(dst, out_entries, args.max_shard_bytes)
    write_json(os.path.join(dst, "config.json"), rel_cfg)
    shutil.copyfile(cfg_path, os.path.join(dst, "hf_config.json"))
    write_json(os.path.join(dst, "hf_dtypes.json"), hf_dtypes)
    copied = copy_side_files(src, dst)

    src_bytes = sum(os.path.getsize(p) for p in {t.file.path for t, _ in entries.values()})
    print(f"to-release: {src} -> {dst}")
    print(f"  {len(plan)} source tensors ({src_bytes} bytes); "
          f"{sum(c for c, _ in summary.by_dtype.values())} release tensors, {total} bytes of "
          f"safetensors ({total / max(src_bytes, 1):.3f} of the source)")
    for dtype, (count, nbytes) in sorted(summary.by_dtype.items()):
        print(f"  {dtype:8s} {count:6d} tensors {nbytes:12d} bytes")
    print("  largest relative error per class (max |deq - x| / max |x| of one tensor; worst rms "
          "|deq - x| / |x| of any tensor):")
    for cls in ("fp8 linear", "fp8 expert", "fp4 expert", "bf16 cast", "kept"):
        if cls in summary.errors:
            rel, rms, name = summary.errors[cls]
            print(f"    {cls:11s} max {rel:.3e}  rms {rms:.3e}  ({name})")
    if partial_tiles:
        print(f"  note: {len(partial_tiles)} FP8 tensors have partial 128x128 edge tiles (the "
              f"engine reads them; block-GEMM kernels want multiples of 128): "
              + ", ".join(partial_tiles[:4]) + (" ..." if len(partial_tiles) > 4 else ""))
    if dropped:
        print(f"  note: dropped {len(dropped)} MTP tensors (engine and transformers ignore them)")
    if copied:
        print(f"  copied {', '.join(copied)}")
    return 0


def release_outputs(canonical, cls, tensor, pick, shape, n_experts, summary):
    """The release tensors (name, dtype, shape, producer) for one source tensor. Producers read
    and convert when the file is written, one tensor at a time."""
    base = canonical[:-len(".weight")] if canonical.endswith(".weight") else canonical
    cache = {}

    def quantised():
        if "q" not in cache:
            x = read_source(tensor, pick)
            check_finite(x, tensor)
            if cls == "fp4":
                packed, k = quantize_fp4_rows(x)
                summary.error("fp4 expert", canonical, x, checked_fp4(canonical, x, packed, k))
                cache["q"] = (packed.view(np.int8).tobytes(), (k + 127).astype(np.uint8).tobytes())
            else:
                codes, k = quantize_fp8_blocks(x)
                summary.error("fp8 expert" if cls == "fp8-expert" else "fp8 linear", canonical, x,
                              checked_fp8(canonical, x, codes, k))
                cache["q"] = (codes.tobytes(), (k + 127).astype(np.uint8).tobytes())
        return cache["q"]

    def scales():  # written right after its weight, so the cached bytes can go
        scale_bytes = quantised()[1]
        cache.clear()
        return scale_bytes

    def plain(to):
        def produce():
            if to == "I64":
                v = tensor.raw().astype(np.int64)
                if v.size and (v.min() < 0 or v.max() >= n_experts):
                    raise ConvertError(f"{tensor.file.path}: tensor '{tensor.name}': expert id "
                                       f"{v.min() if v.min() < 0 else v.max()} is outside "
                                       f"[0, {n_experts})")
                return v.astype("<i8").tobytes()
            x = read_source(tensor, pick)
            if to == "F32":
                y = x.astype(np.float32)
                summary.error("kept" if tensor.dtype in ("F32", "BF16", "F16") else "f32 cast",
                              canonical, x, y)
                return y.astype("<f4").tobytes()
            bits = f32_to_bf16_bits(x.astype(np.float32))
            y = bf16_bits_to_f32(bits).astype(np.float64)
            summary.error("kept" if tensor.dtype == "BF16" else "bf16 cast", canonical, x, y)
            return bits.astype("<u2").tobytes()
        return produce

    def record(dtype, shp, producer):
        n = int(np.prod(shp, dtype=np.int64)) * DTYPES[dtype][0]
        summary.tensor(dtype, n)
        return producer

    if cls in ("fp8", "fp8-expert"):
        sshape = (-(-shape[0] // FP8_BLOCK[0]), -(-shape[1] // FP8_BLOCK[1]))
        return [(canonical, "F8_E4M3", shape, record("F8_E4M3", shape, lambda: quantised()[0])),
                (base + ".scale", "F8_E8M0", sshape,
                 record("F8_E8M0", sshape, lambda: scales()))]
    if cls == "fp4":
        wshape, sshape = (shape[0], shape[1] // 2), (shape[0], shape[1] // FP4_BLOCK)
        return [(canonical, "I8", wshape, record("I8", wshape, lambda: quantised()[0])),
                (base + ".scale", "F8_E8M0", sshape,
                 record("F8_E8M0", sshape, lambda: scales()))]
    dtype = {"bf16": "BF16", "f32": "F32", "i64": "I64"}[cls]
    return [(canonical, dtype, shape, record(dtype, shape, plain(dtype)))]


def write_checkpoint(dst, entries, max_shard_bytes):
    """One model.safetensors, or (max_shard_bytes > 0) shards model-0000i-of-0000n.safetensors
    and model.safetensors.index.json as releases ship. A weight and its scale share a shard.
    Returns the bytes written."""
    for stale in os.listdir(dst):
        if re.match(r"^model(-\d+-of-\d+)?\.safetensors(\.index\.json)?$", stale):
            os.remove(os.path.join(dst, stale))
    meta = {"format": "pt"}
    if not max_shard_bytes:
        return write_safetensors(os.path.join(dst, "model.safetensors"), entries, meta)
    groups, cur, size = [], [], 0
    i = 0
    while i < len(entries):
        group = [entries[i]]
        if i + 1 < len(entries) and entries[i + 1][0].endswith(".scale"):
            group.append(entries[i + 1])
        n = sum(int(np.prod(s, dtype=np.int64)) * DTYPES[d][0] for _, d, s, _ in group)
        if cur and size + n > max_shard_bytes:
            groups.append(cur)
            cur, size = [], 0
        cur.extend(group)
        size += n
        i += len(group)
    if cur:
        groups.append(cur)
    total, wmap = 0, {}
    for gi, group in enumerate(groups):
        fname = f"model-{gi + 1:05d}-of-{len(groups):05d}.safetensors"
        total += write_safetensors(os.path.join(dst, fname), group, meta)
        wmap.update({name: fname for name, _, _, _ in group})
    data = sum(int(np.prod(s, dtype=np.int64)) * DTYPES[d][0] for _, d, s, _ in entries)
    write_json(os.path.join(dst, "model.safetensors.index.json"),
               {"metadata": {"total_size": data}, "weight_map": wmap})
    return total


def copy_side_files(src, dst):
    copied = []
    for f in COPIED_FILES:
        if os.path.isfile(os.path.join(src, f)):
            shutil.copyfile(os.path.join(src, f), os.path.join(dst, f))
            copied.append(f)
    return copied


# ------------------------------------------------------------------------------------------------
# to-hf

def release_kind(tensors, name):
    """(fp8 | fp4 | int | plain, logical shape) of a release tensor, by the engine's rules: F8_E4M3
    with a "<base>.scale" is FP8; I8 [out, in/2] with an F8_E8M0 scale [out, in/32] is FP4."""
    t = tensors[name]
    base = name[:-len(".weight")] if name.endswith(".weight") else None
    scale = tensors.get(base + ".scale") if base else None
    if t.dtype == "F8_E4M3":
        return "fp8", t.shape
    if (t.dtype == "I8" and scale is not None and scale.dtype == "F8_E8M0" and len(t.shape) == 2
            and len(scale.shape) == 2 and scale.shape[0] == t.shape[0]
            and scale.shape[1] * 16 == t.shape[1]):
        return "fp4", (t.shape[0], 2 * t.shape[1])
    if t.dtype.startswith(("I", "U")) or t.dtype == "BOOL":
        return "int", t.shape
    return "plain", t.shape


def release_values(tensors, name, block):
    """The float64 values of a release tensor: FP8 + scale, FP4 packed + scale, or plain.
    Returns (values, how) with how in fp8 / fp4 / plain."""
    t = tensors[name]
    base = name[:-len(".weight")] if name.endswith(".weight") else None
    scale = tensors.get(base + ".scale") if base else None
    where = f"{t.file.path}: tensor '{name}'"
    if t.dtype == "F8_E4M3":
        if scale is None:
            raise ConvertError(f"{where}: FP8 weight without its block scale '{base}.scale'")
        if len(t.shape) != 2:
            raise ConvertError(f"{where}: FP8 is only supported for 2-D weights")
        want = (-(-t.shape[0] // block[0]), -(-t.shape[1] // block[1]))
        if scale.shape != want:
            raise ConvertError(f"{scale.file.path}: tensor '{scale.name}': expected block scales "
                               f"{list(want)} for {list(t.shape)} in {block[0]}x{block[1]} tiles, "
                               f"found {list(scale.shape)}")
        return dequantize_fp8_blocks(t.raw(), scale_values(scale), block), "fp8"
    if release_kind(tensors, name)[0] == "fp4":
        return dequantize_fp4_rows(t.raw().view(np.uint8), scale_values(scale)), "fp4"
    if t.dtype.startswith(("I", "U")) or t.dtype == "BOOL":
        return t.raw(), "int"
    return t.values(), "plain"


def scale_values(t):
    raw = t.raw()
    if t.dtype == "F8_E8M0":
        if np.any(raw == 0xFF):
            raise ConvertError(f"{t.file.path}: tensor '{t.name}': e8m0 scale 0xff is NaN")
        return np.ldexp(1.0, raw.astype(np.int64) - 127)
    if t.dtype in ("F32", "BF16"):
        return t.values()
    raise ConvertError(f"{t.file.path}: tensor '{t.name}': scale dtype {t.dtype} is not "
                       f"F8_E8M0, F32 or BF16")


def to_hf(args):
    rel_dir, dst = args.release, args.dst
    cfg_path = os.path.join(rel_dir, "config.json")
    rel = load_json(cfg_path)
    if not isinstance(rel, dict):
        raise ConvertError(f"{cfg_path}: top level is not an object")
    block = tuple((rel.get("quantization_config") or {}).get("weight_block_size", FP8_BLOCK))
    tensors = {}
    for name, t in open_checkpoint(rel_dir).items():
        canonical = engine_canonical_name(name)
        if canonical is not None:
            tensors[canonical] = t
    dtypes_path = os.path.join(rel_dir, "hf_dtypes.json")
    recorded = load_json(dtypes_path) if os.path.exists(dtypes_path) else {}

    entries, counts = [], {}
    for name in sorted(tensors, key=natural_key):
        t = tensors[name]
        if name.endswith(".scale") and name[:-len(".scale")] + ".weight" in tensors:
            continue
        kind, shape = release_kind(tensors, name)
        release_dtype = "BF16" if kind in ("fp8", "fp4") else t.dtype  # decoded: bf16 values
        if kind == "int":
            out = t.dtype
        elif args.dtype == "float32":
            out = "F32"
        elif args.dtype == "bfloat16":
            out = release_dtype
        else:
            out = recorded.get(name, release_dtype)
        entries.append((hf_stored_name(name), out, shape, hf_producer(tensors, name, out, block)))
        counts[out] = counts.get(out, 0) + 1

    os.makedirs(dst, exist_ok=True)
    total = write_checkpoint(dst, entries, 0)
    hf_cfg_src = os.path.join(rel_dir, "hf_config.json")
    if os.path.exists(hf_cfg_src):
        load_json(hf_cfg_src)
        shutil.copyfile(hf_cfg_src, os.path.join(dst, "config.json"))
        how = "hf_config.json"
    else:
        write_json(os.path.join(dst, "config.json"),
                   hf_config_from_release(rel, cfg_path, "float32" if args.dtype == "float32"
                                          else "bfloat16"))
        how = "rebuilt from the release config"
    copied = copy_side_files(rel_dir, dst)
    print(f"to-hf: {rel_dir} -> {dst}")
    print(f"  {len(entries)} tensors, {total} bytes; "
          + ", ".join(f"{n} {d}" for d, n in sorted(counts.items())) + f"; config.json: {how}")
    if copied:
        print(f"  copied {', '.join(copied)}")
    return 0


def hf_producer(tensors, name, out, block):
    def produce():
        v, how = release_values(tensors, name, block)
        where = f"{tensors[name].file.path}: tensor '{name}'"
        if out in ("I64", "I32", "I16", "I8", "U8", "BOOL"):
            return v.astype(DTYPES[out][1]).tobytes()
        if out == "F32":
            y = v.astype(np.float32)
            if not np.array_equal(y.astype(np.float64), v, equal_nan=True):
                raise ConvertError(f"{where}: values do not fit F32 exactly")
            return y.astype("<f4").tobytes()
        if out == "BF16":
            bits = f32_to_bf16_bits(v.astype(np.float32))
            if not np.array_equal(bf16_bits_to_f32(bits).astype(np.float64), v, equal_nan=True):
                raise ConvertError(f"{where}: the {how} values are not all bf16 values; use "
                                   f"--dtype float32")
            return bits.astype("<u2").tobytes()
        if out == "F16":
            y = v.astype(np.float16)
            if not np.array_equal(y.astype(np.float64), v, equal_nan=True):
                raise ConvertError(f"{where}: values do not fit F16 exactly; use --dtype float32")
            return y.astype("<f2").tobytes()
        raise ConvertError(f"{where}: cannot write dtype {out}")
    return produce


# ------------------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="convert_release.py",
        description="Convert DeepSeek-V4 checkpoints between transformers' save_pretrained "
                    "dialect and the release format (FP8 e4m3 128x128 ue8m0, FP4 e2m1 experts).")
    sub = ap.add_subparsers(dest="command", required=True)
    a = sub.add_parser("to-release", help="transformers checkpoint -> release format")
    a.add_argument("src", help="directory with config.json and model.safetensors")
    a.add_argument("dst", help="output directory (created; model files in it are replaced)")
    a.add_argument("--expert-dtype", choices=("fp4", "fp8"), default="fp4",
                   help="routed experts as FP4 e2m1 (V4-Flash/Pro) or FP8 (V4-Flash-Base)")
    a.add_argument("--max-shard-bytes", type=int, default=0,
                   help="split into model-0000i-of-0000n.safetensors shards of at most this many "
                        "tensor bytes, with model.safetensors.index.json (default: one file)")
    b = sub.add_parser("to-hf", help="release format -> transformers checkpoint (dequantised)")
    b.add_argument("release", help="release directory (config.json + safetensors)")
    b.add_argument("dst", help="output directory")
    b.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="auto: the source dtypes recorded in hf_dtypes.json, else the release's "
                        "(bf16 for decoded FP8/FP4)")
    args = ap.parse_args(argv)
    try:
        if args.command == "to-release":
            if os.path.abspath(args.src) == os.path.abspath(args.dst):
                raise ConvertError(f"{args.dst}: the output directory must differ from the input")
            return to_release(args)
        if os.path.abspath(args.release) == os.path.abspath(args.dst):
            raise ConvertError(f"{args.dst}: the output directory must differ from the input")
        return to_hf(args)
    except ConvertError as e:
        print(f"convert_release.py: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
