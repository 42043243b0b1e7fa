#!/usr/bin/env python3
"""Write a random-weight DeepSeek-V4 checkpoint in the reference tensor naming (SPEC-dsv4 §5),
bf16 weights and fp32 mHC/sink/ape/bias, with numpy only (no torch). For benchmarks: the engine's
exactness is established on the transformers oracle fixtures, not on this model.

Usage: python3 tools/make_random_checkpoint.py OUTDIR [--index-heads N] [--topk N] [--seed S]
"""
import argparse
import json
import os
import struct

import numpy as np


def bf16_bytes(a):
    """float32 array -> bf16 bytes (round to nearest even)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16).tobytes()


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--index-heads", type=int, default=4)
    ap.add_argument("--topk", type=int, default=64)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    D, H, d, r, q_lo, G, Ro = 128, 4, 128, 64, 128, 2, 128
    hI, dI, E, kE, F, V, hc = args.index_heads, 128, 4, 2, 128, 264, 4
    ratios = [0, 4, 128, 4]
    cfg = {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
        "vocab_size": V, "bos_token_id": 256, "eos_token_id": 257, "hidden_size": D,
        "num_hidden_layers": len(ratios), "compress_ratios": ratios + [0],
        "num_nextn_predict_layers": 1, "num_attention_heads": H, "num_key_value_heads": 1,
        "head_dim": d, "qk_rope_head_dim": r, "q_lora_rank": q_lo, "o_groups": G,
        "o_lora_rank": Ro, "sliding_window": args.window, "index_n_heads": hI,
        "index_head_dim": dI, "index_topk": args.topk, "n_routed_experts": E,
        "num_experts_per_tok": kE, "n_shared_experts": 1, "moe_intermediate_size": F,
        "scoring_func": "sqrtsoftplus", "routed_scaling_factor": 1.5, "swiglu_limit": 10.0,
        "num_hash_layers": 1, "hc_mult": hc, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1},
        "max_position_embeddings": 1048576, "tie_word_embeddings": False,
    }
    t = {}

    def lin(name, out, inp):
        t[name] = ("BF16", (out, inp), bf16_bytes(rng.standard_normal((out, inp)) / np.sqrt(inp)))

    def f32(name, shape, arr):
        t[name] = ("F32", shape, np.asarray(arr, dtype=np.float32).reshape(shape).tobytes())

    def norm(name, n):
        f32(name, (n,), 1 + 0.2 * rng.standard_normal(n))

    t["embed.weight"] = ("BF16", (V, D), bf16_bytes(rng.standard_normal((V, D))))
    lin("head.weight", V, D)
    norm("norm.weight", D)
    f32("hc_head_fn", (hc, hc * D), rng.standard_normal((hc, hc * D)) / np.sqrt(hc * D))
    f32("hc_head_base", (hc,), 0.5 * rng.standard_normal(hc))
    f32("hc_head_scale", (1,), 1 + 0.3 * rng.standard_normal(1))
    mixes = (2 + hc) * hc
    for i, m in enumerate(ratios):
        p = f"layers.{i}."
        norm(p + "attn_norm.weight", D)
        norm(p + "ffn_norm.weight", D)
        for s in ("attn", "ffn"):
            f32(p + f"hc_{s}_fn", (mixes, hc * D), rng.standard_normal((mixes, hc * D)) / np.sqrt(hc * D))
            f32(p + f"hc_{s}_base", (mixes,), 0.5 * rng.standard_normal(mixes))
            f32(p + f"hc_{s}_scale", (3,), 1 + 0.3 * rng.standard_normal(3))
        lin(p + "attn.wq_a.weight", q_lo, D)
        norm(p + "attn.q_norm.weight", q_lo)
        lin(p + "attn.wq_b.weight", H * d, q_lo)
        lin(p + "attn.wkv.weight", d, D)
        norm(p + "attn.kv_norm.weight", d)
        lin(p + "attn.wo_a.weight", G * Ro, H * d // G)
        lin(p + "attn.wo_b.weight", D, G * Ro)
        f32(p + "attn.attn_sink", (H,), rng.standard_normal(H))
        comps = []
        if m:
            comps.append(("attn.compressor.", d, 2 if m == 4 else 1))
        if m == 4:
            comps.append(("attn.indexer.compressor.", dI, 2))
            lin(p + "attn.indexer.wq_b.weight", hI * dI, q_lo)
            lin(p + "attn.indexer.weights_proj.weight", hI, D)
        for prefix, dim, c in comps:
            lin(p + prefix + "wkv.weight", c * dim, D)
            lin(p + prefix + "wgate.weight", c * dim, D)
            f32(p + prefix + "ape", (m, c * dim), 0.5 * rng.standard_normal((m, c * dim)))
            norm(p + prefix + "norm.weight", dim)
        lin(p + "ffn.gate.weight", E, D)
        if i < cfg["num_hash_layers"]:
            ids = np.stack([rng.permutation(E)[:kE] for _ in range(V)]).astype(np.int64)
            t[p + "ffn.gate.tid2eid"] = ("I64", (V, kE), ids.tobytes())
        else:
            f32(p + "ffn.gate.bias", (E,), 0.1 * rng.standard_normal(E))
        for e in range(E):
            lin(p + f"ffn.experts.{e}.w1.weight", F, D)
            lin(p + f"ffn.experts.{e}.w2.weight", D, F)
            lin(p + f"ffn.experts.{e}.w3.weight", F, D)
        lin(p + "ffn.shared_experts.w1.weight", F, D)
        lin(p + "ffn.shared_experts.w2.weight", D, F)
        lin(p + "ffn.shared_experts.w3.weight", F, D)
    os.makedirs(args.outdir, exist_ok=True)
    with open(os.path.join(args.outdir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    write_safetensors(os.path.join(args.outdir, "model.safetensors"), t)


if __name__ == "__main__":
    main()
