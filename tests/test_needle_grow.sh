#!/usr/bin/env bash
# tools/needle_grow.py: a release grown by copies of its layers whose outputs are zero and whose
# mHC residual mix is the identity computes what the release does. Held to the engine, on
# needle make's prompts with 40 greedy tokens after each: every position's argmax (so the greedy
# answer) equal, and the logits within 1e-4 of the largest logit. They cannot be bit-equal:
# Sinkhorn's eps keeps the comb 4.3e-6 off the identity at --comb-diag 16, and the logits move by
# about 1e-5 of their scale for it (2.5e-3 at --comb-diag 8, where the comb is 1e-3 off). The same
# check must fail for a comb far from the identity (--comb-diag 4: 0.05 off), so it can fail.
# The file itself: the source's layers byte for byte under their new numbers, each copy equal to
# its source but for the zeroed output projections and the comb; the configs' layer lists; errors.
# --pack and --new-layers: a grown release whose new layers were changed (as a fine-tune of them
# would) grows again from the source and the packed file into the same bytes and the same log.
set -uo pipefail
st=${ST_BIN:?}
src=$(cd "${ST_SOURCE_DIR:?}" && pwd)
py=/usr/bin/python3
[ -x $py ] || py=python3
$py -c 'import h5py, numpy' 2>/dev/null || { echo "skip: h5py/numpy missing (Debian python3-h5py python3-numpy)"; exit 77; }
grow=$src/tools/needle_grow.py
v5=$src/models/needle-v5
. "$(dirname "$0")/work_checks.sh"   # $work, fail, $failures

$py "$grow" "$v5" "$work/grown" --after 3,5 >"$work/grow.out" || { cat "$work/grow.out"; echo "FAIL: grow"; exit 1; }
$py "$grow" "$v5" "$work/far" --after 3,5 --comb-diag 4 >/dev/null || { echo "FAIL: grow --comb-diag 4"; exit 1; }
grep -q "8 layers (new: 4, 7, copies of 3, 5)" "$work/grow.out" || fail "summary: $(cat "$work/grow.out")"

# the file: names, bytes, configs
$py - "$v5" "$work/grown" <<'EOF' || fail "the grown release's tensors or configs"
import json, os, re, sys
import numpy as np
sys.path.insert(0, os.environ["ST_SOURCE_DIR"] + "/tools")
import convert_release as cr
src, dst = sys.argv[1], sys.argv[2]
a, b = cr.open_checkpoint(src), cr.open_checkpoint(dst)
ok = True
def bad(msg):
    global ok
    print(msg); ok = False
mapping = {0: 0, 1: 1, 2: 2, 3: 3, 4: 3, 5: 4, 6: 5, 7: 5}   # grown layer -> source layer
copies = {4, 7}
names = set()
for name, t in b.items():
    m = re.match(r"^layers\.(\d+)\.(.+)$", name)
    srcname = f"layers.{mapping[int(m.group(1))]}.{m.group(2)}" if m else name
    names.add(srcname)
    if srcname not in a:
        bad(f"{name}: no {srcname} in the source"); continue
    x, y = a[srcname].raw(), t.raw()
    sub = m.group(2) if m else ""
    if m and int(m.group(1)) in copies and re.match(r"attn\.wo_b\.weight|ffn\.(experts\.\d+|shared_experts)\.w2\.weight", sub):
        if y.any(): bad(f"{name}: not zero")
    elif m and int(m.group(1)) in copies and re.match(r"hc_(attn|ffn)_(fn|base)$", sub):
        if not np.array_equal(x[:8], y[:8]): bad(f"{name}: pre/post part changed")
        want = np.zeros_like(y[8:]) if sub.endswith("fn") else 16 * np.eye(4, dtype=np.float32).reshape(16)
        if not np.array_equal(y[8:], want): bad(f"{name}: comb part {y[8:].ravel()[:6]}")
    elif x.tobytes() != y.tobytes() or x.shape != y.shape:
        bad(f"{name}: differs from {srcname}")
if names != set(a): bad(f"source tensors not in the grown release: {sorted(set(a) - names)[:4]}")
if len(b) != len(a) + sum(1 for n in a if n.startswith("layers.3.")) + sum(1 for n in a if n.startswith("layers.5.")):
    bad(f"{len(b)} tensors")
cfg = json.load(open(dst + "/config.json"))
hf = json.load(open(dst + "/hf_config.json"))
if cfg["num_hidden_layers"] != 8 or cfg["compress_ratios"] != [0, 4, 128, 4, 4, 128, 4, 4, 0]: bad(f"config {cfg['compress_ratios']}")
if hf["num_hidden_layers"] != 8 or hf["layer_types"][4] != "compressed_sparse_attention" or len(hf["mlp_layer_types"]) != 8:
    bad("hf_config")
log = [json.loads(l) for l in open(dst + "/training/log.jsonl")]
if log[-1].get("event") != "grown" or log[-1]["new_layers"] != [4, 7]: bad(f"log: {log[-1]}")
sys.exit(0 if ok else 1)
EOF

# the engine: the same greedy answers and logits
$st needle make --batch 2 --jsonl "$work/e.jsonl" --seed 78 --model "$v5" --lengths 512 \
  --kinds commit,path -q || { echo "FAIL: needle make"; exit 1; }
$py - "$st" "$work" "$v5" "$work/grown" "$work/far" <<'EOF' || failures=$((failures + 1))
import json, os, subprocess, sys
sys.path.insert(0, os.environ["ST_SOURCE_DIR"] + "/tools")
import numpy as np
import sparsetrace_read as sr
st, work, v5, grown, far = sys.argv[1:]
def run(model, ids, tag):
    json.dump(ids, open(f"{work}/p.json", "w"))
    out = f"{work}/{tag}.h5"
    r = subprocess.run([st, "run", "--model", model, "--prompt-tokens", f"{work}/p.json", "--tap", "logits",
                        "--max-new-tokens", "40", "--store", work, "-o", out, "--force", "-q"],
                       capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"run {model}: {r.stderr[-300:]}")
    return sr.read_tap(out, "logits").array
ok = True
for line in open(f"{work}/e.jsonl"):
    ex = json.loads(line)
    a = run(v5, ex["ids"], "src")
    scale = float(np.abs(a).max())
    for model, tag, same in ((grown, "grown", True), (far, "far", False)):
        b = run(model, ex["ids"], tag)
        rel = float(np.abs(a - b).max()) / scale
        argmax = a.shape == b.shape and bool((a.argmax(1) == b.argmax(1)).all())
        print(f"example {ex['index']}: {tag}: {a.shape[0]} positions, logits off by {rel:.2e} of the largest, "
              f"argmax {'equal' if argmax else 'differs'}")
        if same and not (argmax and rel <= 1e-4):
            print(f"FAIL: example {ex['index']}: the grown model is not the source"); ok = False
        if not same and argmax and rel <= 1e-4:
            print(f"FAIL: example {ex['index']}: a comb far from the identity passed the check"); ok = False
sys.exit(0 if ok else 1)
EOF

# errors: a hash layer, a layer out of range, a directory that is no release
$py "$grow" "$v5" "$work/bad" --after 0 2>"$work/err" && fail "--after 0 (the hash layer) accepted"
grep -q "routes by token hash" "$work/err" || fail "--after 0: $(cat "$work/err")"
$py "$grow" "$v5" "$work/bad" --after 6 2>"$work/err" && fail "--after 6 accepted"
grep -q "the model has layers 0..5" "$work/err" || fail "--after 6: $(cat "$work/err")"
$py "$grow" "$work" "$work/bad" --after 3 2>"$work/err" && fail "a directory with no release accepted"
grep -q "config.json" "$work/err" || fail "no release: $(cat "$work/err")"

# --pack / --new-layers: "tuned" is the grown release with every tensor of its new layers changed
# (their source layer's bytes, the comb's logits plus one) and a save at step 9000 in its log
$py - "$v5" "$work/grown" "$work/tuned" <<'EOF' || fail "making the tuned release"
import json, os, re, shutil, sys
import numpy as np
sys.path.insert(0, os.environ["ST_SOURCE_DIR"] + "/tools")
import convert_release as cr
src, grown, tuned = sys.argv[1:]
shutil.copytree(grown, tuned)
a, g = cr.open_checkpoint(src), cr.open_checkpoint(grown)
source_of = {"4": 3, "7": 5}
entries = []
for name in sorted(g, key=cr.natural_key):
    t = g[name]
    m = re.match(r"^layers\.(4|7)\.(.+)$", name)
    data = t.raw().tobytes()
    if m and re.match(r"hc_(attn|ffn)_(fn|base)$", m.group(2)):
        data = (t.raw() + np.float32(1)).tobytes()
    elif m:
        data = a[f"layers.{source_of[m.group(1)]}.{m.group(2)}"].raw().tobytes()
        if data == t.raw().tobytes():
            data = bytes(b ^ 1 for b in data)  # still a valid code or exponent
    entries.append((name, t.dtype, t.shape, lambda d=data: d))
cr.write_checkpoint(tuned, entries, 0)
with open(tuned + "/training/log.jsonl", "a") as f:
    f.write(json.dumps({"event": "saved", "step": 9000, "stage": 5}) + "\n")
EOF
$py "$grow" --pack "$work/tuned" "$work/new.safetensors" >"$work/pack.out" || fail "--pack: $(cat "$work/pack.out")"
grep -q "layers 4, 7 of" "$work/pack.out" || fail "--pack summary: $(cat "$work/pack.out")"
$py "$grow" "$v5" "$work/regrown" --after 3,5 --new-layers "$work/new.safetensors" >/dev/null || fail "--new-layers"
$py - "$work/grown" "$work/tuned" "$work/regrown" <<'EOF' || fail "--new-layers did not rebuild the tuned release"
import json, os, sys
sys.path.insert(0, os.environ["ST_SOURCE_DIR"] + "/tools")
import convert_release as cr
grown, tuned, regrown = sys.argv[1:]
g, t, r = (cr.open_checkpoint(d) for d in (grown, tuned, regrown))
new = [n for n in g if n.startswith(("layers.4.", "layers.7."))]
changed = sum(g[n].raw().tobytes() != t[n].raw().tobytes() for n in new)
same = set(t) == set(r) and all(t[n].dtype == r[n].dtype and t[n].raw().tobytes() == r[n].raw().tobytes() for n in t)
log = [json.loads(l) for l in open(regrown + "/training/log.jsonl")]
print(f"tuned: {changed} of the new layers' {len(new)} tensors changed; rebuilt byte for byte: {same}; log ends {log[-1]}")
sys.exit(0 if same and changed == len(new) and log[-1].get("step") == 9000 and log[-2].get("event") == "new layers" else 1)
EOF
# errors: a release that did not grow, another growth, a file short of a tensor or with one too many
$py "$grow" --pack "$v5" "$work/bad.safetensors" 2>"$work/err" && fail "--pack of an ungrown release accepted"
grep -q 'no "grown" event' "$work/err" || fail "--pack ungrown: $(cat "$work/err")"
$py "$grow" "$v5" "$work/bad" --after 3 --new-layers "$work/new.safetensors" 2>"$work/err" && fail "--new-layers of another growth accepted"
grep -qF "grew after [3, 5], not after [3]" "$work/err" || fail "--new-layers --after 3: $(cat "$work/err")"
$py - "$work/new.safetensors" "$work" <<'EOF' || fail "making the bad pack files"
import os, sys
sys.path.insert(0, os.environ["ST_SOURCE_DIR"] + "/tools")
import convert_release as cr
f = cr.SafetensorsFile(sys.argv[1])
names = sorted(f.tensors, key=cr.natural_key)
def entry(n, as_name=None):
    t = f.tensors[n]
    return (as_name or n, t.dtype, t.shape, lambda: t.raw().tobytes())
cr.write_safetensors(sys.argv[2] + "/short.safetensors", [entry(n) for n in names[1:]], f.metadata)
cr.write_safetensors(sys.argv[2] + "/extra.safetensors", [entry(n) for n in names] + [entry(names[0], "layers.5.extra")],
                     f.metadata)
EOF
# a fine-tune that changed a layer it did not grow: its new layers belong to other weights
$py - "$work/tuned" "$work/tuned-base" <<'EOF' || fail "making the tuned-base release"
import os, shutil, sys
import numpy as np
sys.path.insert(0, os.environ["ST_SOURCE_DIR"] + "/tools")
import convert_release as cr
shutil.copytree(sys.argv[1], sys.argv[2])
t = cr.open_checkpoint(sys.argv[1])
data = {n: t[n].raw().tobytes() for n in t}
data["layers.1.hc_attn_base"] = (t["layers.1.hc_attn_base"].raw() + np.float32(0.5)).tobytes()
cr.write_checkpoint(sys.argv[2], [(n, t[n].dtype, t[n].shape, lambda d=data[n]: d) for n in sorted(t, key=cr.natural_key)], 0)
EOF
$py "$grow" --pack "$work/tuned-base" "$work/base.safetensors" >/dev/null || fail "--pack tuned-base"
$py "$grow" "$v5" "$work/bad" --after 3,5 --new-layers "$work/base.safetensors" 2>"$work/err" && fail "new layers trained on other weights accepted"
grep -q "were trained on other weights than" "$work/err" || fail "other base: $(cat "$work/err")"
$py "$grow" "$v5" "$work/bad" --after 3,5 --new-layers "$work/short.safetensors" 2>"$work/err" && fail "a pack file short of a tensor accepted"
grep -q "no tensor 'layers.4" "$work/err" || fail "short pack: $(cat "$work/err")"
$py "$grow" "$v5" "$work/bad" --after 3,5 --new-layers "$work/extra.safetensors" 2>"$work/err" && fail "a pack file with a tensor too many accepted"
grep -q "tensor 'layers.5.extra' is not one of the new layers'" "$work/err" || fail "extra pack: $(cat "$work/err")"

[ "$failures" -eq 0 ] && echo "needle grow: all checks pass" || exit 1
