#!/usr/bin/env python3
"""The planted-bug test (issue 19 item 5) on transformers' own exports: tools/export_hf.py ran
DeepseekV4ForCausalLM on the tiny oracle model twice on one prompt (tests/data/import/hf/: exact,
and rotate_q: the indexer query alone Hadamard-rotated, the bug of the reports). Both are imported
and compared with the reference engine's exact run of the same tokens:

  - the exact export agrees with the engine up to and past layer 1's indexer (no divergence at
    or before layers.1.indexer.q_used);
  - the patched export's first divergence is layers.1.indexer.q_used, the first CSA layer's
    scored query, and nothing before it differs;
  - replaying the patched trace's layer 1 indexer under rotate=q reproduces the top-k and scores
    transformers computed, and under the recorded (reference) settings it does not.

Usage: import_planted_check.py SPARSETRACE DATA_DIR MODEL_DIR WORKDIR
"""
import json
import os
import subprocess
import sys

BIN, DATA, MODEL, WORK = sys.argv[1:5]
TAP_ORDER = ["input", "attn.x", "attn.qr", "attn.q", "attn.kv", "compressor.kv", "indexer.q", "indexer.k",
             "indexer.q_used", "indexer.k_used", "indexer.weights", "indexer.scores", "indexer.topk", "attn.out",
             "ffn.experts", "ffn.out", "output"]
failures, checks = [], 0


def check(ok, what):
    global checks
    checks += 1
    print(("ok:   " if ok else "FAIL: ") + what)
    if not ok:
        failures.append(what)


def run(*args):
    p = subprocess.run([BIN, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def order(tap):
    if not tap or not tap.startswith("layers."):
        return (10 ** 6, 0)
    _, layer, suffix = tap.split(".", 2)
    return (int(layer), TAP_ORDER.index(suffix) if suffix in TAP_ORDER else 99)


store = os.path.join(WORK, "store")
traces = {}
for name in ("exact", "rotate_q"):
    h5 = os.path.join(WORK, name + ".h5")
    rc, out, err = run("import", "hf", os.path.join(DATA, name), "--model", MODEL, "--out", h5, "--store", store)
    check(rc == 0, f"import {name}: {out.strip()} {err.strip()}")
    traces[name] = h5
ref = os.path.join(WORK, "reference.h5")
rc, out, err = run("run", "--model", MODEL, "--prompt-tokens", os.path.join(DATA, "prompt_tokens.json"), "--tap", "layers.*",
                   "--tap", "logits", "--out", ref, "--store", store, "--quiet")
check(rc == 0, f"reference run: {err.strip()[-500:]}")
if failures:
    sys.exit(1)

q_used = order("layers.1.indexer.q_used")
for name in ("exact", "rotate_q"):
    rc, out, err = run("diff", ref, traces[name], "--json")
    try:
        first = json.loads(out).get("first_divergence")
    except ValueError:
        first, out = None, out + err
    print(f"diff reference {name}: first divergence {json.dumps(first)[:400]}")
    if name == "exact":
        check(first is None or order(first.get("tap")) > q_used,
              f"exact export agrees with the engine through layers.1.indexer.q_used (first divergence: "
              f"{first and first.get('tap')})")
    else:
        check(first is not None and first.get("tap") == "layers.1.indexer.q_used",
              f"patched export first diverges at layers.1.indexer.q_used (got {first and first.get('tap')})")

rc, out, err = run("replay", "--trace", traces["rotate_q"], "--model", MODEL, "--layer", "1", "--sweep", "rotate=none,q",
                   "--json", "--store", store)
try:
    cells = {c["settings"]["rotate"]: c["metrics"] for c in json.loads(out)["cells"]}
except (ValueError, KeyError):
    cells = {}
print("replay rotate_q layer 1:", json.dumps(cells)[:800])
q, none = cells.get("q", {}), cells.get("none", {})
check(q.get("topk_jaccard_mean", 0) >= 0.99 and q.get("score_difference", 1) < 1e-6,
      f"rotate=q reproduces transformers' patched top-k and scores (jaccard {q.get('topk_jaccard_mean')}, "
      f"score difference {q.get('score_difference')})")
check(none.get("topk_jaccard_mean", 1) < q.get("topk_jaccard_mean", 0) and none.get("score_difference", 0) > 1e-3,
      f"the reference settings do not (jaccard {none.get('topk_jaccard_mean')}, score difference "
      f"{none.get('score_difference')})")
print(f"import_planted_check: {checks} checks, {len(failures)} failed")
sys.exit(1 if failures else 0)
