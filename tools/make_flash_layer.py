#!/usr/bin/env python3
"""Write a DeepSeek-V4-Flash-shaped checkpoint in the released formats, with random weights (numpy
only): the memory benchmark's model (one layer) and the GPU prefill benchmark's (--layers 2: the
CSA layer, then an HCA layer, ratio 128, no indexer). One CSA layer (ratio 4) with every tensor of
SPEC-dsv4 §5 in its Flash shape and dtype: FP8 e4m3 + 128x128 ue8m0 scales for the attention and
shared-expert projections and the indexer query, packed FP4 e2m1 + ue8m0 per 32 for the 256
routed experts, BF16 for the compressors, gate, weights_proj and norms, F32 for mHC, sinks, ape
and the gate bias. The vocabulary is cut to --vocab (the layer is what is measured; a 129280-row
embedding and head would add 2 GiB of BF16 that says nothing about the layer).

Usage: python3 tools/make_flash_layer.py OUTDIR [--vocab N] [--seed S] [--layers 1|2]
The layer alone is 3.4 GB as stored (26 GB if it were dequantised to fp32).
"""
import argparse
import json
import os
import struct

import numpy as np


def bf16(a):
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)).tobytes()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--layers", type=int, default=1, choices=(1, 2))
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    D, H, d, r, q_lo, G, Ro, hI, dI = 4096, 64, 512, 64, 1024, 8, 1024, 64, 128
    E, kE, F, V, hc, m = 256, 6, 2048, args.vocab, 4, 4
    tensors = {}

    def f32(name, shape, scale):
        tensors[name] = ("F32", shape, (rng.standard_normal(shape, dtype=np.float32) * scale).tobytes())

    def b16(name, shape, scale, offset=0.0):
        tensors[name] = ("BF16", shape, bf16(rng.standard_normal(shape, dtype=np.float32) * scale + offset))

    def fp8(name, shape, exp=120):
        rows, cols = shape
        codes = rng.integers(0, 256, size=shape, dtype=np.uint8)
        codes[(codes & 0x7F) == 0x7F] ^= 0x01  # no NaN codes
        tensors[name] = ("F8_E4M3", shape, codes.tobytes())
        sshape = (-(-rows // 128), -(-cols // 128))
        tensors[name[:-7] + ".scale"] = ("F8_E8M0", sshape,
                                         rng.integers(exp - 2, exp + 1, size=sshape, dtype=np.uint8).tobytes())

    def fp4(name, shape, exp=122):
        rows, cols = shape
        tensors[name] = ("I8", (rows, cols // 2), rng.integers(0, 256, size=(rows, cols // 2), dtype=np.uint8).tobytes())
        tensors[name[:-7] + ".scale"] = ("F8_E8M0", (rows, cols // 32),
                                         rng.integers(exp - 2, exp + 1, size=(rows, cols // 32), dtype=np.uint8).tobytes())

    b16("embed.weight", (V, D), 1.0)
    b16("head.weight", (V, D), 0.02)
    b16("norm.weight", (D,), 0.05, 1.0)
    f32("hc_head_fn", (hc, hc * D), 0.01)
    f32("hc_head_base", (hc,), 0.1)
    f32("hc_head_scale", (1,), 0.1)
    def layer(p, m):
        for n in ("attn_norm", "ffn_norm"):
            b16(p + n + ".weight", (D,), 0.05, 1.0)
        for n in ("attn", "ffn"):
            f32(p + "hc_%s_fn" % n, ((2 + hc) * hc, hc * D), 0.01)
            f32(p + "hc_%s_base" % n, ((2 + hc) * hc,), 0.1)
            f32(p + "hc_%s_scale" % n, (3,), 0.1)
        fp8(p + "attn.wq_a.weight", (q_lo, D))
        b16(p + "attn.q_norm.weight", (q_lo,), 0.05, 1.0)
        fp8(p + "attn.wq_b.weight", (H * d, q_lo))
        fp8(p + "attn.wkv.weight", (d, D))
        b16(p + "attn.kv_norm.weight", (d,), 0.05, 1.0)
        fp8(p + "attn.wo_a.weight", (G * Ro, H * d // G))
        fp8(p + "attn.wo_b.weight", (D, G * Ro))
        f32(p + "attn.attn_sink", (H,), 1.0)
        c = p + "attn.compressor."
        w = 2 * d if m == 4 else d  # CSA overlaps two blocks (2 slots of width d); HCA does not
        b16(c + "wkv.weight", (w, D), 0.02)
        b16(c + "wgate.weight", (w, D), 0.02)
        f32(c + "ape", (m, w), 0.1)
        b16(c + "norm.weight", (d,), 0.05, 1.0)
        if m != 4:
            return  # HCA: every visible compressed row, no indexer
        fp8(p + "attn.indexer.wq_b.weight", (hI * dI, q_lo))
        b16(p + "attn.indexer.weights_proj.weight", (hI, D), 0.02)
        c = p + "attn.indexer.compressor."
        b16(c + "wkv.weight", (2 * dI, D), 0.02)
        b16(c + "wgate.weight", (2 * dI, D), 0.02)
        f32(c + "ape", (m, 2 * dI), 0.1)
        b16(c + "norm.weight", (dI,), 0.05, 1.0)
        moe(p)

    def moe(p):
        b16(p + "ffn.gate.weight", (E, D), 0.02)
        f32(p + "ffn.gate.bias", (E,), 0.01)
        for e in range(E):
            fp4(p + "ffn.experts.%d.w1.weight" % e, (F, D))
            fp4(p + "ffn.experts.%d.w3.weight" % e, (F, D))
            fp4(p + "ffn.experts.%d.w2.weight" % e, (D, F))
        fp8(p + "ffn.shared_experts.w1.weight", (F, D))
        fp8(p + "ffn.shared_experts.w3.weight", (F, D))
        fp8(p + "ffn.shared_experts.w2.weight", (D, F))

    layer("layers.0.", m)
    if args.layers == 2:
        layer("layers.1.", 128)
        moe("layers.1.")

    os.makedirs(args.outdir, exist_ok=True)
    header, offset = {}, 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(args.outdir, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, (_, _, data) in tensors.items():
            f.write(data)
    cfg = {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "vocab_size": V,
        "bos_token_id": 0, "eos_token_id": 1, "hidden_size": D, "num_hidden_layers": args.layers,
        "compress_ratios": [m, 128, 0][:args.layers] + [0], "num_nextn_predict_layers": 1, "num_attention_heads": H,
        "num_key_value_heads": 1, "head_dim": d, "qk_rope_head_dim": r, "q_lora_rank": q_lo,
        "o_groups": G, "o_lora_rank": Ro, "sliding_window": 128, "index_n_heads": hI,
        "index_head_dim": dI, "index_topk": 512, "n_routed_experts": E, "num_experts_per_tok": kE,
        "n_shared_experts": 1, "moe_intermediate_size": F, "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc", "norm_topk_prob": True, "routed_scaling_factor": 1.5,
        "swiglu_limit": 10.0, "num_hash_layers": 0, "hc_mult": hc, "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6, "rms_norm_eps": 1e-6, "rope_theta": 10000, "compress_rope_theta": 160000,
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1},
        "max_position_embeddings": 1048576, "expert_dtype": "fp4", "tie_word_embeddings": False,
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
    }
    with open(os.path.join(args.outdir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    print("wrote %s: %.2f GB of tensors" % (args.outdir, offset / 1e9))


if __name__ == "__main__":
    main()
