#!/usr/bin/env python3
"""Interpolate two needle model releases of one lineage, weight by weight, into a third.

    needle_soup.py A B DEST [--alpha 0.5] [--alpha-for GLOB=ALPHA ...]

DEST's weights are (1 - alpha) * A + alpha * B: both releases are decoded exactly
(convert_release.py to-hf, float32), every floating tensor is mixed in float64, and DEST is
encoded again in the release format (convert_release.py to-release: FP8 and FP4 blocks and their
power-of-two scales found afresh; every element within half a step of its block's grid, which
to-release checks). Integer tensors (hash routing's tid2eid) must be equal in A and B.

What it is for: a fine-tune of the release learns what its new data asks and loses some of what
the release did (bench/needle-train-results.md, 2026-12-05, sixth session: the held-out wording
learned, long values copied worse). The midpoint of the release and its fine-tune, the two
being one basin apart, often keeps both (weight-space ensembling of a model and its fine-tune),
but not always: a mix can lose what both ends have (line L's midpoint lost the ticket and url
lines that the release and the fine-tune both copy, where alpha 0.75 kept them; fifteenth
session), so more than one alpha is worth judging. tools/needle_adopt.py says whether a mix
replaces the release.

--alpha-for GLOB=ALPHA gives the tensors whose transformers-dialect names match GLOB (fnmatch, e.g.
'*.attn.indexer.*': every layer's lightning indexer, its compressor included) their own share;
the first GLOB that matches a tensor decides, the others take --alpha. What it is for: line L's
copying with the release's indexer, whose choice of rows is what the demo's fault takes away
(sixteenth session).

A and B must share the architecture (config.json, up to the fields the lineage changes) and the
tokenizer. DEST gets B's config, tokenizer and side files, and B's training/log.jsonl with one
{"event": "soup"} line appended (A, B, alpha, and the sha256 of both weights files), so the
lineage's steps go on from B's and the mix is on record. Only python3 and numpy.
tests/test_needle_soup.sh holds it to the releases' own values at alpha 0 and 1 and to the
exact midpoint, within the grid, at 0.5."""
import argparse
import fnmatch
import json
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import convert_release as cr  # noqa: E402
import needle_engine_batch as neb  # noqa: E402
from needle_adopt import digest  # noqa: E402  (sha256 of a file's bytes)

ARCH_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "compress_ratios",
               "index_topk", "n_routed_experts", "num_hash_layers", "expert_dtype")


def check_pair(a, b):
    """A SystemExit naming what differs, when A and B cannot be mixed."""
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        for d in (a, b):
            if not os.path.isfile(os.path.join(d, name)):
                sys.exit(f"needle_soup: {d}: no {name} (not a release)")
    if neb.tokenizer_bytes(a) != neb.tokenizer_bytes(b):
        sys.exit("needle_soup: A and B have different tokenizer.json")
    ca, cb = cr.load_json(os.path.join(a, "config.json")), cr.load_json(os.path.join(b, "config.json"))
    differ = [f for f in ARCH_FIELDS if ca.get(f) != cb.get(f)]
    if differ:
        sys.exit(f"needle_soup: A and B differ in {', '.join(f'{f} ({ca.get(f)} / {cb.get(f)})' for f in differ)}")


def share(name, alpha, alpha_for=()):
    """B's share of tensor NAME: that of the first (glob, alpha) in alpha_for matching it, else alpha."""
    return next((a for glob, a in alpha_for if fnmatch.fnmatchcase(name, glob)), alpha)


def mix(hf_a, hf_b, out, alpha, alpha_for=()):
    """The transformers-dialect checkpoints hf_a and hf_b (float32) mixed into out/model.safetensors,
    each tensor at its share (share())."""
    ta, tb = cr.open_checkpoint(hf_a), cr.open_checkpoint(hf_b)
    if set(ta) != set(tb):
        sys.exit(f"needle_soup: the tensors differ: {sorted(set(ta) ^ set(tb))[:6]}")
    unmatched = [glob for glob, _ in alpha_for if not any(fnmatch.fnmatchcase(n, glob) for n in ta)]
    if unmatched:
        sys.exit(f"needle_soup: --alpha-for {', '.join(unmatched)}: matches no tensor (names as transformers spells "
                 "them, e.g. model.layers.5.attn.indexer.wq_b.weight)")
    entries = []
    for name in sorted(ta, key=cr.natural_key):
        x, y = ta[name], tb[name]
        if (x.dtype, x.shape) != (y.dtype, y.shape):
            sys.exit(f"needle_soup: tensor {name}: {x.dtype} {list(x.shape)} in A, {y.dtype} {list(y.shape)} in B")
        if x.dtype == "F32":  # every floating tensor, decoded --dtype float32
            t = share(name, alpha, alpha_for)
            v = ((1 - t) * x.values() + t * y.values()).astype("<f4")
            entries.append((name, "F32", x.shape, lambda v=v: v.tobytes()))
        else:
            if not np.array_equal(x.raw(), y.raw()):
                sys.exit(f"needle_soup: integer tensor {name} differs between A and B: not one lineage")
            entries.append((name, x.dtype, x.shape, lambda x=x: x.raw().tobytes()))
    os.makedirs(out, exist_ok=True)
    cr.write_safetensors(os.path.join(out, "model.safetensors"), entries)
    for f in os.listdir(hf_b):
        if f != "model.safetensors":
            shutil.copy(os.path.join(hf_b, f), out)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a"), ap.add_argument("b"), ap.add_argument("dest")
    ap.add_argument("--alpha", type=float, default=0.5, help="B's share, in [0, 1] (default 0.5)")
    ap.add_argument("--alpha-for", action="append", default=[], metavar="GLOB=ALPHA",
                    help="B's share of the tensors matching GLOB (transformers-dialect names); repeatable")
    args = ap.parse_args(argv)
    if not 0 <= args.alpha <= 1:
        ap.error(f"--alpha {args.alpha}: want a share in [0, 1]")
    alpha_for = []
    for spec in args.alpha_for:
        glob, _, a = spec.rpartition("=")
        try:
            a = float(a)
        except ValueError:
            a = None
        if not glob or a is None or not 0 <= a <= 1:
            ap.error(f"--alpha-for {spec}: want GLOB=ALPHA with ALPHA in [0, 1]")
        alpha_for.append((glob, a))
    if os.path.exists(args.dest):
        sys.exit(f"needle_soup: {args.dest} exists; give a new directory")
    check_pair(args.a, args.b)
    with tempfile.TemporaryDirectory() as work:
        hf = {}
        for name, d in (("a", args.a), ("b", args.b)):
            hf[name] = os.path.join(work, name)
            if cr.main(["to-hf", d, hf[name], "--dtype", "float32"]):
                sys.exit(f"needle_soup: {d}: could not be decoded")
        mixed = os.path.join(work, "mixed")
        mix(hf["a"], hf["b"], mixed, args.alpha, alpha_for)
        tmp = args.dest + ".part"
        shutil.rmtree(tmp, ignore_errors=True)
        expert = cr.load_json(os.path.join(args.b, "config.json")).get("expert_dtype") or "fp4"
        if cr.main(["to-release", mixed, tmp, "--expert-dtype", expert]):
            sys.exit("needle_soup: the mix could not be encoded")
    for f in os.listdir(args.b):  # B's side files the conversion does not write
        src = os.path.join(args.b, f)
        if os.path.isfile(src) and not os.path.exists(os.path.join(tmp, f)) and f != "README.md":
            shutil.copy(src, tmp)
    os.makedirs(os.path.join(tmp, "training"), exist_ok=True)
    for f in ("log.jsonl", "tokenizer_info.json"):
        src = os.path.join(args.b, "training", f)
        if os.path.isfile(src):
            shutil.copy(src, os.path.join(tmp, "training", f))
    with open(os.path.join(tmp, "training", "log.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps({"event": "soup", "a": os.path.normpath(args.a), "b": os.path.normpath(args.b),
                            "alpha": args.alpha, **({"alpha_for": dict(alpha_for)} if alpha_for else {}),
                            "a_sha256": digest([os.path.join(args.a, "model.safetensors")]),
                            "b_sha256": digest([os.path.join(args.b, "model.safetensors")])}) + "\n")
    os.replace(tmp, args.dest)
    print(f"needle_soup: {args.dest}: (1 - {args.alpha}) x {args.a} + {args.alpha} x {args.b}"
          + "".join(f"; {g}: {a}" for g, a in alpha_for))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
