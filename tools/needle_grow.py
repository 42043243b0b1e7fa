#!/usr/bin/env python3
"""Grow a needle model release by decoder layers that start as the identity.

    needle_grow.py SRC_RELEASE DST_RELEASE --after L[,L...] [--comb-diag B] [--new-layers FILE]
    needle_grow.py --pack GROWN_RELEASE FILE

Each layer L named in --after gets a copy inserted right after it (block expansion): the copy
keeps all of L's weights (its indexer, compressors, queries and keys, experts, mHC pre and post
mixes) except what would make it change the residual streams:

  outputs   the attention's wo_b, every routed expert's w2 and the shared expert's w2 are zero,
            so both sub-layers return exactly 0 (FP8 and FP4 code 0 is +0 at any scale);
  comb      the mHC residual mix of both sub-layers is the identity: the comb rows of
            hc_{attn,ffn}_fn (8..23) are zero and hc_{attn,ffn}_base[8 + 4a + b] = B when a == b,
            else 0. Sinkhorn of softmax(B*I) + eps is I to within 4.3e-6 at B = 16 (SPEC §2.2:
            eps 1e-6 keeps it off exact), so each new sub-layer moves the fp32 residual streams
            by a few millionths of their size.

The grown model computes what the source does to that precision (tests/test_needle_grow.sh holds
the engine to it: every greedy answer the same, the logits within 1e-4 of the largest; measured
1.6e-5) and has room to learn more: a fine-tune trains the new layers
(train_needle.py stage --train-layers) while the source's stay as they were, or everything.
A copy's gradients start at its zeroed outputs (wo_b, w2), as a zero-initialised residual branch
does; its attention and indexer already read the rows its source reads.

Writes the release format the source is in (SPEC-dsv4 §4, §5): config.json with the new
num_hidden_layers and compress_ratios, hf_config.json with layer_types and mlp_layer_types,
hf_dtypes.json, the tokenizer, and training/log.jsonl with a "grown" event appended (the
lineage's steps go on). The model card (README.md) and evals/ belong to the source and are not
copied. A layer under num_hash_layers (hash routing by token id) cannot be copied.

A fine-tune that trained only the new layers leaves the source's layers as they were in value (a
release re-encodes them: a block whose largest code is small gets half the scale and twice the
codes, the same numbers). So --pack keeps just the new layers of such a release, about 4 MB of
the 18 MB, with the lineage's training log since it was grown, and --new-layers FILE grows the
source again with those layers in place of the fresh copies: the fine-tuned model again, to be
evaluated or trained further, from a file small enough to commit and carry. The file holds a
sha256 of the values of every other tensor of the fine-tune; --new-layers refuses a source whose
values differ (new layers trained on other weights, or a fine-tune that changed the old layers).

Only python3 and numpy (Debian's python3-numpy), like convert_release.py.
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import convert_release as cr  # noqa: E402

COMB_DIAG = 16.0
# per sub-layer mHC: 4 pre, 4 post, 16 comb entries (SPEC §2.2)
COMB = slice(8, 24)
ZEROED = (re.compile(r"^attn\.wo_b\.weight$"),
          re.compile(r"^ffn\.experts\.\d+\.w2\.weight$"),
          re.compile(r"^ffn\.shared_experts\.w2\.weight$"))
LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")  # a decoder layer's tensor (or an MTP block's, past them)
LAYER_TYPE = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}


class GrowError(Exception):
    pass


def identity_comb(t, name, diag):
    """hc_*_fn [24, 4D] with its comb rows zeroed, or hc_*_base [24] with its comb entries B*I."""
    if t.dtype != "F32":
        raise GrowError(f"{t.file.path}: tensor '{name}': want F32, found {t.dtype}")
    a = t.raw().copy()
    if name.endswith("_fn"):
        if a.ndim != 2 or a.shape[0] != 24:
            raise GrowError(f"{t.file.path}: tensor '{name}': want [24, 4D], found {list(a.shape)}")
        a[COMB] = 0
    else:
        if a.shape != (24,):
            raise GrowError(f"{t.file.path}: tensor '{name}': want [24], found {list(a.shape)}")
        a[COMB] = (np.eye(4, dtype=np.float32) * np.float32(diag)).reshape(16)
    return a.tobytes()


def plan_layers(n_layers, after, n_hash):
    """[(new index, source index, is_copy)] for a model of n_layers grown after the listed ones."""
    for L in after:
        if not 0 <= L < n_layers:
            raise GrowError(f"--after {L}: the model has layers 0..{n_layers - 1}")
        if L < n_hash:
            raise GrowError(f"--after {L}: layer {L} routes by token hash (num_hash_layers = {n_hash}); "
                            f"its copy would not be a hash layer")
    plan = []
    for i in range(n_layers):
        plan.append((len(plan), i, False))
        if i in after:
            plan.append((len(plan), i, True))
    return plan


def grown_event(release):
    """The last "grown" event of a release's training log, and the log's records after it."""
    path = os.path.join(release, "training", "log.jsonl")
    try:
        with open(path) as f:
            lines = [line for line in f if line.strip()]
    except OSError as e:
        raise GrowError(f"{path}: cannot read: {e.strerror}") from None
    recs = []
    for i, line in enumerate(lines):
        try:
            recs.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise GrowError(f"{path}: line {i + 1}: {e.msg}") from None
    at = [i for i, r in enumerate(recs) if isinstance(r, dict) and r.get("event") == "grown"]
    if not at:
        raise GrowError(f"{path}: no \"grown\" event: {release} was not made by needle_grow")
    return recs[at[-1]], recs[at[-1] + 1:]


def values_digest(tensors, names):
    """sha256 over the values of a release's tensors (FP8 and FP4 dequantised with their scales,
    so a re-encoding of the same numbers hashes the same): names maps each name hashed (in order)
    to the name it has in tensors."""
    h = hashlib.sha256()
    for name, stored in names:
        v, how = cr.release_values(tensors, stored, cr.FP8_BLOCK)
        h.update(name.encode() + b"\0" + how.encode() + b"\0")
        h.update(np.ascontiguousarray(v if how == "int" else np.asarray(v, dtype=np.float64)).tobytes())
    return h.hexdigest()


def layer_of(name):
    """The layer number of a tensor stored as layers.N.*, else None."""
    m = LAYER.match(name)
    return int(m.group(1)) if m else None


def base_names(names, new):
    """The tensors a fine-tune of the new layers alone leaves as they were (scales are in their
    weights' values), in a fixed order."""
    keep = [n for n in names if not n.endswith(".scale") and layer_of(n) not in new]
    return sorted(keep, key=cr.natural_key)


def pack(grown, path):
    """The new layers of a grown (and maybe fine-tuned) release into one safetensors file, with
    the grown event and the training log after it in its metadata. Returns (layers, bytes)."""
    event, since = grown_event(grown)
    new = event.get("new_layers")
    if not isinstance(new, list) or not new or not all(isinstance(n, int) for n in new):
        raise GrowError(f"{grown}/training/log.jsonl: the grown event has no \"new_layers\" list")
    tensors = cr.open_checkpoint(grown)
    names = [n for n in tensors if layer_of(n) in new]
    for n in new:
        if not any(name.startswith(f"layers.{n}.") for name in names):
            raise GrowError(f"{grown}: no tensor of layer {n}, which its log says is new")
    entries = [(n, tensors[n].dtype, tensors[n].shape, (lambda t=tensors[n]: t.raw().tobytes()))
               for n in sorted(names, key=cr.natural_key)]
    base = values_digest(tensors, [(n, n) for n in base_names(tensors, new)])
    meta = {"needle_grow": json.dumps(event), "log_since": json.dumps(since), "base_values_sha256": base}
    return new, cr.write_safetensors(path, entries, meta)


def read_pack(path, after):
    """A --pack file's tensors, its grown event and log, checked against this growth (--after)."""
    f = cr.SafetensorsFile(path)
    meta = f.metadata or {}
    try:
        event, since = json.loads(meta["needle_grow"]), json.loads(meta["log_since"])
    except (KeyError, TypeError, json.JSONDecodeError):
        raise GrowError(f"{path}: not a needle_grow --pack file (no \"needle_grow\" and \"log_since\" "
                        f"in its metadata)") from None
    if sorted(event.get("after") or []) != sorted(set(after)):
        raise GrowError(f"{path}: its layers grew after {event.get('after')}, not after {sorted(set(after))}")
    if not isinstance(meta.get("base_values_sha256"), str):
        raise GrowError(f"{path}: no \"base_values_sha256\" in its metadata")
    return f.tensors, event, since, meta["base_values_sha256"]


def grow(src, dst, after, diag=COMB_DIAG, new_layers=None):
    rel = cr.load_json(os.path.join(src, "config.json"))
    n = rel.get("num_hidden_layers")
    ratios = rel.get("compress_ratios")
    if not isinstance(n, int) or not isinstance(ratios, list) or len(ratios) < n:
        raise GrowError(f"{src}/config.json: want num_hidden_layers and compress_ratios (one per layer, "
                        f"then one per MTP block)")
    plan = plan_layers(n, sorted(set(after)), rel.get("num_hash_layers", 0))
    tensors = cr.open_checkpoint(src)
    copies = [new for new, _, c in plan if c]
    by_layer, rest, mtp = {}, [], []
    for name in tensors:
        m = LAYER.match(name)
        if m and int(m.group(1)) < n:
            by_layer.setdefault(int(m.group(1)), []).append(m.group(2))
        elif m:
            mtp.append(name)  # an MTP block stored as layers.N, N >= num_hidden_layers: after the layers
        else:
            rest.append(name)  # embed, head, hc_head_*, norm, MTP blocks named mtp.*

    def raw_bytes(t):
        return lambda: t.raw().tobytes()

    packed, packed_event, packed_log, packed_base = ({}, None, [], None) if not new_layers else \
        read_pack(new_layers, after)
    packed_used = set()
    entries, renamed, zeroed = [], {}, []
    for name in sorted(rest, key=cr.natural_key):
        t = tensors[name]
        entries.append((name, t.dtype, t.shape, raw_bytes(t)))
        renamed[name] = name
    for new, old, is_copy in plan:
        for sub in sorted(by_layer.get(old, []), key=cr.natural_key):
            t = tensors[f"layers.{old}.{sub}"]
            out = f"layers.{new}.{sub}"
            produce = raw_bytes(t)
            if is_copy and any(r.match(sub) for r in ZEROED):
                produce = (lambda t=t: bytes(t.nbytes))
                zeroed.append(out)
            elif is_copy and re.match(r"^hc_(attn|ffn)_(fn|base)$", sub):
                produce = (lambda t=t, nm=f"layers.{old}.{sub}": identity_comb(t, nm, diag))
            if is_copy and packed:
                p = packed.get(out)
                if p is None:
                    raise GrowError(f"{new_layers}: no tensor '{out}' (layer {new} is new: every tensor of it "
                                    f"comes from the file)")
                if p.dtype != t.dtype or list(p.shape) != list(t.shape):
                    raise GrowError(f"{new_layers}: tensor '{out}': {p.dtype} {list(p.shape)}, but the "
                                    f"grown layer's is {t.dtype} {list(t.shape)}")
                produce = (lambda p=p: p.raw().tobytes())
                packed_used.add(out)
            entries.append((out, t.dtype, t.shape, produce))
            renamed[out] = f"layers.{old}.{sub}"
    grown = len(plan)
    for name in sorted(mtp, key=cr.natural_key):  # renumbered past the new layers
        m = LAYER.match(name)
        out = f"layers.{int(m.group(1)) + grown - n}.{m.group(2)}"
        t = tensors[name]
        entries.append((out, t.dtype, t.shape, raw_bytes(t)))
        renamed[out] = name
    for new, old, is_copy in plan:
        if is_copy and f"layers.{new}.attn.wo_b.weight" not in zeroed:
            raise GrowError(f"{src}: layer {old} has no attn.wo_b.weight to zero: not a release of this model")

    extra = sorted(set(packed) - packed_used, key=cr.natural_key)
    if extra:
        raise GrowError(f"{new_layers}: tensor '{extra[0]}' is not one of the new layers' "
                        f"({len(extra)} such)")
    if packed:
        names = base_names([e[0] for e in entries], copies)
        if values_digest(tensors, [(n, renamed[n]) for n in names]) != packed_base:
            raise GrowError(f"{new_layers}: its new layers were trained on other weights than {src}'s "
                            f"(the values of the layers it did not train differ)")

    os.makedirs(dst, exist_ok=True)
    size = cr.write_checkpoint(dst, entries, 0)
    grown_ratios = [ratios[old] for _, old, _ in plan] + ratios[n:]
    rel_out = dict(rel, num_hidden_layers=grown, compress_ratios=grown_ratios)
    cr.write_json(os.path.join(dst, "config.json"), rel_out)
    hf_path = os.path.join(src, "hf_config.json")
    if os.path.exists(hf_path):
        hf = cr.load_json(hf_path)
        hf["num_hidden_layers"] = grown
        for key in ("layer_types", "mlp_layer_types"):
            if isinstance(hf.get(key), list) and len(hf[key]) == n:
                hf[key] = [hf[key][old] for _, old, _ in plan]
        if hf.get("layer_types") is not None:
            want_types = [LAYER_TYPE.get(r) for r in grown_ratios[:grown]]
            if hf["layer_types"] != want_types:
                raise GrowError(f"{hf_path}: layer_types {hf['layer_types']} disagree with compress_ratios")
        cr.write_json(os.path.join(dst, "hf_config.json"), hf)
    dt_path = os.path.join(src, "hf_dtypes.json")
    if os.path.exists(dt_path):
        dts = cr.load_json(dt_path)
        out = {}
        for name in sorted(renamed, key=cr.natural_key):
            base = renamed[name]
            if base in dts:
                out[name] = dts[base]
        cr.write_json(os.path.join(dst, "hf_dtypes.json"), out)
    cr.copy_side_files(src, dst)
    log_src = os.path.join(src, "training", "log.jsonl")
    if os.path.exists(log_src):
        os.makedirs(os.path.join(dst, "training"), exist_ok=True)
        for f in os.listdir(os.path.join(src, "training")):
            shutil.copyfile(os.path.join(src, "training", f), os.path.join(dst, "training", f))
        with open(os.path.join(dst, "training", "log.jsonl"), "a") as f:
            f.write(json.dumps({"event": "grown", "from": os.path.normpath(src),
                                "after": sorted(set(after)), "layers": [n, grown], "comb_diag": diag,
                                "new_layers": copies}) + "\n")
            if packed_event:
                # the fine-tune of the new layers goes on where it was: its steps and saves
                f.write(json.dumps({"event": "new layers", "from": os.path.normpath(new_layers),
                                    "grown_from": packed_event.get("from")}) + "\n")
                for rec in packed_log:
                    f.write(json.dumps(rec) + "\n")
    return plan, size, zeroed


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="the release to grow (with --pack: a grown release)")
    ap.add_argument("dst", help="the grown release's directory (with --pack: the file to write)")
    ap.add_argument("--after", help="layers to copy, comma-separated (each copy goes right after it)")
    ap.add_argument("--new-layers", metavar="FILE", help="the new layers from FILE (written by --pack), "
                    "not fresh copies")
    ap.add_argument("--pack", action="store_true", help="write SRC's new layers (its log's grown event "
                    "names them) and its training log since it grew to the file DST")
    ap.add_argument("--comb-diag", type=float, default=COMB_DIAG,
                    help=f"the new layers' comb logits on the diagonal (default {COMB_DIAG:g})")
    args = ap.parse_args(argv)
    if args.pack:
        if args.after or args.new_layers:
            print("needle_grow: --pack takes no --after or --new-layers", file=sys.stderr)
            return 2
        try:
            new, size = pack(args.src, args.dst)
        except (GrowError, cr.ConvertError) as e:
            print(f"needle_grow: {e}", file=sys.stderr)
            return 1
        print(f"{args.dst}: layers {', '.join(map(str, new))} of {args.src}, {size} bytes")
        return 0
    if not args.after:
        print("needle_grow: --after is required (or --pack)", file=sys.stderr)
        return 2
    try:
        after = [int(x) for x in args.after.split(",")]
    except ValueError:
        print(f"needle_grow: --after wants layer numbers, comma-separated, not {args.after!r}", file=sys.stderr)
        return 2
    if os.path.abspath(args.src) == os.path.abspath(args.dst):
        print("needle_grow: DST must not be SRC", file=sys.stderr)
        return 2
    try:
        plan, size, zeroed = grow(args.src, args.dst, after, args.comb_diag, args.new_layers)
    except (GrowError, cr.ConvertError) as e:
        print(f"needle_grow: {e}", file=sys.stderr)
        return 1
    new = [new for new, _, c in plan if c]
    print(f"{args.dst}: {len(plan)} layers (new: {', '.join(map(str, new))}, copies of "
          f"{', '.join(str(old) for _, old, c in plan if c)}), {size} bytes, "
          + (f"the new layers from {args.new_layers}" if args.new_layers else
             f"{len(zeroed)} output projections zeroed"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
