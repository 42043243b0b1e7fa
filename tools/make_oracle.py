#!/usr/bin/env python3
"""Build small random-weight DeepSeek-V4 checkpoints with transformers' DeepseekV4ForCausalLM and
record what the engine must reproduce in exact mode (run on the GPU machine, transformers 5.17).

For each fixture in FIXTURES this writes OUT/<name>/:
  config.json, model.safetensors   the checkpoint, as save_pretrained writes it (HF dialect);
                                   weights are rounded to bf16 values so bf16 storage is exact
  oracle.safetensors               prompt, logits [T, V] of the prompt, per-layer residual
                                   streams / attention / MoE outputs at the positions in
                                   `positions`, every CSA layer's indexer top-k [T, k] (-1 = none),
                                   greedy continuation (cache path), RoPE inverse frequencies
  oracle.json                      versions, seeds, shapes, self-checks

Usage: python3 tools/make_oracle.py OUTDIR [fixture ...]
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

FIXTURES = {
    # SPEC-dsv4 §7 in spirit, shrunk: every layer type, hash + score routing, hc_mult 4, YaRN,
    # index_topk (32) well below the CSA rows at T = 520 (130 rows). 16 indexer heads: with few
    # heads many rows score exactly 0 (every ReLU closed) and top-k is decided by tie-breaking,
    # which no two implementations share.
    "tiny": dict(
        config=dict(
            vocab_size=264, bos_token_id=256, eos_token_id=257, hidden_size=128,
            num_hidden_layers=4, compress_ratios=[0, 4, 128, 4, 0], num_nextn_predict_layers=1,
            num_attention_heads=4, num_key_value_heads=1, head_dim=128, qk_rope_head_dim=64,
            q_lora_rank=128, o_groups=2, o_lora_rank=128, sliding_window=64, index_n_heads=16,
            index_head_dim=128, index_topk=32, n_routed_experts=4, num_experts_per_tok=2,
            n_shared_experts=1, moe_intermediate_size=128, scoring_func="sqrtsoftplus",
            norm_topk_prob=True, routed_scaling_factor=1.5, swiglu_limit=10.0, num_hash_layers=1,
            hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6, rope_theta=10000.0,
            compress_rope_theta=160000.0,
            rope_scaling={"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                          "beta_fast": 32, "beta_slow": 1},
            max_position_embeddings=1048576, tie_word_embeddings=False),
        prompt_len=520, new_tokens=12, seed=1234),
    # Dimensions no quantised kernel would accept: exact mode must still match.
    "odd": dict(
        config=dict(
            vocab_size=300, bos_token_id=0, eos_token_id=1, hidden_size=72, num_hidden_layers=5,
            layer_types=["compressed_sparse_attention", "heavily_compressed_attention",
                         "sliding_attention", "compressed_sparse_attention",
                         "heavily_compressed_attention"],
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
            mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe"],
            num_attention_heads=3, num_key_value_heads=1, head_dim=40, partial_rotary_factor=0.4,
            q_lora_rank=24, o_groups=3, o_lora_rank=20, sliding_window=16, index_n_heads=7,
            index_head_dim=24, index_topk=5, n_routed_experts=5, num_experts_per_tok=2,
            n_shared_experts=1, moe_intermediate_size=36, routed_scaling_factor=2.5,
            swiglu_limit=10.0, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
            rope_theta=10000.0, compress_rope_theta=160000.0,
            rope_parameters={
                "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.4},
                "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "factor": 16.0,
                             "original_max_position_embeddings": 65536, "beta_fast": 32.0,
                             "beta_slow": 1.0, "attention_factor": 1.0,
                             "partial_rotary_factor": 0.4}},
            max_position_embeddings=1048576, tie_word_embeddings=False),
        prompt_len=150, new_tokens=10, seed=99),
}

# Diagnostic variant: index_topk above the number of rows, so top-k selection is a no-op.
FIXTURES["tiny_allrows"] = dict(FIXTURES["tiny"], config=dict(FIXTURES["tiny"]["config"], index_topk=4096))


def bf16_values(t):
    return t.to(torch.bfloat16).to(t.dtype)


@torch.no_grad()
def randomize(model, cfg, gen):
    """Weights at a scale where every path matters (the default init leaves most at ~0)."""
    def normal(shape, std):
        return torch.randn(shape, generator=gen) * std
    for name, p in model.named_parameters():
        shape = p.shape
        if name.endswith("embed_tokens.weight"):
            p.copy_(normal(shape, 1.0))
        elif name.endswith("lm_head.weight"):
            p.copy_(normal(shape, 3.0 / shape[1] ** 0.5))
        elif p.ndim == 3:  # stacked experts [E, out, in]
            p.copy_(normal(shape, 1.0 / shape[2] ** 0.5))
        elif name.endswith(("_hc.fn", "hc_head.hc_fn")):
            p.copy_(normal(shape, 1.0 / shape[1] ** 0.5))
        elif name.endswith(("_hc.base", "hc_head.hc_base")):
            p.copy_(normal(shape, 0.5))
        elif name.endswith(("_hc.scale", "hc_head.hc_scale")):
            p.copy_(1.0 + normal(shape, 0.3))
        elif name.endswith("sinks"):
            p.copy_(normal(shape, 1.0))
        elif name.endswith("position_bias"):
            p.copy_(normal(shape, 0.5))
        elif p.ndim == 1 and "norm" in name:  # RMSNorm weights
            p.copy_(1.0 + normal(shape, 0.2))
        elif p.ndim == 2:  # every linear [out, in]
            p.copy_(normal(shape, 1.0 / shape[1] ** 0.5))
        else:
            raise RuntimeError(f"no init rule for {name} {tuple(shape)}")
        print("init", name, tuple(shape)) if os.environ.get("ORACLE_VERBOSE") else None
        p.copy_(bf16_values(p))
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.copy_(bf16_values(torch.randn(b.shape, generator=gen) * 0.1))
        elif name.endswith("tid2eid"):
            v, k = b.shape
            rows = [torch.randperm(cfg.n_routed_experts, generator=gen)[:k] for _ in range(v)]
            b.copy_(torch.stack(rows))


def capture(model, cfg):
    """Forward hooks that keep the values the engine is compared against."""
    got = {"topk": {}, "layer_out": {}, "attn_out": {}, "ffn_out": {}}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        def on_layer(mod, args, kwargs, out, i=i):
            got["layer_out"][i] = out.detach()
        hooks.append(layer.register_forward_hook(on_layer, with_kwargs=True))
        def on_attn(mod, args, kwargs, out, i=i):
            got["attn_out"][i] = out[0].detach()
        hooks.append(layer.self_attn.register_forward_hook(on_attn, with_kwargs=True))
        def on_mlp(mod, args, kwargs, out, i=i):
            got["ffn_out"][i] = out.detach()
        hooks.append(layer.mlp.register_forward_hook(on_mlp, with_kwargs=True))
        comp = layer.self_attn.compressor
        if comp is not None and hasattr(comp, "indexer"):
            def on_indexer(mod, args, kwargs, out, i=i):
                got["topk"][i] = out.detach()
            hooks.append(comp.indexer.register_forward_hook(on_indexer, with_kwargs=True))
    return got, hooks


def build(name, spec, outdir):
    gen = torch.Generator().manual_seed(spec["seed"])
    cfg = DeepseekV4Config(**spec["config"])
    torch.manual_seed(spec["seed"])
    model = DeepseekV4ForCausalLM(cfg).float().eval()
    randomize(model, cfg, gen)
    # Big matrices stored as bf16 (exact: values are bf16); mHC, sinks, ape, biases stay fp32,
    # as in the released checkpoints.
    for pname, p in model.named_parameters():
        if p.ndim >= 2 and "_hc" not in pname and "hc_head" not in pname:
            p.data = p.data.to(torch.bfloat16)
    d = os.path.join(outdir, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)

    # The oracle: reload as saved, compute in fp32 on the CPU (deterministic, exact arithmetic).
    model = DeepseekV4ForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    T = spec["prompt_len"]
    prompt = torch.randint(0, cfg.vocab_size, (1, T), generator=gen)
    got, hooks = capture(model, cfg)
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=False)
    for h in hooks:
        h.remove()
    logits = out.logits[0].float()

    # Greedy continuation by repeated full forwards (no cache): the exact-arithmetic answer.
    seq = prompt
    with torch.no_grad():
        for _ in range(spec["new_tokens"]):
            nxt = model(input_ids=seq, use_cache=False).logits[0, -1].argmax()
            seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
        full = model(input_ids=seq[:, :-1], use_cache=False).logits[0]
    continuation = seq[0, T:]
    # transformers' own cache path (prefill, then one token at a time). Recorded for comparison:
    # where it disagrees with the no-cache forward, the no-cache forward is the reference.
    with torch.no_grad():
        g = model.generate(prompt, max_new_tokens=spec["new_tokens"], do_sample=False,
                           use_cache=True, min_new_tokens=spec["new_tokens"],
                           return_dict_in_generate=True, output_logits=True)
    cache_logits = torch.stack([x[0].float() for x in g.logits])
    cache_continuation = g.sequences[0, T:]
    cache_agrees = bool(torch.equal(cache_continuation, continuation))
    # Teacher-forced comparison on the no-cache continuation: prefill T, then decode its tokens.
    with torch.no_grad():
        out_pf = model(input_ids=seq[:, :T], use_cache=True)
        cache = out_pf.past_key_values
        steps = [out_pf.logits[0, -1]]
        for j in range(spec["new_tokens"] - 1):
            o = model(input_ids=seq[:, T + j:T + j + 1], past_key_values=cache, use_cache=True)
            cache = o.past_key_values
            steps.append(o.logits[0, -1])
    decode_max_diff = float((torch.stack(steps) - full[T - 1:]).abs().max())
    # Chunked prefill through transformers' cache, split at T//2 + 1.
    with torch.no_grad():
        s0 = T // 2 + 1
        o1 = model(input_ids=prompt[:, :s0], use_cache=True)
        o2 = model(input_ids=prompt[:, s0:], past_key_values=o1.past_key_values, use_cache=True)
    chunked_max_diff = float((o2.logits[0] - logits[s0:]).abs().max())

    positions = sorted(set(list(range(0, T, 13)) + list(range(max(0, T - 40), T))))
    pos = torch.tensor(positions)
    tensors = {
        "prompt": prompt[0].to(torch.int32),
        "logits": logits.contiguous(),
        "positions": pos.to(torch.int32),
        "greedy": continuation.to(torch.int32),
        "greedy_cache_path": cache_continuation.to(torch.int32),
        "cache_path_logits": cache_logits.contiguous(),
        "full_sequence_logits_tail": full[T - 1:].float().contiguous(),
        "rope.main_inv_freq": model.model.rotary_emb.main_inv_freq.float(),
        "rope.compress_inv_freq": model.model.rotary_emb.compress_inv_freq.float(),
    }
    for i in range(cfg.num_hidden_layers):
        tensors[f"layers.{i}.output"] = got["layer_out"][i][0][pos].float().contiguous()
        tensors[f"layers.{i}.attn.out"] = got["attn_out"][i][0][pos].float().contiguous()
        tensors[f"layers.{i}.ffn.out"] = got["ffn_out"][i][0][pos].float().contiguous()
        if i in got["topk"]:
            tensors[f"layers.{i}.indexer.topk"] = got["topk"][i][0].to(torch.int32).contiguous()
    save_file(tensors, os.path.join(d, "oracle.safetensors"))

    top2 = logits.topk(2, dim=-1).values
    meta = {
        "fixture": name, "transformers": transformers.__version__, "torch": torch.__version__,
        "seed": spec["seed"], "prompt_len": T, "new_tokens": spec["new_tokens"],
        "cache_path_greedy_matches": cache_agrees,
        "cache_path_decode_max_logit_diff": decode_max_diff,
        "cache_path_chunked_prefill_max_logit_diff": chunked_max_diff,
        "logit_std": float(logits.std()), "logit_max_abs": float(logits.abs().max()),
        "min_top1_top2_gap": float((top2[:, 0] - top2[:, 1]).min()),
        "layer_types": cfg.layer_types, "mlp_layer_types": cfg.mlp_layer_types,
        "rope_parameters": cfg.rope_parameters,
        "n_params": sum(p.numel() for p in model.parameters()),
    }
    with open(os.path.join(d, "oracle.json"), "w") as f:
        json.dump(meta, f, indent=1, default=str)
    print(json.dumps(meta, default=str))


def main():
    outdir = sys.argv[1]
    names = sys.argv[2:] or list(FIXTURES)
    torch.set_num_threads(8)
    torch.use_deterministic_algorithms(True)
    for name in names:
        build(name, FIXTURES[name], outdir)


if __name__ == "__main__":
    main()
