#!/usr/bin/env python3
"""`sparsetrace import` on dumps written here with real torch.save (Debian's python3-torch), shaped
for the tiny oracle model (tests/data/oracle/tiny), values random: every expected value is derived
in this script from the arrays it saved (numpy), never from the importer's output.

  hf        export_hf.py's layout ([B, S, ...], positions_kept, top-k sorted by score with -1):
            each tap equals the array with the batch axis dropped, at the kept positions; top-k
            rows are the sets sorted ascending with -1 after; bf16 values widen exactly; /tokens,
            the import attributes and notes; inspect shows the notes
  sglang    a flat token axis of two requests in two steps (a chunked prefill): request 1's
            rows, placed by positions, stitched into one axis; --request picks the request
  indexer   scores and top-k computed here from q, k, weights with the planted bug (the query
            alone Hadamard-rotated) and without: replay of the imported traces under the
            recorded settings and under rotate=q says which reproduces the recorded top-k;
            diff of the two traces names layer 1's indexer as the first divergence
  errors    a shape that is not the model's, a map naming no tap, no input_ids, --request past
            the requests: exit 1 and a message naming the file and tensor

Usage: import_check.py SPARSETRACE WORKDIR
"""
import json
import os
import subprocess
import sys

import h5py
import numpy as np
import torch

BIN, WORK = sys.argv[1], sys.argv[2]
SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(SRC, "tests", "data", "oracle", "tiny")
CFG = json.load(open(os.path.join(MODEL, "config.json")))
D, HC, QL, HI, DI, V, KE = (CFG["hidden_size"], CFG["hc_mult"], CFG["q_lora_rank"], CFG["index_n_heads"],
                            CFG["index_head_dim"], CFG["vocab_size"], CFG["num_experts_per_tok"])
M = CFG["compress_rates"]["compressed_sparse_attention"]
TOPK = CFG["index_topk"]
failures, checks = [], 0
rng = np.random.default_rng(11)


def check(ok, what):
    global checks
    checks += 1
    if not ok:
        failures.append(what)
        print("FAIL:", what)


def run(*args):
    p = subprocess.run([BIN, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


class Dumper:
    def __init__(self, d, meta=None):
        self.d, self.i, self.meta = d, 0, meta or {}
        os.makedirs(d, exist_ok=True)

    def dump(self, name, value, layer=None, step=0, **meta):
        self.i += 1
        tags = {"step": step, "rank": 0, "dump_index": self.i, "name": name}
        if layer is not None:
            tags["layer_id"] = layer
        fname = "___".join(f"{k}={v}" for k, v in tags.items()) + ".pt"
        torch.save({"value": value, "meta": dict(tags, **self.meta, **meta)}, os.path.join(self.d, fname))


def t(a, dtype=torch.float32):
    return torch.from_numpy(np.ascontiguousarray(a)).to(dtype)


def hadamard(n):
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def indexer_values(q, k, w, T):
    """scores [T, R] (-inf where row j is not yet visible: j >= (t+1)//m) and top-k sets."""
    dots = np.maximum(np.einsum("thd,rd->thr", q.astype(np.float64), k.astype(np.float64)), 0)
    scores = (dots * w[:, :, None]).sum(axis=1)
    R = k.shape[0]
    vis = (np.arange(T)[:, None] + 1) // M
    scores = np.where(np.arange(R)[None, :] < vis, scores, -np.inf).astype(np.float32)
    width = min(TOPK, R)
    top = np.full((T, width), -1, dtype=np.int64)
    for i in range(T):
        order = [j for j in np.argsort(-scores[i].astype(np.float64), kind="stable") if np.isfinite(scores[i, j])]
        top[i, :min(width, len(order))] = order[:width]
    return scores, top


def sets(top):
    out = np.full(top.shape, -1, dtype=np.int32)
    for i, row in enumerate(top):
        s = sorted(int(x) for x in row if x >= 0)
        out[i, :len(s)] = s
    return out


def read_tap(h5, name):
    f = h5py.File(h5, "r")
    d = f["taps"][name]
    pos = f[d.attrs["positions"]][()] if "positions" in d.attrs else np.arange(d.shape[0])
    return d[()], pos


# ------------------------------------------------------------------ hf

def hf_checks():
    T, a, b = 64, 40, 64
    kept = slice(a, b)
    d = os.path.join(WORK, "hf")
    du = Dumper(d, {"source_engine": "transformers", "transformers_version": "test", "patch": "none"})
    ids = rng.integers(0, V, T)
    du.dump("input_ids", t(ids, torch.long))
    du.dump("positions", torch.arange(T))
    du.dump("seq_lens", torch.tensor([T]))
    du.dump("rids", ["r0"])
    want = {}
    x_in = rng.standard_normal((1, T, HC, D)).astype(np.float32)
    du.dump("non_intrusive__model.layers.1.inputs.0", t(x_in[:, kept]), 1, positions_kept=[a, b])
    want["layers.1.input"] = x_in[0, kept]
    attn_x = rng.standard_normal((1, T, D)).astype(np.float32)
    bf = t(attn_x[:, kept], torch.bfloat16)  # bf16 widens exactly
    du.dump("non_intrusive__model.layers.1.self_attn.inputs.0", bf, 1, positions_kept=[a, b])
    want["layers.1.attn.x"] = bf.float().numpy()[0]
    R = T // M
    q = rng.standard_normal((1, T, HI, DI)).astype(np.float32)
    k = rng.standard_normal((1, R, DI)).astype(np.float32)
    du.dump("indexer_q", t(q[:, kept]), 1, positions_kept=[a, b])
    du.dump("indexer_k", t(k), 1)
    want["layers.1.indexer.q"] = q[0, kept]
    want["layers.1.indexer.k"] = k[0]
    top = np.stack([rng.permutation(R)[:12] for _ in range(b - a)])
    top[:, 9:] = -1
    du.dump("non_intrusive__model.layers.1.self_attn.compressor.indexer.output", t(top[None], torch.long), 1,
            positions_kept=[a, b])
    want["layers.1.indexer.topk"] = sets(top)
    logits = rng.standard_normal((1, T, V)).astype(np.float32)
    du.dump("logits", t(logits[:, kept]), positions_kept=[a, b])
    want["logits"] = logits[0, kept]
    du.dump("never_mapped_tensor", torch.zeros(3))
    h5 = os.path.join(WORK, "hf.h5")
    rc, out, err = run("import", "hf", d, "--model", MODEL, "--out", h5, "--store", os.path.join(WORK, "store"))
    check(rc == 0, f"import hf: rc {rc} {err.strip()}")
    if rc:
        return
    for name, w in want.items():
        got, pos = read_tap(h5, name)
        rows_ok = name.endswith("indexer.k") or list(pos) == list(range(a, b))
        check(rows_ok and got.shape == w.shape and np.array_equal(got, w), f"hf {name}: shape {got.shape} vs {w.shape}, positions {pos[:3]}...")
    f = h5py.File(h5, "r")
    check(list(f["tokens"][()]) == list(ids) and f["tokens"].attrs["n_prompt"] == T, "hf /tokens")
    imp = json.loads(f.attrs["import"])
    notes = json.loads(f.attrs["import_notes"])
    check(imp["format"] == "hf" and imp["source"].get("source_engine") == "transformers", f"hf import attribute {imp}")
    check(any("converted from bfloat16" in n for n in notes["taps"].get("layers.1.attn.x", [])), f"hf note bf16 {notes}")
    # --json is built by the JSON library: a trace path with quotes stays one string
    h5q = os.path.join(WORK, 'q",\"injected\":true,\"x\":\".h5')
    rc, out, err = run("import", "hf", d, "--model", MODEL, "--out", h5q, "--store", os.path.join(WORK, "store_q"), "--json")
    try:
        res = json.loads(out)
    except ValueError:
        res = {}
    check(rc == 0 and res.get("trace") == h5q and "injected" not in res and res.get("taps", 0) > 0,
          f"import --json with a quoted trace path: rc {rc} {out!r} {err.strip()}")
    check(any("as a set" in n for n in notes["taps"].get("layers.1.indexer.topk", [])), "hf note topk")
    check("never_mapped_tensor" in notes["unmapped"], "hf unmapped listed")
    rc, out, err = run("inspect", h5)
    check(rc == 0 and "imported    hf" in out and "never_mapped_tensor" in out and "converted from bfloat16" in out,
          f"inspect shows the import: {out[:2000]}")
    rc, out, err = run("query", "--store", os.path.join(WORK, "store"),
                       "SELECT b.backend || '/' || r.n_tokens || '/' || r.n_prompt FROM runs r JOIN builds b USING (build_id)")
    check(rc == 0 and f"import:hf/{T}/{T}" in out, f"indexed as a run (backend import:hf, {T} tokens): {out} {err}")


# ------------------------------------------------------------------ sglang flat axis, two steps

def sglang_checks():
    d = os.path.join(WORK, "sglang")
    du = Dumper(d, {"world_size": 1})
    lens = [5, 24]  # request 0 and request 1 (the one imported)
    total = 24
    ids = rng.integers(0, V, (2, total))
    out_all = rng.standard_normal((2, total, HC, D)).astype(np.float32)
    chunks = [(0, 16), (16, 24)]  # request 1 prefilled in two chunks; request 0 only in step 0
    for step, (c0, c1) in enumerate(chunks):
        rows_ids, rows_pos, rows_out, seq = [], [], [], []
        if step == 0:
            rows_ids += list(ids[0, :5]); rows_pos += list(range(5)); rows_out += list(out_all[0, :5]); seq.append(5)
        rows_ids += list(ids[1, c0:c1]); rows_pos += list(range(c0, c1)); rows_out += list(out_all[1, c0:c1])
        seq.append(c1 - c0)
        if step == 1:
            seq = [0] + seq  # request 0 has no rows in this step
        du.dump("input_ids", t(np.array(rows_ids), torch.long), step=step)
        du.dump("positions", t(np.array(rows_pos), torch.long), step=step)
        du.dump("seq_lens", t(np.array(seq), torch.int32), step=step)
        du.dump("non_intrusive__model.layers.0.output", t(np.array(rows_out)), 0, step=step)
    h5 = os.path.join(WORK, "sglang.h5")
    rc, out, err = run("import", "sglang-dumper", d, "--model", MODEL, "--out", h5, "--request", "1", "--store",
                       os.path.join(WORK, "store"))
    check(rc == 0, f"import sglang-dumper: rc {rc} {err.strip()}")
    if rc:
        return
    got, pos = read_tap(h5, "layers.0.output")
    check(list(pos) == list(range(24)) and np.array_equal(got, out_all[1]), f"sglang request 1 stitched: {pos}")
    f = h5py.File(h5, "r")
    check(list(f["tokens"][()]) == list(ids[1]), "sglang /tokens of request 1")
    # sglang's compact indexer-layer ids (the k-th CSA layer) through a --map with csa_layer
    d2 = os.path.join(WORK, "sglang_compact")
    du = Dumper(d2)
    n = 12
    du.dump("input_ids", t(ids[1, :n], torch.long))
    top = np.stack([rng.permutation(3)[:2] for _ in range(n)])
    du.dump("topk_of_csa_layer", t(top, torch.int32), 1)  # CSA layer 1 of the tiny model is layer 3
    mp = os.path.join(WORK, "compact.map")
    with open(mp, "w") as f:
        f.write("input_ids @tokens N\ntopk_of_csa_layer indexer.topk N,k topk,csa_layer\n")
    h5c = os.path.join(WORK, "compact.h5")
    rc, out, err = run("import", "sglang-dumper", d2, "--model", MODEL, "--out", h5c, "--map", mp)
    csa = [i for i, kind in enumerate(CFG["layer_types"]) if kind == "compressed_sparse_attention"]
    if rc == 0:
        got, pos = read_tap(h5c, f"layers.{csa[1]}.indexer.topk")
        check(np.array_equal(got, sets(top)), f"compact CSA layer 1 -> model layer {csa[1]}")
    else:
        check(False, f"import with csa_layer: {err}")
    rc, out, err = run("import", "sglang-dumper", d, "--model", MODEL, "--out", os.path.join(WORK, "s9.h5"), "--request", "9")
    check(rc == 1 and "--request 9" in err, f"--request past the requests: {err}")


# ------------------------------------------------------------------ the indexer and replay

def indexer_dump(d, q, k, w, ids, rotate):
    T = len(ids)
    du = Dumper(d, {"source_engine": "transformers", "patch": "rotate=q" if rotate else "none"})
    du.dump("input_ids", t(ids, torch.long))
    q_used = (q.astype(np.float64) @ hadamard(DI)).astype(np.float32) if rotate else q
    scores, top = indexer_values(q_used, k, w, T)
    du.dump("indexer_q", t(q[None]), 1)
    du.dump("indexer_k", t(k[None]), 1)
    du.dump("non_intrusive__model.layers.1.self_attn.compressor.indexer.scorer.inputs.0", t(q_used[None]), 1)
    du.dump("non_intrusive__model.layers.1.self_attn.compressor.indexer.scorer.inputs.1", t(k[None]), 1)
    du.dump("indexer_weights", t(w[None]), 1)
    du.dump("indexer_scores", t(scores[None]), 1)
    du.dump("non_intrusive__model.layers.1.self_attn.compressor.indexer.output", t(top[None], torch.long), 1)


def indexer_checks():
    T = 192
    R = T // M
    q = rng.standard_normal((T, HI, DI)).astype(np.float32)
    k = rng.standard_normal((R, DI)).astype(np.float32)
    w = (rng.standard_normal((T, HI)) * 0.1).astype(np.float32)
    store = os.path.join(WORK, "store2")
    traces = {}
    ids = rng.integers(0, V, T)  # the same tokens in both
    for name, rotate in (("exact", False), ("bug", True)):
        d = os.path.join(WORK, "idx_" + name)
        indexer_dump(d, q, k, w, ids, rotate)
        h5 = os.path.join(WORK, f"idx_{name}.h5")
        rc, out, err = run("import", "hf", d, "--model", MODEL, "--out", h5, "--store", store)
        check(rc == 0, f"import indexer {name}: {err}")
        traces[name] = h5
    # replay under the recorded settings (rotate=none) and rotate=q: which reproduces each top-k
    for name, want_same in (("exact", "none"), ("bug", "q")):
        rc, out, err = run("replay", "--trace", traces[name], "--model", MODEL, "--layer", "1", "--sweep",
                           "rotate=none,q", "--json", "--store", store)
        if rc not in (0, 1):
            check(False, f"replay {name}: rc {rc} {err}")
            continue
        try:
            res = json.loads(out)
        except ValueError:
            check(False, f"replay {name}: not JSON: {out[:500]} {err[:500]}")
            continue
        cells = {c["settings"]["rotate"]: c["metrics"] for c in res.get("cells", [])}
        check(set(cells) >= {"none", "q"}, f"replay {name} cells: {list(cells)} {out[:300]}")
        if set(cells) >= {"none", "q"}:
            other = "q" if want_same == "none" else "none"
            same, diff = cells[want_same], cells[other]
            check(same["topk_jaccard_mean"] == 1.0 and same["topk_identical_rows"] == T and same["score_difference"] < 1e-9,
                  f"replay {name}: rotate={want_same} reproduces the recorded top-k and scores: {same}")
            check(diff["topk_jaccard_mean"] < 0.99 and diff["score_difference"] > 1e-3,
                  f"replay {name}: rotate={other} does not: {diff}")
    rc, out, err = run("diff", traces["exact"], traces["bug"], "--json")
    try:
        first = json.loads(out).get("first_divergence") or {}
    except ValueError:
        first = {}
    check(rc == 1 and first.get("tap") in ("layers.1.indexer.q_used",) , f"diff: first divergence {first} rc {rc} {err[:300]}")


# ------------------------------------------------------------------ errors

def error_checks():
    d = os.path.join(WORK, "bad_shape")
    du = Dumper(d)
    du.dump("input_ids", torch.arange(8))
    du.dump("non_intrusive__model.layers.0.output", torch.zeros(1, 8, HC, D + 1), 0)
    rc, out, err = run("import", "hf", d, "--model", MODEL, "--out", os.path.join(WORK, "bad1.h5"))
    check(rc == 1 and "non_intrusive__model.layers.0.output" in err and f"[rows, {HC}, {D}]" in err, f"bad shape: {err}")
    d = os.path.join(WORK, "no_ids")
    du = Dumper(d)
    du.dump("logits", torch.zeros(1, 4, V))
    rc, out, err = run("import", "hf", d, "--model", MODEL, "--out", os.path.join(WORK, "bad2.h5"))
    check(rc == 1 and "no input_ids" in err, f"no input_ids: {err}")
    bad_map = os.path.join(WORK, "bad.map")
    with open(bad_map, "w") as f:
        f.write("input_ids @tokens S\nfoo layers.nope B,S\n")
    rc, out, err = run("import", "hf", os.path.join(WORK, "hf"), "--model", MODEL, "--out", os.path.join(WORK, "bad3.h5"),
                       "--map", bad_map)
    check(rc == 1 and "bad.map line 2" in err and "layers.nope" in err, f"bad map: {err}")
    rc, out, err = run("import", "hf", os.path.join(WORK, "nowhere"), "--model", MODEL)
    check(rc == 1 and "nowhere" in err, f"missing dir: {err}")


os.makedirs(WORK, exist_ok=True)
hf_checks()
sglang_checks()
indexer_checks()
error_checks()
print(f"import_check: {checks} checks, {len(failures)} failed")
sys.exit(1 if failures else 0)
