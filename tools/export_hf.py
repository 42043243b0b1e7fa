#!/usr/bin/env python3
"""Run transformers' DeepseekV4ForCausalLM on one prompt with forward hooks and write what the
hooks see as torch.save files in the sglang dumper's layout, for `sparsetrace import hf DIR`.

Each file is OUT/step=0___rank=0___dump_index=K___name=NAME___recompute_status=disabled
[___layer_id=L].pt holding {"value": tensor, "meta": {...}}, as sglang's dumper writes them
(python/sglang/srt/debug_utils/dumper.py): module hooks are named the way its non-intrusive mode
names them (non_intrusive__<module path>.inputs.N / .output[.N]); values no module returns (the
indexer query before any patch, the folded per-head weights, the scores after the indexer's
visibility mask) carry short names of their own. Which NAME is which sparsetrace tap, in which
layout, is said once, in schemas/import/hf.map; the importer reads that table, not this file.
Also written: OUT/export.json (versions, prompt, patch, positions, the files).

Batch 1. Tensors keep the module's layout ([B, S, ...] batch first, the top-k as transformers
returns it: sorted by score, -1 where nothing is visible); the importer aligns them.
--positions A:B keeps token rows A..B-1 of every per-token tensor (meta positions_kept); the
compressed rows (compressor output, indexer keys) are always whole.

--rotate-q plants the bug of the reports: the indexer query (only) is rotated with the
orthonormal Sylvester-order Walsh-Hadamard matrix (1/sqrt(d) scaled, the same transform as the
engine's `rotate` setting) just before scoring, the key is left alone. indexer_q is the query
before the rotation (the engine's indexer.q tap), scorer.inputs.0 the one scored (q_used).

Usage: python3 tools/export_hf.py --model DIR --out DIR (--prompt-tokens FILE.json | --prompt-len N
       [--seed S]) [--rotate-q] [--rotate-q-layers L,L] [--positions all|A:B] [--device cpu]
       [--dtype float32|bfloat16] [--skip GLOB,...]
Needs torch and transformers >= 5.17 (DeepseekV4ForCausalLM).
"""
import argparse
import fnmatch
import json
import os
import sys

import torch
import transformers
from transformers import DeepseekV4ForCausalLM

PREFIX = "non_intrusive__"
SCORER_Q = "self_attn.compressor.indexer.scorer.inputs.0"
SCORER_K = "self_attn.compressor.indexer.scorer.inputs.1"
KEPT = {"indexer_weights", "indexer_scores"}


def parse_positions(text, n_tokens):
    """'all' -> None; 'A:B' -> (A, B) checked against the prompt length."""
    if text in (None, "", "all"):
        return None
    a, sep, b = text.partition(":")
    if not sep:
        raise SystemExit(f"export_hf: --positions {text!r}: expected all or A:B")
    a = int(a) if a else 0
    b = int(b) if b else n_tokens
    if not 0 <= a < b <= n_tokens:
        raise SystemExit(f"export_hf: --positions {text!r}: needs 0 <= A < B <= {n_tokens}")
    return (a, b)


def hadamard(n, device):
    """Orthonormal Sylvester-order Walsh-Hadamard matrix [n, n] (symmetric), n a power of two."""
    if n < 1 or n & (n - 1):
        raise SystemExit(f"export_hf: --rotate-q needs a power-of-two indexer head dim, got {n}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / n ** 0.5).to(device)


class Dumper:
    """Writes one torch.save file per value in the sglang dumper's naming and keeps a list."""

    def __init__(self, outdir, static_meta, rows, skip):
        self.outdir, self.static_meta, self.rows, self.skip = outdir, static_meta, rows, skip
        self.index = 0
        self.files = []
        self.kept = {}  # (name, layer) -> value, for the self-check
        self.checks = {}

    def dump(self, name, value, layer_id=None, token_axis=None):
        """value: a tensor (or a list of str); token_axis: its token axis, None for row tensors."""
        if any(fnmatch.fnmatchcase(name, g) for g in self.skip):
            return
        meta_extra = {}
        if isinstance(value, torch.Tensor):
            value = value.detach().to("cpu")
            if token_axis is not None:
                meta_extra["token_axis"] = token_axis
                if self.rows is not None:
                    a, b = self.rows
                    value = value.narrow(token_axis, a, b - a)
                    meta_extra["positions_kept"] = [a, b]
            # A fresh contiguous copy: torch.save writes a view's whole storage.
            value = value.clone(memory_format=torch.contiguous_format)
        self.index += 1
        tags = {"step": 0, "rank": 0, "dump_index": self.index, "name": name,
                "recompute_status": "disabled"}
        if layer_id is not None:
            tags["layer_id"] = layer_id
        filename = "___".join(f"{k}={v}" for k, v in tags.items()) + ".pt"
        meta = dict(tags, **self.static_meta, **meta_extra)
        torch.save({"value": value, "meta": meta}, os.path.join(self.outdir, filename))
        if name in KEPT:
            self.kept[(name, layer_id)] = value
        entry = {"file": filename, "name": name, "layer_id": layer_id}
        if isinstance(value, torch.Tensor):
            entry.update(dtype=str(value.dtype).replace("torch.", ""), shape=list(value.shape))
        self.files.append(entry)


def first_arg(args, kwargs, index, key):
    if len(args) > index:
        return args[index]
    if key in kwargs:
        return kwargs[key]
    raise RuntimeError(f"export_hf: hooked call has no argument {index} ({key}): transformers changed")


def install_hooks(model, dumper, rotate_layers):
    """Registers the hooks; returns their handles. rotate_layers: layers whose query is rotated."""
    handles = []
    cfg = model.config
    for i, layer in enumerate(model.model.layers):
        base = f"{PREFIX}model.layers.{i}"

        def layer_in(mod, args, kwargs, i=i, base=base):
            dumper.dump(f"{base}.inputs.0", first_arg(args, kwargs, 0, "hidden_states"), i, 1)

        def layer_out(mod, args, kwargs, out, i=i, base=base):
            dumper.dump(f"{base}.output", out[0] if isinstance(out, tuple) else out, i, 1)

        handles.append(layer.register_forward_pre_hook(layer_in, with_kwargs=True))
        handles.append(layer.register_forward_hook(layer_out, with_kwargs=True))

        attn = layer.self_attn

        def attn_in(mod, args, kwargs, i=i, base=base):
            dumper.dump(f"{base}.self_attn.inputs.0", first_arg(args, kwargs, 0, "hidden_states"), i, 1)

        def attn_out(mod, args, kwargs, out, i=i, base=base):
            dumper.dump(f"{base}.self_attn.output.0", out[0], i, 1)

        def q_a_norm_out(mod, args, out, i=i, base=base):
            dumper.dump(f"{base}.self_attn.q_a_norm.output", out, i, 1)

        handles.append(attn.register_forward_pre_hook(attn_in, with_kwargs=True))
        handles.append(attn.register_forward_hook(attn_out, with_kwargs=True))
        handles.append(attn.q_a_norm.register_forward_hook(q_a_norm_out))

        comp = attn.compressor
        if comp is not None:
            def comp_out(mod, args, out, i=i, base=base):
                dumper.dump(f"{base}.self_attn.compressor.output.0", out[0], i, None)

            handles.append(comp.register_forward_hook(comp_out))

        indexer = getattr(comp, "indexer", None) if comp is not None else None
        if indexer is not None:
            handles += hook_indexer(indexer, i, f"{base}.self_attn.compressor.indexer", dumper,
                                    i in rotate_layers, cfg)

        mlp = layer.mlp

        def gate_out(mod, args, out, i=i, base=base):
            dumper.dump(f"{base}.mlp.gate.output.2", out[2], i, 0)

        def mlp_out(mod, args, out, i=i, base=base):
            dumper.dump(f"{base}.mlp.output", out, i, 1)

        handles.append(mlp.gate.register_forward_hook(gate_out))
        handles.append(mlp.register_forward_hook(mlp_out))
    return handles


def hook_indexer(indexer, i, base, dumper, rotate, cfg):
    """The indexer's hooks, in the order they must run on the scorer: capture, patch, capture."""
    handles = []
    state = {}
    scorer = getattr(indexer, "scorer", None)
    if scorer is None:
        raise SystemExit(f"export_hf: layer {i}: the indexer has no .scorer module (transformers "
                         f"{transformers.__version__}); this exporter was written against 5.17")
    weights_proj = getattr(scorer, "weights_proj", None) or getattr(indexer, "weights_proj", None)
    compress_rate = indexer.compress_rate
    softmax_scale = getattr(scorer, "softmax_scale", cfg.index_head_dim ** -0.5)
    weights_scaling = getattr(scorer, "weights_scaling", cfg.index_n_heads ** -0.5)

    def indexer_in(mod, args, kwargs):
        state["position_ids"] = first_arg(args, kwargs, 2, "position_ids")

    def indexer_out(mod, args, kwargs, out):
        dumper.dump(f"{base}.output", out, i, 1)

    def scorer_seen(mod, args, kwargs):
        # After RoPE, before any rotation: the engine's indexer.q / indexer.k.
        dumper.dump("indexer_q", first_arg(args, kwargs, 0, "q"), i, 1)
        dumper.dump("indexer_k", first_arg(args, kwargs, 1, "compressed_kv"), i, None)

    def scorer_patch(mod, args, kwargs):
        q = first_arg(args, kwargs, 0, "q")
        h = hadamard(q.shape[-1], q.device)
        rotated = (q.double() @ h).to(q.dtype)
        if len(args) > 0:
            return (rotated,) + tuple(args[1:]), kwargs
        return args, dict(kwargs, q=rotated)

    def scorer_used(mod, args, kwargs):
        q, k = first_arg(args, kwargs, 0, "q"), first_arg(args, kwargs, 1, "compressed_kv")
        dumper.dump(f"{base}.scorer.inputs.0", q, i, 1)
        dumper.dump(f"{base}.scorer.inputs.1", k, i, None)
        state["scored"] = (q.detach(), k.detach())

    def scorer_out(mod, args, kwargs, scores):
        # The mask DeepseekV4Indexer.forward applies next: row j is visible from (j+1)*m - 1.
        pos = state["position_ids"].to(scores.device)
        visible = (pos + 1) // compress_rate  # [B, S]
        rows = torch.arange(scores.shape[-1], device=scores.device)
        masked = scores.masked_fill(rows.view(1, 1, -1) >= visible.unsqueeze(-1), float("-inf"))
        dumper.dump("indexer_scores", masked, i, 1)
        # Self-check of the folded weights: sum_h w_h relu(q_h . k) in float64 from what was
        # dumped must give the scores transformers computed (at the visible rows).
        try:
            self_check(state.pop("scored"), i)
        except Exception as e:  # a check, never the reason an export fails
            dumper.checks[f"layer {i} self-check failed"] = repr(e)

    def self_check(scored, i):
        q, k = scored
        w = dumper.kept.get(("indexer_weights", i))
        got = dumper.kept.get(("indexer_scores", i))
        if w is not None and got is not None:
            if dumper.rows is not None:
                q = q.narrow(1, dumper.rows[0], dumper.rows[1] - dumper.rows[0])
            dots = torch.einsum("bshd,brd->bshr", q.double().cpu(), k.double().cpu()).relu()
            mine = (dots * w.double().unsqueeze(-1)).sum(dim=2)
            finite = torch.isfinite(got)
            err = float((mine[finite] - got[finite].double()).abs().max()) if finite.any() else 0.0
            scale = float(got[finite].double().abs().max()) if finite.any() else 0.0
            dumper.checks[f"layer {i} scores from dumped q_used, k_used, weights: max abs diff"] = err
            dumper.checks[f"layer {i} scores: max abs"] = scale

    def weights_out(mod, args, out):
        dumper.dump("indexer_weights", out.float() * weights_scaling * softmax_scale, i, 1)

    handles.append(indexer.register_forward_pre_hook(indexer_in, with_kwargs=True))
    handles.append(indexer.register_forward_hook(indexer_out, with_kwargs=True))
    handles.append(scorer.register_forward_pre_hook(scorer_seen, with_kwargs=True))
    if rotate:
        handles.append(scorer.register_forward_pre_hook(scorer_patch, with_kwargs=True))
    handles.append(scorer.register_forward_pre_hook(scorer_used, with_kwargs=True))
    handles.append(scorer.register_forward_hook(scorer_out, with_kwargs=True))
    if weights_proj is not None:
        handles.append(weights_proj.register_forward_hook(weights_out))
    else:
        dumper.checks[f"layer {i} warning"] = "no weights_proj found: indexer_weights not written"
    return handles


def load_prompt(args, vocab_size):
    if args.prompt_tokens:
        with open(args.prompt_tokens) as f:
            ids = json.load(f)
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
            raise SystemExit(f"export_hf: {args.prompt_tokens}: expected a JSON array of token ids")
    else:
        gen = torch.Generator().manual_seed(args.seed)
        ids = torch.randint(0, vocab_size, (args.prompt_len,), generator=gen).tolist()
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise SystemExit(f"export_hf: token id {bad[0]} outside the vocabulary (size {vocab_size})")
    return ids


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="checkpoint directory (save_pretrained layout)")
    ap.add_argument("--out", required=True, help="directory for the .pt files (created)")
    ap.add_argument("--prompt-tokens", help="JSON array of token ids")
    ap.add_argument("--prompt-len", type=int, default=192, help="random prompt length (no --prompt-tokens)")
    ap.add_argument("--seed", type=int, default=4321, help="seed of the random prompt")
    ap.add_argument("--rotate-q", action="store_true", help="plant the bug: Hadamard on the indexer query only")
    ap.add_argument("--rotate-q-layers", help="comma-separated layers to patch (default: every CSA layer)")
    ap.add_argument("--positions", default="all", help="token rows kept: all or A:B (half-open)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--skip", default="", help="comma-separated globs of dump names not written")
    args = ap.parse_args()

    torch.use_deterministic_algorithms(True)
    dtype = getattr(torch, args.dtype)
    model = DeepseekV4ForCausalLM.from_pretrained(args.model, dtype=dtype).to(args.device).eval()
    cfg = model.config
    ids = load_prompt(args, cfg.vocab_size)
    rows = parse_positions(args.positions, len(ids))

    csa = [i for i, t in enumerate(cfg.layer_types) if t == "compressed_sparse_attention"]
    rotate_layers = set()
    if args.rotate_q:
        rotate_layers = set(csa)
        if args.rotate_q_layers:
            rotate_layers = {int(x) for x in args.rotate_q_layers.split(",") if x.strip()}
            if not rotate_layers <= set(csa):
                raise SystemExit(f"export_hf: --rotate-q-layers: CSA layers are {csa}")

    os.makedirs(args.out, exist_ok=True)
    stale = [f for f in os.listdir(args.out) if f.endswith(".pt")]
    if stale:
        raise SystemExit(f"export_hf: {args.out} already holds {len(stale)} .pt files; use an empty directory")
    patch = "rotate=q" if rotate_layers else "none"
    static_meta = {
        "source_engine": "transformers", "transformers_version": str(transformers.__version__),
        "torch_version": str(torch.__version__), "model_class": type(model).__name__,
        "model": os.path.basename(os.path.normpath(args.model)), "dtype": args.dtype, "device": args.device,
        "patch": patch, "patch_layers": sorted(rotate_layers), "world_size": 1,
    }
    dumper = Dumper(args.out, static_meta, rows, [g for g in args.skip.split(",") if g])

    input_ids = torch.tensor([ids], dtype=torch.long, device=args.device)
    positions = torch.arange(len(ids), dtype=torch.long)
    # The dumper's core fields, as sglang's ForwardBatch gives them: one request here.
    dumper.dump("input_ids", input_ids[0])
    dumper.dump("positions", positions)
    dumper.dump("seq_lens", torch.tensor([len(ids)], dtype=torch.long))
    dumper.dump("rids", ["export_hf-0"])

    handles = install_hooks(model, dumper, rotate_layers)
    with torch.no_grad():
        out = model(input_ids=input_ids, use_cache=False)
    for h in handles:
        h.remove()
    dumper.dump("logits", out.logits, None, 1)

    info = dict(static_meta, format="sglang-dumper", exporter="tools/export_hf.py",
                prompt_tokens=ids, n_prompt=len(ids),
                positions=args.positions, positions_kept=list(rows) if rows else None,
                hadamard="orthonormal Sylvester-order Walsh-Hadamard on the indexer head dim",
                layer_types=list(cfg.layer_types), csa_layers=csa, self_checks=dumper.checks,
                files=dumper.files)
    with open(os.path.join(args.out, "export.json"), "w") as f:
        json.dump(info, f, indent=1)
    total = sum(os.path.getsize(os.path.join(args.out, e["file"])) for e in dumper.files)
    print(f"export_hf: {len(dumper.files)} files, {total} bytes in {args.out} (patch {patch})")


if __name__ == "__main__":
    sys.exit(main())
