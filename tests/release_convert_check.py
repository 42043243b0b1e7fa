#!/usr/bin/env python3
"""Checks for tools/convert_release.py, driven by tests/test_release_convert.sh.

Every expected value here is derived independently of the converter: format tables from the
bit-field definitions in exact rational arithmetic, rounding by brute force over the whole value
table, block scales by exact comparison with powers of two, the expected release dtypes from
SPEC-dsv4 §5 written out here, and a safetensors reader of its own.

    release_convert_check.py formats
    release_convert_check.py names ENGINE_CHECKPOINT_C
    release_convert_check.py release SRC_DIR REL_DIR [--expert-dtype fp4|fp8]
    release_convert_check.py hf SRC_DIR REL_DIR HF_DIR
    release_convert_check.py config ORIGINAL_CONFIG REBUILT_CONFIG
    release_convert_check.py transformers-names SRC_DIR OUT_DIR
    release_convert_check.py noise SRC_DIR REL_DIR OUT_DIR SEED
    release_convert_check.py logits A.h5 B.h5 identical | deviation CONTROL.h5... | closer C.h5
Exit 0 when every check passes; each failure prints one line starting with FAIL.
"""
import json
import math
import os
import re
import shutil
import struct
import sys
from fractions import Fraction

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))

failures = 0


def check(ok, what):
    global failures
    if not ok:
        failures += 1
        print(f"FAIL: {what}")
    return ok


# ------------------------------------------------------------------------------------------ formats

def fp8_e4m3fn_value(code):
    """Exact value of an OCP e4m3fn code from its definition: 1 sign, 4 exponent bits (bias 7),
    3 mantissa bits, subnormals at exponent 0, S.1111.111 is NaN, no infinities. None = NaN."""
    sign = -1 if code & 0x80 else 1
    exp, man = (code >> 3) & 0xF, code & 0x7
    if exp == 0xF and man == 0x7:
        return None
    if exp == 0:
        return sign * Fraction(man, 8) * Fraction(2) ** (1 - 7)
    return sign * (1 + Fraction(man, 8)) * Fraction(2) ** (exp - 7)


E2M1_MAGNITUDES = [Fraction(0), Fraction(1, 2), Fraction(1), Fraction(3, 2), Fraction(2),
                   Fraction(3), Fraction(4), Fraction(6)]  # SPEC §4.2, nibbles 0..7


def fp4_e2m1_value(nibble):
    return (-1 if nibble & 8 else 1) * E2M1_MAGNITUDES[nibble & 7]


def brute_codes(y, table, max_mag):
    """The code round-to-nearest-even must give for each y (float64 multiples of a power of two
    fine enough that every distance below is exact): the nearest magnitude in the table after
    saturating at max_mag, ties to the code with an even low bit, sign from y's sign bit."""
    mags = np.array([float(v) if v is not None else np.inf for v in table[:len(table) // 2]])
    a = np.minimum(np.abs(y), max_mag)
    d = np.abs(a[:, None] - mags[None, :])
    best = d.min(axis=1)
    tied = d == best[:, None]
    codes = np.arange(len(mags))
    # among the tied codes take an even one (there are at most two, adjacent)
    pick = np.where(tied & (codes[None, :] % 2 == 0), codes[None, :], 10 ** 6).min(axis=1)
    single = tied.sum(axis=1) == 1
    pick = np.where(single, np.argmax(tied, axis=1), pick)
    return pick | (np.signbit(y).astype(np.int64) * (len(table) // 2))


def smallest_pow2_exponent(amax, qmax):
    """Smallest integer k with qmax * 2^k >= amax, by exact rational comparison."""
    a, q = Fraction(float(amax)), Fraction(float(qmax))
    k = math.ceil(math.log2(float(amax) / float(qmax)))
    while q * Fraction(2) ** (k - 1) >= a:
        k -= 1
    while q * Fraction(2) ** k < a:
        k += 1
    return k


def check_formats():
    import convert_release as cr
    rng = np.random.default_rng(20260731)

    # e4m3fn: the converter's decode table is the format's, anchors from the OCP spec
    table8 = [fp8_e4m3fn_value(c) for c in range(256)]
    conv8 = cr.E4M3_VALUES
    check(all((v is None and np.isnan(conv8[c])) or (v is not None and Fraction(conv8[c]) == v)
              for c, v in enumerate(table8)), "e4m3fn decode table differs from the definition")
    check(table8[0x7E] == 448 and table8[0x08] == Fraction(1, 64) and table8[0x01] == Fraction(1, 512)
          and table8[0x38] == 1 and table8[0xB8] == -1 and table8[0x7F] is None
          and table8[0xFF] is None, "e4m3fn anchors (448, 2^-6, 2^-9, +-1, NaN)")
    # every code round-trips: decode -> encode gives the code back (NaN keeps its sign bit,
    # -0.0 stays 0x80)
    vals = np.array([float(v) if v is not None else (np.nan if c < 128 else -np.nan)
                     for c, v in enumerate(table8)])
    vals[0x80] = -0.0
    back = cr.encode_e4m3fn(vals)
    check(np.array_equal(back, np.arange(256, dtype=np.uint8)),
          f"e4m3fn codes do not round-trip: {[(c, int(b)) for c, b in enumerate(back) if b != c][:8]}")
    # random values, ties, neighbours of ties, subnormals, values beyond 448, all multiples of
    # 2^-20 so distances are exact in float64
    q = 2.0 ** -20
    grid = np.array([float(v) for v in table8[:0x7F]])
    mids = (grid[:-1] + grid[1:]) / 2
    y = np.concatenate([
        rng.integers(0, 2 ** 30, 100000) * q,                        # uniform to 1024
        np.round(2.0 ** rng.uniform(-12, 9.5, 100000) / q) * q,      # log-uniform
        grid, mids, mids + q, mids - q, [448.0, 464.0, 464.0 + q, 1e3, 0.0]])
    y = y * np.where(rng.random(y.size) < 0.5, -1.0, 1.0)
    got = cr.encode_e4m3fn(y).astype(np.int64)
    want = brute_codes(y, table8, 448.0)
    bad = np.flatnonzero(got != want)
    check(bad.size == 0, f"e4m3fn encoder differs from brute-force nearest-even on {bad.size} of "
          f"{y.size} values, e.g. {[(y[i], got[i], want[i]) for i in bad[:4]]}")
    check(cr.encode_e4m3fn(np.array([np.inf, -np.inf]))[0] == 0x7E and
          cr.encode_e4m3fn(np.array([-np.inf]))[0] == 0xFE, "e4m3fn saturates infinities")

    # e2m1: the 16 codes against SPEC's value list, round trip, brute force
    table4 = [fp4_e2m1_value(c) for c in range(16)]
    check(all(Fraction(cr.E2M1_VALUES[c]) == v for c, v in enumerate(table4)),
          "e2m1 decode table differs from SPEC's +-{0, .5, 1, 1.5, 2, 3, 4, 6}")
    vals = np.array([float(v) for v in table4])
    vals[8] = -0.0
    back = cr.encode_e2m1(vals)
    check(np.array_equal(back, np.arange(16, dtype=np.uint8)), f"e2m1 codes do not round-trip: {back}")
    q = 2.0 ** -8
    grid = np.array([float(v) for v in table4[:8]])
    mids = (grid[:-1] + grid[1:]) / 2
    y = np.concatenate([rng.integers(0, 8 * 256, 50000) * q, grid, mids, mids + q, mids - q,
                        [6.0, 7.0, 100.0]])
    y = y * np.where(rng.random(y.size) < 0.5, -1.0, 1.0)
    got = cr.encode_e2m1(y).astype(np.int64)
    want = brute_codes(y, table4, 6.0)
    bad = np.flatnonzero(got != want)
    check(bad.size == 0, f"e2m1 encoder differs from brute-force nearest-even on {bad.size} of "
          f"{y.size} values, e.g. {[(y[i], got[i], want[i]) for i in bad[:4]]}")

    # ue8m0 scale exponents: smallest power of two with qmax * 2^k >= amax
    for qmax in (448.0, 6.0):
        exact = [qmax * 2.0 ** k for k in range(-30, 20)]
        amax = np.concatenate([
            np.float32(2.0 ** rng.uniform(-40, 20, 3000)).astype(np.float64), exact,
            np.nextafter(np.float32(exact), np.float32(np.inf)).astype(np.float64),
            np.nextafter(np.float32(exact), np.float32(0)).astype(np.float64)])
        got = cr.ue8m0_exponent(amax, qmax)
        want = np.array([smallest_pow2_exponent(a, qmax) for a in amax])
        bad = np.flatnonzero(got != want)
        check(bad.size == 0, f"ue8m0 exponent for qmax {qmax} wrong on {bad.size} values, e.g. "
              f"{[(amax[i], got[i], want[i]) for i in bad[:4]]}")

    # bf16: nearest of the two neighbouring bf16 values, ties to even
    bits = rng.integers(0, 2 ** 32, 200000, dtype=np.uint64).astype(np.uint32)
    bits = bits[(bits & 0x7F800000) != 0x7F800000]
    bits = np.concatenate([bits, (bits & 0xFFFF0000) | 0x8000])  # exact ties
    x = bits.view(np.float32).astype(np.float64)
    lo = (bits >> 16).astype(np.int64)
    lo_v = (lo.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    hi_v = (((lo + 1).astype(np.uint32)) << 16).view(np.float32).astype(np.float64)
    hi_v = np.where(np.isinf(hi_v), np.sign(x) * 2.0 ** 128, hi_v)
    dl, dh = np.abs(x - lo_v), np.abs(hi_v - x)
    want = np.where(dl < dh, lo, np.where(dh < dl, lo + 1, np.where(lo % 2 == 0, lo, lo + 1)))
    got = cr.f32_to_bf16_bits(bits.view(np.float32)).astype(np.int64)
    check(np.array_equal(got, want & 0xFFFF), "bf16 rounding is not nearest-even")
    # whole-matrix quantisers on shapes with partial 128x128 tiles, an all-zero tile (scale from
    # the 1e-4 floor: 2^-22), a tile of tiny values, FP4 rows with a zero block and huge values
    stats = {}
    x = np.round(rng.standard_normal((200, 300)) * 2 ** 12) * 2.0 ** -14
    x[:128, 128:256] = 0.0
    x[128:, 256:] *= 2.0 ** -14
    x[5, 7] = -3.0e4
    codes, k = cr.quantize_fp8_blocks(x)
    check(k[0, 1] == -22, f"all-zero FP8 tile: scale 2^{k[0, 1]}, expected the floor's 2^-22")
    deq = check_fp8_tensor("fp8 200x300", x, codes, (k + 127).astype(np.uint8), stats)
    check(deq is not None and np.array_equal(cr.dequantize_fp8_blocks(codes, np.ldexp(1.0, k)), deq),
          "converter's FP8 decode differs from this file's")
    x = np.round(rng.standard_normal((7, 96)) * 2 ** 10) * 2.0 ** -8
    x[2, 32:64] = 0.0
    x[3] *= 2.0 ** 60
    packed, k = cr.quantize_fp4_rows(x)
    check(k[2, 1] == -126, f"all-zero FP4 block: scale 2^{k[2, 1]}, expected 2^-126")
    deq = check_fp4_tensor("fp4 7x96", x, packed.view(np.int8), (k + 127).astype(np.uint8), stats)
    check(deq is not None and np.array_equal(cr.dequantize_fp4_rows(packed, np.ldexp(1.0, k)), deq),
          "converter's FP4 decode differs from this file's")
    print("formats: 256 e4m3fn and 16 e2m1 codes round-trip; encoders, ue8m0 exponents, bf16 and "
          f"block quantisers (partial tiles, amax floors; {stats.get('fp8 ties', 0)} FP8 and "
          f"{stats.get('fp4 ties', 0)} FP4 ties) match brute force")


# ------------------------------------------------------------------------------------------ names

def check_names(checkpoint_c):
    import convert_release as cr
    text = open(checkpoint_c).read()
    body = text[text.index("name_rules[] = {"):]
    body = body[:body.index("};")]
    rows = re.findall(r'\{RULE_(\w+), "([^"]*)", (?:NULL|"([^"]*)")\}', body)
    engine = [(k.lower(), a, b or None) for k, a, b in rows]
    check(engine == [(k, a, b) for k, a, b in cr.ENGINE_NAME_RULES],
          f"convert_release.py ENGINE_NAME_RULES differs from engine/checkpoint.c name_rules:\n"
          f"  engine {engine}\n  python {cr.ENGINE_NAME_RULES}")
    print(f"names: the converter's table mirrors the engine's {len(engine)} name rules")


# ------------------------------------------------------------------------------------------ files

DT = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "F8_E4M3": "u1", "F8_E8M0": "u1",
      "I64": "<i8", "I32": "<i4", "I8": "i1", "U8": "u1"}


def read_st(path):
    """{name: (dtype, shape, raw numpy array)} of one safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        a = np.frombuffer(blob[8 + n + b:8 + n + end], dtype=DT[e["dtype"]]).reshape(e["shape"])
        out[name] = (e["dtype"], tuple(e["shape"]), a)
    return out


def read_dir(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_st(os.path.join(d, "model.safetensors"))
    out = {}
    for shard in sorted(set(json.load(open(index))["weight_map"].values())):
        out.update(read_st(os.path.join(d, shard)))
    return out


def as_f64(dtype, a):
    if dtype == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def release_name(hf_name):
    """save_pretrained name -> release name (SPEC §5), written out for the fixture's names."""
    fixed = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "norm.weight",
             "model.hc_head.hc_fn": "hc_head_fn", "model.hc_head.hc_base": "hc_head_base",
             "model.hc_head.hc_scale": "hc_head_scale", "head.weight": "head.weight"}
    if hf_name in fixed:
        return fixed[hf_name]
    name = re.sub(r"^model\.layers\.", "layers.", hf_name)
    return re.sub(r"^(layers\.\d+\.)attn\.norm\.weight$", r"\1attn.kv_norm.weight", name)


# SPEC-dsv4 §5: release dtype of each name ("N" any layer, "E" any expert); FP8/FP4 weights have a
# ".scale" F8_E8M0 companion.
SPEC_DTYPES = {
    "embed.weight": "BF16", "head.weight": "BF16", "norm.weight": "BF16",
    "hc_head_fn": "F32", "hc_head_base": "F32", "hc_head_scale": "F32",
    "layers.N.attn_norm.weight": "BF16", "layers.N.ffn_norm.weight": "BF16",
    "layers.N.hc_attn_fn": "F32", "layers.N.hc_attn_base": "F32", "layers.N.hc_attn_scale": "F32",
    "layers.N.hc_ffn_fn": "F32", "layers.N.hc_ffn_base": "F32", "layers.N.hc_ffn_scale": "F32",
    "layers.N.attn.wq_a.weight": "F8_E4M3", "layers.N.attn.q_norm.weight": "BF16",
    "layers.N.attn.wq_b.weight": "F8_E4M3", "layers.N.attn.wkv.weight": "F8_E4M3",
    "layers.N.attn.kv_norm.weight": "BF16", "layers.N.attn.wo_a.weight": "F8_E4M3",
    "layers.N.attn.wo_b.weight": "F8_E4M3", "layers.N.attn.attn_sink": "F32",
    "layers.N.attn.compressor.wkv.weight": "BF16", "layers.N.attn.compressor.wgate.weight": "BF16",
    "layers.N.attn.compressor.ape": "F32", "layers.N.attn.compressor.norm.weight": "BF16",
    "layers.N.attn.indexer.wq_b.weight": "F8_E4M3",
    "layers.N.attn.indexer.weights_proj.weight": "BF16",
    "layers.N.attn.indexer.compressor.wkv.weight": "BF16",
    "layers.N.attn.indexer.compressor.wgate.weight": "BF16",
    "layers.N.attn.indexer.compressor.ape": "F32",
    "layers.N.attn.indexer.compressor.norm.weight": "BF16",
    "layers.N.ffn.gate.weight": "BF16", "layers.N.ffn.gate.bias": "F32",
    "layers.N.ffn.gate.tid2eid": "I64",
    "layers.N.ffn.experts.E.w1.weight": "I8", "layers.N.ffn.experts.E.w2.weight": "I8",
    "layers.N.ffn.experts.E.w3.weight": "I8",
    "layers.N.ffn.shared_experts.w1.weight": "F8_E4M3",
    "layers.N.ffn.shared_experts.w2.weight": "F8_E4M3",
    "layers.N.ffn.shared_experts.w3.weight": "F8_E4M3",
}


def pattern_of(name):
    name = re.sub(r"^layers\.\d+\.", "layers.N.", name)
    return re.sub(r"\.experts\.\d+\.", ".experts.E.", name)


def fp8_grid():
    mags = np.array([float(fp8_e4m3fn_value(c)) for c in range(0x7F)])  # finite, non-negative
    return mags, np.array([float(fp8_e4m3fn_value(c)) if c & 0x7F != 0x7F else np.nan
                           for c in range(256)])


def half_step(y, mbits, emin):
    """Half the grid spacing at |y|: 2^(max(floor(log2|y|), emin) - mbits - 1)."""
    a = np.abs(y)
    e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    # floor(log2) of a float64 can be off by one next to a power of two: fix it exactly
    e = np.where(np.ldexp(1.0, e.astype(np.int64)) > a, e - 1, e)
    e = np.where(np.ldexp(1.0, (e + 1).astype(np.int64)) <= a, e + 1, e)
    e = np.where(a > 0, np.maximum(e, emin), emin)
    return np.ldexp(1.0, (e - mbits - 1).astype(np.int64))


def nearest_distance(y, mags):
    """min over the grid magnitudes of | |y| - m |, in chunks."""
    a = np.abs(y).reshape(-1)
    out = np.empty_like(a)
    for i in range(0, a.size, 65536):
        out[i:i + 65536] = np.abs(a[i:i + 65536, None] - mags[None, :]).min(axis=1)
    return out.reshape(y.shape)


def check_fp8_tensor(name, x, codes, scale_codes, stats):
    """x: the source values [out, in]; codes: F8_E4M3 bytes; scale_codes: F8_E8M0 bytes."""
    out, inn = x.shape
    want_shape = (-(-out // 128), -(-inn // 128))
    if not check(scale_codes.shape == want_shape, f"{name}: scale shape {scale_codes.shape}, "
                 f"expected {want_shape}"):
        return
    mags, table = fp8_grid()
    ok = True
    for bi in range(want_shape[0]):
        for bj in range(want_shape[1]):
            tile = x[bi * 128:(bi + 1) * 128, bj * 128:(bj + 1) * 128]
            k = smallest_pow2_exponent(max(float(np.abs(tile).max()), 1e-4), 448.0)
            ok &= check(int(scale_codes[bi, bj]) == k + 127,
                        f"{name}: tile ({bi}, {bj}) scale code {scale_codes[bi, bj]}, expected "
                        f"2^{k} = code {k + 127}")
    s = np.ldexp(1.0, np.repeat(np.repeat(scale_codes.astype(np.int64) - 127, 128, 0), 128,
                                1)[:out, :inn])
    check(not np.any((codes & 0x7F) == 0x7F), f"{name}: NaN code in an FP8 weight")
    deq = table[codes] * s
    err = np.abs(deq - x)
    ok &= check(np.all(err <= half_step(x / s, 3, -6) * s),
                f"{name}: FP8 error beyond half a step of the tile's grid")
    ok &= check(np.array_equal(err, nearest_distance(x / s, mags) * s),
                f"{name}: an FP8 code is not the nearest grid value")
    tie = (err > 0) & (err == half_step(x / s, 3, -6) * s)
    check(np.all(codes[tie] % 2 == 0), f"{name}: a tie between two FP8 codes went to the odd one")
    stats["fp8"] = stats.get("fp8", 0) + 1
    stats["fp8 ties"] = stats.get("fp8 ties", 0) + int(tie.sum())
    return deq


def check_fp4_tensor(name, x, packed, scale_codes, stats):
    out, inn = x.shape
    if not check(packed.shape == (out, inn // 2) and scale_codes.shape == (out, inn // 32),
                 f"{name}: FP4 shapes {packed.shape} / {scale_codes.shape} for logical {x.shape}"):
        return
    p = packed.view(np.uint8)
    nib = np.empty((out, inn), dtype=np.int64)
    nib[:, 0::2], nib[:, 1::2] = p & 0xF, p >> 4  # element 2k in the low nibble
    table = np.array([float(fp4_e2m1_value(c)) for c in range(16)])
    for r in range(out):
        for b in range(inn // 32):
            k = smallest_pow2_exponent(max(float(np.abs(x[r, b * 32:(b + 1) * 32]).max()),
                                           6 * 2.0 ** -126), 6.0)
            if int(scale_codes[r, b]) != k + 127:
                check(False, f"{name}: row {r} block {b} scale code {scale_codes[r, b]}, expected "
                      f"{k + 127}")
                return
    s = np.ldexp(1.0, np.repeat(scale_codes.astype(np.int64) - 127, 32, 1))
    deq = table[nib] * s
    err = np.abs(deq - x)
    check(np.all(err <= half_step(x / s, 1, 0) * s), f"{name}: FP4 error beyond half a step")
    mags = table[:8]
    check(np.array_equal(err, nearest_distance(x / s, mags) * s),
          f"{name}: an FP4 code is not the nearest grid value")
    tie = (err > 0) & (err == half_step(x / s, 1, 0) * s)
    check(np.all(nib[tie] % 2 == 0), f"{name}: a tie between two FP4 codes went to the odd one")
    stats["fp4"] = stats.get("fp4", 0) + 1
    stats["fp4 ties"] = stats.get("fp4 ties", 0) + int(tie.sum())
    return deq


def check_release(src_dir, rel_dir, expert_dtype):
    src, rel = read_dir(src_dir), read_dir(rel_dir)
    stats = {}
    expected_names = set()
    for hf_name, (dtype, shape, a) in src.items():
        name = release_name(hf_name)
        want = SPEC_DTYPES.get(pattern_of(name))
        if not check(want is not None, f"{hf_name}: not a SPEC §5 tensor"):
            continue
        if ".experts." in name and expert_dtype == "fp8":
            want = "F8_E4M3"
        expected_names.add(name)
        if not check(name in rel, f"{name} missing from the release"):
            continue
        rdt, rshape, r = rel[name]
        check(rdt == want, f"{name}: release dtype {rdt}, SPEC says {want}")
        if want in ("F8_E4M3", "I8"):
            expected_names.add(name[:-len(".weight")] + ".scale")
            sc = rel.get(name[:-len(".weight")] + ".scale")
            if not check(sc is not None and sc[0] == "F8_E8M0", f"{name}: no F8_E8M0 .scale"):
                continue
            x = as_f64(dtype, a)
            if want == "F8_E4M3":
                check_fp8_tensor(name, x, r, sc[2], stats)
            else:
                check_fp4_tensor(name, x, r, sc[2], stats)
        elif want == "I64":
            check(np.array_equal(r, a.astype(np.int64)), f"{name}: tid2eid values changed")
        else:
            check(rshape == shape, f"{name}: shape {rshape} != {shape}")
            x, y = as_f64(dtype, a), as_f64(rdt, r)
            if want == "BF16" and dtype != "BF16":  # a narrowing cast: nearest bf16
                check(np.all(np.abs(y - x) <= half_step(x, 7, -126)), f"{name}: bf16 cast error")
                stats["bf16 cast"] = stats.get("bf16 cast", 0) + 1
                if np.array_equal(y, x):
                    stats["bf16 cast exact"] = stats.get("bf16 cast exact", 0) + 1
            else:
                check(np.array_equal(y, x), f"{name}: kept tensor changed value")
                stats["kept"] = stats.get("kept", 0) + 1
    check(set(rel) == expected_names, f"release has unexpected tensors "
          f"{sorted(set(rel) - expected_names)[:5]} / lacks {sorted(expected_names - set(rel))[:5]}")
    print(f"release: {len(rel)} tensors named and typed as SPEC §5; checked by brute force: "
          + ", ".join(f"{v} {k}" for k, v in sorted(stats.items())))


def check_hf(src_dir, rel_dir, hf_dir):
    """to-hf's output against the source: same names, shapes and dtypes; kept tensors
    byte-identical; quantised ones equal to the release's decode and within half a step of the
    source."""
    src, rel, hf = read_dir(src_dir), read_dir(rel_dir), read_dir(hf_dir)
    check(set(hf) == set(src), f"to-hf names differ: {sorted(set(hf) ^ set(src))[:6]}")
    mags8, table8 = fp8_grid()
    table4 = np.array([float(fp4_e2m1_value(c)) for c in range(16)])
    n_same = n_quant = 0
    for name, (dtype, shape, a) in src.items():
        if name not in hf:
            continue
        hdt, hshape, h = hf[name]
        check(hdt == dtype and hshape == shape, f"{name}: to-hf gives {hdt} {hshape}, source "
              f"{dtype} {shape}")
        rname = release_name(name)
        rdt, _, r = rel[rname]
        if rdt in ("F8_E4M3", "I8"):
            sc = rel[rname[:-len(".weight")] + ".scale"][2].astype(np.int64) - 127
            x, y = as_f64(dtype, a), as_f64(hdt, h)
            if rdt == "F8_E4M3":
                s = np.ldexp(1.0, np.repeat(np.repeat(sc, 128, 0), 128, 1)[:shape[0], :shape[1]])
                deq, bound = table8[r] * s, half_step(x / s, 3, -6) * s
            else:
                p = r.view(np.uint8)
                nib = np.empty(shape, dtype=np.int64)
                nib[:, 0::2], nib[:, 1::2] = p & 0xF, p >> 4
                s = np.ldexp(1.0, np.repeat(sc, 32, 1))
                deq, bound = table4[nib] * s, half_step(x / s, 1, 0) * s
            check(np.array_equal(y, deq), f"{name}: to-hf values are not the release's decode")
            check(np.all(np.abs(y - x) <= bound), f"{name}: |to-hf - source| beyond half a step of "
                  f"the block's grid")
            n_quant += 1
        else:
            check(h.tobytes() == a.tobytes(), f"{name}: kept tensor not bit-identical")
            n_same += 1
    print(f"to-hf: {len(hf)} tensors; {n_same} kept bit-identical, {n_quant} dequantised within "
          f"half a step of the source")


def check_config(original, rebuilt):
    a, b = json.load(open(original)), json.load(open(rebuilt))
    diff = [k for k in sorted(set(a) | set(b)) if k != "transformers_version" and
            a.get(k, "<absent>") != b.get(k, "<absent>")]
    check(not diff, "rebuilt config differs from save_pretrained's in " +
          "; ".join(f"{k}: {a.get(k, '<absent>')} vs {b.get(k, '<absent>')}" for k in diff))
    print(f"config: rebuilt config.json equals the original in all {len(a) - 1} fields but "
          f"transformers_version")


# ------------------------------------------------------------------------------ derived checkpoints

def write_st(path, tensors):
    """tensors: {name: (dtype, array of the stored bits)}."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, (dtype, a) in tensors.items():
        b = np.ascontiguousarray(a).astype(DT[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


# transformers' DeepseekV4 module names (modeling_deepseek_v4.py) for the save_pretrained tails
MODULE_NAMES = {
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "hc_attn_fn": "attn_hc.fn", "hc_attn_base": "attn_hc.base", "hc_attn_scale": "attn_hc.scale",
    "hc_ffn_fn": "ffn_hc.fn", "hc_ffn_base": "ffn_hc.base", "hc_ffn_scale": "ffn_hc.scale",
    "attn.wq_a.weight": "self_attn.q_a_proj.weight", "attn.q_norm.weight": "self_attn.q_a_norm.weight",
    "attn.wq_b.weight": "self_attn.q_b_proj.weight", "attn.wkv.weight": "self_attn.kv_proj.weight",
    "attn.norm.weight": "self_attn.kv_norm.weight", "attn.wo_a.weight": "self_attn.o_a_proj.weight",
    "attn.wo_b.weight": "self_attn.o_b_proj.weight", "attn.attn_sink": "self_attn.sinks",
    "attn.compressor.wkv.weight": "self_attn.compressor.kv_proj.weight",
    "attn.compressor.wgate.weight": "self_attn.compressor.gate_proj.weight",
    "attn.compressor.ape": "self_attn.compressor.position_bias",
    "attn.compressor.norm.weight": "self_attn.compressor.kv_norm.weight",
    "attn.indexer.compressor.wkv.weight": "self_attn.compressor.indexer.kv_proj.weight",
    "attn.indexer.compressor.wgate.weight": "self_attn.compressor.indexer.gate_proj.weight",
    "attn.indexer.compressor.ape": "self_attn.compressor.indexer.position_bias",
    "attn.indexer.compressor.norm.weight": "self_attn.compressor.indexer.kv_norm.weight",
    "attn.indexer.wq_b.weight": "self_attn.compressor.indexer.q_b_proj.weight",
    "attn.indexer.weights_proj.weight": "self_attn.compressor.indexer.scorer.weights_proj.weight",
    "ffn.gate.weight": "mlp.gate.weight", "ffn.gate.bias": "mlp.gate.e_score_correction_bias",
    "ffn.gate.tid2eid": "mlp.gate.tid2eid",
    "ffn.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
    "ffn.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
}


def transformers_names(src_dir, out_dir):
    """The fixture as a raw state_dict of transformers' modules: module names, experts stacked as
    gate_up_proj [E, 2I, D] (gate rows first, as DeepseekV4Experts chunks them) and
    down_proj [E, D, I], lm_head.weight."""
    src = read_dir(src_dir)
    out, experts = {}, {}
    for name, (dtype, shape, a) in src.items():
        m = re.match(r"^model\.layers\.(\d+)\.(.*)$", name)
        if name == "head.weight":
            out["lm_head.weight"] = (dtype, a)
        elif not m:
            out[name] = (dtype, a)
        elif re.match(r"^ffn\.experts\.\d+\.w[123]\.weight$", m.group(2)):
            e, w = re.match(r"^ffn\.experts\.(\d+)\.(w[123])", m.group(2)).groups()
            experts.setdefault(m.group(1), {}).setdefault(int(e), {})[w] = (dtype, a)
        else:
            out[f"model.layers.{m.group(1)}.{MODULE_NAMES[m.group(2)]}"] = (dtype, a)
    for layer, per in experts.items():
        ids = sorted(per)
        dtype = per[ids[0]]["w1"][0]
        out[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = (dtype, np.stack(
            [np.concatenate([per[e]["w1"][1], per[e]["w3"][1]], axis=0) for e in ids]))
        out[f"model.layers.{layer}.mlp.experts.down_proj"] = (dtype, np.stack(
            [per[e]["w2"][1] for e in ids]))
    os.makedirs(out_dir, exist_ok=True)
    write_st(os.path.join(out_dir, "model.safetensors"), out)
    shutil.copyfile(os.path.join(src_dir, "config.json"), os.path.join(out_dir, "config.json"))
    print(f"transformers-names: {len(out)} tensors in transformers' module naming")


def noise(src_dir, rel_dir, out_dir, seed):
    """A control: the source with every quantised tensor perturbed by Gaussian noise of the same
    rms as its quantisation error (computed from the release with this file's decoders), stored
    F32. How far its logits move measures how much this model amplifies that much weight error."""
    rng = np.random.default_rng(seed)
    src, rel = read_dir(src_dir), read_dir(rel_dir)
    _, table8 = fp8_grid()
    table4 = np.array([float(fp4_e2m1_value(c)) for c in range(16)])
    out = {}
    for name, (dtype, shape, a) in src.items():
        rname = release_name(name)
        rdt, _, r = rel[rname]
        if rdt not in ("F8_E4M3", "I8"):
            out[name] = (dtype, a)
            continue
        sc = rel[rname[:-len(".weight")] + ".scale"][2].astype(np.int64) - 127
        if rdt == "F8_E4M3":
            deq = table8[r] * np.ldexp(1.0, np.repeat(np.repeat(sc, 128, 0), 128, 1)[:shape[0],
                                                                                   :shape[1]])
        else:
            p = r.view(np.uint8)
            nib = np.empty(shape, dtype=np.int64)
            nib[:, 0::2], nib[:, 1::2] = p & 0xF, p >> 4
            deq = table4[nib] * np.ldexp(1.0, np.repeat(sc, 32, 1))
        x = as_f64(dtype, a)
        rms = np.sqrt(np.mean((deq - x) ** 2))
        out[name] = ("F32", (x + rng.standard_normal(shape) * rms).astype(np.float32))
    os.makedirs(out_dir, exist_ok=True)
    write_st(os.path.join(out_dir, "model.safetensors"), out)
    shutil.copyfile(os.path.join(src_dir, "config.json"), os.path.join(out_dir, "config.json"))


def logits(args):
    import h5py

    def load(p):
        return h5py.File(p, "r")["taps/logits"][:].astype(np.float64)

    a, b = load(args[0]), load(args[1])
    mode = args[2]
    if mode == "identical":
        check(a.shape == b.shape and a.astype(np.float32).tobytes() == b.astype(np.float32).tobytes(),
              f"logits of {args[0]} and {args[1]} are not bit-identical")
        print(f"logits: {args[0]} == {args[1]} bit for bit ({a.shape[0]} positions)")
        return
    n = min(a.shape[0], b.shape[0])

    def rel(x):
        return float(np.sqrt(np.mean((x[:n] - b[:n]) ** 2) / np.mean(b[:n] ** 2)))

    if mode == "deviation":
        r = rel(a)
        controls = [rel(load(p)) for p in args[3:]]
        c = float(np.mean(controls))
        print(f"logits: {args[0]} vs {args[1]}: rms relative deviation {r:.4f}; Gaussian weight "
              f"noise of the same rms per tensor gives {', '.join(f'{x:.4f}' for x in controls)}")
        check(r > 0, "quantised logits equal the original ones: nothing was quantised?")
        check(0.5 * c <= r <= 1.5 * c, f"quantisation moves the logits by {r:.4f}, outside "
              f"[0.5, 1.5] x the {c:.4f} that weight noise of the same size gives")
    elif mode == "closer":
        r, r2 = rel(a), rel(load(args[3]))
        print(f"logits: deviation {r:.4f} ({args[0]}) < {r2:.4f} ({args[3]})")
        check(r < r2, f"{args[0]} should deviate less than {args[3]}")


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "formats":
        check_formats()
    elif cmd == "names":
        check_names(args[0])
    elif cmd == "release":
        check_release(args[0], args[1], args[3] if len(args) > 3 else "fp4")
    elif cmd == "hf":
        check_hf(*args)
    elif cmd == "config":
        check_config(*args)
    elif cmd == "transformers-names":
        transformers_names(*args)
    elif cmd == "noise":
        noise(args[0], args[1], args[2], int(args[3]))
    elif cmd == "logits":
        logits(args)
    else:
        sys.exit(f"unknown command {cmd}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
