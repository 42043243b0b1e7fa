#!/usr/bin/env bash
# tools/needle_adopt.py, which decides whether a trained needle model replaces the release. Its
# sign test against a count of every outcome (all 2^n for n <= 14); its rule on paired verdicts
# worked out by hand; on the engine (the first 4 examples of e-composed48, 2 in a sanitizer
# build; needle-v4 as the candidate) its counts, gains and losses equal needle_engine_batch's on
# the same examples; each model's answers are kept and reused (no engine run the second time, a
# stopped run goes on from where it stopped, two engines at once as one); train_needle_gpu.sh's
# adopt step gives the same table, and its soup step needle_soup.py's weights and needle_adopt.py's
# table on them, and its probe step the copy probe's output; a corrupt answer store is named, not
# read; a candidate with another tokenizer is refused; a set of needle_data's prompts is made as
# its spec says; the demo gate keeps out a candidate the demo fails on; the soup step's
# SOUP_ALPHA_FOR is needle_soup.py's --alpha-for.
set -uo pipefail
st=${ST_BIN:?}
src=$(cd "${ST_SOURCE_DIR:?}" && pwd)
. "$(dirname "$0")/work_checks.sh"   # $work, fail, $failures
tool=$src/tools/needle_adopt.py
release=$src/models/needle-v5
candidate=$src/models/needle-v4

# the statistics and the rule, against mathematics
PYTHONPATH=$src/tools python3 - <<'EOF' || fail "the sign test or the rule"
import itertools, needle_adopt as na
bad = 0
for n in range(0, 15):
    for k in range(0, n + 2):
        # every sequence of n fair coins, counted: how many have at least k heads
        count = sum(1 for flips in itertools.product((0, 1), repeat=n) if sum(flips) >= k)
        if abs(na.sign_p(k, n) - count / 2 ** n) > 1e-15:
            print(f"sign_p({k}, {n}) = {na.sign_p(k, n)}, counted {count / 2 ** n}"); bad += 1
row = na.compare([1, 1, 0, 0, 1, 0], [1, 0, 1, 1, 0, 0])
want = {"release": 3, "candidate": 3, "examples": 6, "gains": 2, "losses": 2}
if {k: row[k] for k in want} != want or row["p_worse"] != 11 / 16:  # P(X >= 2), X ~ B(4, 1/2) = 11/16
    print("compare:", row); bad += 1

def case(*rows):  # (gains, losses) per set
    return {f"s{i}": na.compare([0] * g + [1] * l, [1] * g + [0] * l) for i, (g, l) in enumerate(rows)}
checks = [
    # 7 gains, 0 losses: p(better) = 1/128 < 0.05 / 2
    (case((7, 0), (3, 3)), "adopt", "better on s0"),
    # 0 gains, 7 losses on one set: worse, whatever the other says
    (case((7, 0), (0, 7)), "keep", "worse on s1"),
    # 5 gains, 0 losses: 1/32 = 0.031 < 0.05 alone, but not < 0.05 / 2 beside another set (Bonferroni)
    (case((5, 0)), "adopt", "better on s0"),
    (case((5, 0), (0, 0)), "keep", "no set tells them apart"),
    # no example differs
    (case((0, 0)), "keep", "no set tells them apart"),
]
for rows, word, reason in checks:
    got = na.verdict(rows)
    if got[0] != word or reason not in got[1]:
        print(f"verdict of {[(r['gains'], r['losses']) for r in rows.values()]}: {got}, want {word}: {reason}"); bad += 1
# by_kind, worked by hand: kind b's 3 examples (release 1, 0, 1; candidate 1, 1, 0) and a's 1
ex = [{"kind": k} for k in "babb"]
kinds = na.by_kind(ex, [1, 0, 0, 1], [1, 1, 1, 0])
if list(kinds) != ["a", "b"] or [(r["release"], r["candidate"], r["examples"], r["gains"], r["losses"])
                                 for r in kinds.values()] != [(0, 1, 1, 1, 0), (2, 2, 3, 1, 1)]:
    print("by_kind:", kinds); bad += 1
if na.kind_line("s", kinds) != "by kind s: a 0->1/1  b 2->2/3":
    print("kind_line:", na.kind_line("s", kinds)); bad += 1
print(f"sign test and rule: {bad} wrong")
raise SystemExit(bad > 0)
EOF

# the engine through a wrapper that logs every `run` (how many examples were asked)
cat >"$work/st" <<EOF
#!/bin/sh
[ "\$1" = run ] && echo run >>"$work/runs.log"
exec "$st" "\$@"
EOF
chmod +x "$work/st"
runs() { [ -f "$work/runs.log" ] && wc -l <"$work/runs.log" || echo 0; }
adopt() { python3 "$tool" "$candidate" --release "$release" --st "$work/st" --work "$work/w" --sets e-composed48 --no-demo "$@"; }
# a first run over a examples, going on to b; a sanitizer build (~15x slower arithmetic) asks fewer
a=2 b=4
[ "${ST_SANITIZE:-0}" = 1 ] && a=1 b=2

adopt --first $a >"$work/a.txt" 2>&1 || fail "needle_adopt --first $a: $(tail -3 "$work/a.txt")"
[ "$(runs)" = $((2 * a)) ] && echo "ok: $a examples, 2 models: $((2 * a)) engine runs" \
  || fail "$a examples asked of 2 models took $(runs) runs"
adopt --first $b --jobs 2 --answers "$work/answers.txt" >"$work/a4.txt" 2>&1 || fail "needle_adopt --first $b: $(tail -3 "$work/a4.txt")"
[ "$(runs)" = $((2 * b)) ] && echo "ok: going on to $b examples ran only the $((b - a)) new ones, for each model" \
  || fail "going on from $a to $b examples: $(runs) runs in all, want $((2 * b))"
adopt --first $b >"$work/again.txt" 2>&1 || fail "needle_adopt again: $(tail -3 "$work/again.txt")"
[ "$(runs)" = $((2 * b)) ] && echo "ok: asked again, no engine run" || fail "asked again: $(runs) runs in all, want $((2 * b))"
cmp -s <(grep -v '^release\|^candidate' "$work/a4.txt") <(grep -v '^release\|^candidate' "$work/again.txt") \
  && echo "ok: the same table from the kept answers" || fail "the kept answers gave another table"
grep -q "partial: the first $b examples" "$work/a4.txt" && echo "ok: --first says the verdict is partial" \
  || fail "--first $b does not say the verdict is partial"

# against needle_engine_batch on the same examples, both models
head -$b "$work/w/sets/e-composed48.jsonl" >"$work/first.jsonl"
python3 "$src/tools/needle_engine_batch.py" "$work/first.jsonl" --model "$release" --model "$candidate" --st "$st" \
  >"$work/batch.txt" 2>&1 || fail "needle_engine_batch: $(tail -3 "$work/batch.txt")"
read -r r c < <(sed -n "s|^all: \([0-9]*\)/$b \([0-9]*\)/$b\$|\1 \2|p" "$work/batch.txt")
read -r g l < <(sed -n 's|.* passes \([0-9]*\) it fails .*; fails \([0-9]*\) it passes .*|\1 \2|p' "$work/batch.txt")
read -r n2 r2 c2 g2 l2 < <(awk '$1 == "e-composed48" {print $2, $3, $4, $5, $6}' "$work/a4.txt")
if [ -n "${r:-}" ] && [ -n "${g:-}" ] && [ "$n2 $r2 $c2 $g2 $l2" = "$b $r $c $g $l" ]; then
  echo "ok: $b examples, release $r, candidate $c, gains $g, losses $l, as needle_engine_batch counts"
else
  fail "needle_adopt: '${n2:-} ${r2:-} ${c2:-} ${g2:-} ${l2:-}', needle_engine_batch: $b examples, all ${r:-?} ${c:-?}, gains ${g:-?} losses ${l:-?}"
fi
# its by-kind line, kind by kind, against needle_engine_batch's `kind K: R/N C/N` (the first examples of
# e-composed48: key, key, random, ticket; a set of one kind, as the first 2 are, gets no such line)
want=$(sed -n 's|^kind \([a-z]*\): \([0-9]*\)/\([0-9]*\) \([0-9]*\)/[0-9]*$|\1 \2->\4/\3|p' "$work/batch.txt" | paste -sd' ')
got=$(sed -n 's|^by kind e-composed48: ||p' "$work/a4.txt" | sed 's/  / /g')
[ "$(grep -c '^kind ' "$work/batch.txt")" = 1 ] && want=""
if [ "$got" = "$want" ] && grep -q '^kind ' "$work/batch.txt"; then echo "ok: by kind: $got, as needle_engine_batch counts"
else fail "needle_adopt's by-kind line '$got', needle_engine_batch's kinds '$want'"; fi
[ "$(grep -cE '^ *[0-9]+ ' "$work/answers.txt")" = $b ] && echo "ok: --answers has a line per example" \
  || fail "--answers: $(grep -cE '^ *[0-9]+ ' "$work/answers.txt") example lines, want $b"

# the candidate is the release: no gains, no losses, nothing run again, kept
python3 "$tool" "$release" --release "$release" --st "$work/st" --work "$work/w" --sets e-composed48 --first $b --no-demo \
  >"$work/self.txt" 2>&1 || fail "the release against itself: $(tail -3 "$work/self.txt")"
awk '$1 == "e-composed48" {exit !($5 == 0 && $6 == 0)}' "$work/self.txt" && grep -q '^verdict: keep: no set tells' "$work/self.txt" \
  && [ "$(runs)" = $((2 * b)) ] && echo "ok: the release against itself: no gain, no loss, kept, no run" \
  || fail "the release against itself: $(grep -E '^e-composed48|^verdict' "$work/self.txt" | tr '\n' ' '), $(runs) runs"

# the GPU call's adopt step (train_needle_gpu.sh): the same table, from the same kept answers
mkdir -p "$work/tdir/release" && cp "$candidate"/{model.safetensors,config.json,tokenizer.json} "$work/tdir/release/"
env INIT="$release" NEEDLE_TRAIN_DIR="$work/tdir" ST_BIN="$work/st" ADOPT_DEMO=0 ADOPT_WORK="$work/w" ADOPT_SETS=e-composed48 \
  ADOPT_FIRST=$b "$src/tools/train_needle_gpu.sh" "$work/gpu.out" adopt >"$work/gpu.log" 2>&1 \
  || fail "train_needle_gpu.sh adopt: $(tail -3 "$work/gpu.log")"
tar -xzf "$work/gpu.out/logs.tgz" -C "$work/gpu.out" 2>/dev/null || fail "train_needle_gpu.sh adopt: no logs.tgz"
if [ "$(grep '^e-composed48' "$work/gpu.out/logs/adopt.txt" 2>/dev/null)" = "$(grep '^e-composed48' "$work/a4.txt")" ] \
   && [ "$(runs)" = $((2 * b)) ] && [ -s "$work/gpu.out/logs/adopt-answers.txt" ]; then
  echo "ok: train_needle_gpu.sh adopt: the same table from the kept answers, no run"
else
  fail "train_needle_gpu.sh adopt: '$(grep '^e-composed48' "$work/gpu.out/logs/adopt.txt" 2>/dev/null)', $(runs) runs"
fi

# the soup step: the release mixed with INIT as tools/needle_soup.py mixes them (the same weights),
# packed, and adopted as needle_adopt.py adopts that mix (the same table; its answers kept, so a
# second adoption runs nothing). needle_soup.py needs numpy: Debian's python3 has it (tools/deps.sh),
# and is the python3 the step finds here.
mkdir -p "$work/py" && ln -sf /usr/bin/python3 "$work/py/python3"
env PATH="$work/py:$PATH" INIT="$release" NEEDLE_TRAIN_DIR="$work/tdir" ST_BIN="$work/st" ADOPT_DEMO=0 ADOPT_WORK="$work/w" ADOPT_SETS=e-composed48 \
  ADOPT_FIRST=$b "$src/tools/train_needle_gpu.sh" "$work/soup.out" soup >"$work/soup.log" 2>&1 \
  || fail "train_needle_gpu.sh soup: $(tail -3 "$work/soup.log")"
/usr/bin/python3 "$src/tools/needle_soup.py" "$release" "$work/tdir/release" "$work/soup-direct" --alpha 0.5 >"$work/soup-direct.log" 2>&1 \
  || fail "needle_soup.py on the same pair: $(tail -3 "$work/soup-direct.log")"
runs_before=$(runs)
python3 "$tool" "$work/soup-direct" --release "$release" --st "$work/st" --work "$work/w" --sets e-composed48 --first $b --no-demo \
  >"$work/soup-direct.txt" 2>&1 || fail "needle_adopt.py on the direct soup: $(tail -3 "$work/soup-direct.txt")"
tar -xzf "$work/soup.out/logs.tgz" -C "$work/soup.out" 2>/dev/null || fail "train_needle_gpu.sh soup: no logs.tgz"
mkdir -p "$work/soup.tgz" && tar -xzf "$work/soup.out/needle-soup.tgz" -C "$work/soup.tgz" 2>/dev/null \
  || fail "train_needle_gpu.sh soup: no needle-soup.tgz: $(tail -3 "$work/soup.log")"
row=$(grep '^e-composed48' "$work/soup.out/logs/adopt-soup.txt" 2>/dev/null)
weights=differ; cmp -s "$work/soup.tgz/model.safetensors" "$work/soup-direct/model.safetensors" && weights=equal
if [ $weights = equal ] && [ -n "$row" ] && [ "$row" = "$(grep '^e-composed48' "$work/soup-direct.txt")" ] \
   && [ "$(runs)" = "$runs_before" ] && [ -s "$work/soup.out/logs/adopt-soup-answers.txt" ]; then
  echo "ok: train_needle_gpu.sh soup: needle_soup.py's weights, needle_adopt.py's table, no run the second time"
else
  fail "train_needle_gpu.sh soup: weights $weights, '$row', $runs_before -> $(runs) runs"
fi

# the answers a step adds to the cache come back in OUT/logs/adopt-cache: none from the adopt step
# (every answer was kept), the soup's from the soup step, the cache's own bytes; put in a cache that
# holds only the release's answers and the set, they judge the soup as before, with no run
added=$(ls -A "$work/gpu.out/logs/adopt-cache" 2>/dev/null | wc -l)
brought=$(ls "$work/soup.out/logs/adopt-cache" 2>/dev/null)
digest16() { (cd "$src/tools" && python3 -c 'import sys, needle_adopt as na; print(na.model_digest(sys.argv[1])[:16])' "$1"); }
soup_digest=$(digest16 "$work/soup-direct")
mkdir -p "$work/w2/answers" "$work/w2/sets" && cp "$work/w/sets/e-composed48.jsonl" "$work/w2/sets/"
cp "$work/w/answers"/e-composed48-"$(digest16 "$release")"-*.json "$work/w2/answers/" 2>/dev/null
for f in $brought; do cp "$work/soup.out/logs/adopt-cache/$f" "$work/w2/answers/"; done
runs_before=$(runs)
python3 "$tool" "$work/soup-direct" --release "$release" --st "$work/st" --work "$work/w2" --sets e-composed48 --first $b --no-demo \
  >"$work/soup-w2.txt" 2>&1 || fail "needle_adopt.py from the brought-back answers: $(tail -3 "$work/soup-w2.txt")"
if [ "$added" = 0 ] && [ "$(echo "$brought" | wc -w)" = 1 ] && [[ "$brought" == e-composed48-"$soup_digest"-*.json ]] \
   && cmp -s "$work/soup.out/logs/adopt-cache/$brought" "$work/w/answers/$brought" \
   && [ "$(grep '^e-composed48' "$work/soup-w2.txt")" = "$row" ] && [ "$(runs)" = "$runs_before" ]; then
  echo "ok: train_needle_gpu.sh brings back the answers it added (none kept ones), and they judge the soup elsewhere with no run"
else
  fail "brought-back answers: adopt step added $added, soup step '$brought' (soup $soup_digest), '$(grep '^e-composed48' "$work/soup-w2.txt")' vs '$row', $runs_before -> $(runs) runs"
fi

# the probe step: tools/needle_copy_probe.py on a set the adopt step wrote, for INIT, the release
# and the soup, with --trained the call's C examples: the same output as the tool run directly
mkdir -p "$work/pw/sets" "$work/pc"
head -n $a "$work/w/sets/e-composed48.jsonl" >"$work/pw/sets/few.jsonl"
"$st" needle make --batch 6 --jsonl "$work/pc/train.jsonl" --seed 31 --model "$release" --lengths 512 -q \
  || fail "needle make for the probe step's C examples"
env PATH="$work/py:$PATH" INIT="$release" NEEDLE_TRAIN_DIR="$work/tdir" NEEDLE_CDATA_DIR="$work/pc" ST_BIN="$st" \
  ADOPT_WORK="$work/pw" PROBE_SETS=few "$src/tools/train_needle_gpu.sh" "$work/probe.out" probe >"$work/probe.log" 2>&1 \
  || fail "train_needle_gpu.sh probe: $(tail -3 "$work/probe.log")"
tar -xzf "$work/probe.out/logs.tgz" -C "$work/probe.out" 2>/dev/null || fail "train_needle_gpu.sh probe: no logs.tgz"
/usr/bin/python3 "$src/tools/needle_copy_probe.py" "$work/pw/sets/few.jsonl" --model "$release" \
  --model "$work/tdir/release" --model "$work/tdir/soup" --trained "$work/pc/train.jsonl" --st "$st" \
  >"$work/probe-direct.txt" 2>&1 || fail "needle_copy_probe.py direct: $(tail -3 "$work/probe-direct.txt")"
if cmp -s "$work/probe.out/logs/copy-probe-few.txt" "$work/probe-direct.txt" \
   && grep -q "^times a trained needle held it" "$work/probe-direct.txt" \
   && [ "$(grep -c "of the needle tokens wrong" "$work/probe-direct.txt")" = 3 ]; then
  echo "ok: train_needle_gpu.sh probe: the tool's output for INIT, release and soup, with --trained"
else
  fail "train_needle_gpu.sh probe: $(diff "$work/probe.out/logs/copy-probe-few.txt" "$work/probe-direct.txt" 2>&1 | head -5)"
fi

# the engine's key: two builds that name the same sources, compiler and build type share their
# answers whatever their revisions; other sources, another compiler or build type do not; a build
# whose sources are modified, or that names none (from before --version printed them), is keyed
# by its bytes, hashed here on their own
mkver() { printf '#!/bin/sh\necho "%s"\n' "$2" >"$work/$1" && chmod +x "$work/$1"; }
mkver v1 "sparsetrace 0123456789ab (GNU-12.2.0, RelWithDebInfo; sources 00112233aabb)"
mkver v2 "sparsetrace ba9876543210 (GNU-12.2.0, RelWithDebInfo; sources 00112233aabb)"
mkver v3 "sparsetrace ba9876543210 (GNU-12.2.0, RelWithDebInfo; sources 00112233aabc)"
mkver v4 "sparsetrace ba9876543210 (GNU-13.1.0, RelWithDebInfo; sources 00112233aabb)"
mkver v5 "sparsetrace ba9876543210 (GNU-12.2.0, Debug+asan+ubsan; sources 00112233aabb)"
mkver m1 "sparsetrace 0123456789ab-dirty (GNU-12.2.0, RelWithDebInfo; sources modified)"
mkver m2 "sparsetrace 0123456789ab (GNU-12.2.0, RelWithDebInfo)"
python3 - "$src/tools" "$work" <<'PY' || fail "the engine's key (above)"
import hashlib, sys
sys.path.insert(0, sys.argv[1])
import needle_adopt as na
w = sys.argv[2]
key = lambda name: na.engine_key(f"{w}/{name}")
raw = lambda name: hashlib.sha256(open(f"{w}/{name}", "rb").read()).hexdigest()
checks = [("the same sources, compiler and type, another revision: one key", key("v1") == key("v2")),
          ("other sources: another key", key("v3") != key("v1")),
          ("another compiler: another key", key("v4") != key("v1")),
          ("another build type: another key", key("v5") != key("v1")),
          ("sources modified: the binary's bytes", key("m1") == raw("m1")),
          ("no sources named: the binary's bytes", key("m2") == raw("m2"))]
for what, ok in checks:
    print(("ok: " if ok else "FAIL: ") + what)
raise SystemExit(not all(ok for _, ok in checks))
PY

# a set of needle_data's prompts (python_set, the card's generator): six examples made twice, the
# same bytes; each of the spec's family, kinds in turn and thinking off, asked one of the family's
# own questions, its needle line once in the request and its value the needle's; its ids the
# engine's rendering of that request, within 10% of the length aimed at (3% once rescaled, the
# third try kept)
python3 - "$src/tools" "$work" "$st" "$release" <<'PY' || fail "python_set (above)"
import argparse, json, subprocess, sys
sys.path.insert(0, sys.argv[1])
import needle_adopt as na, needle_data as nd
w, st, release = sys.argv[2:5]
args = argparse.Namespace(st=st, release=release)
spec = dict(batch=6, seed="test", family=nd.HELDOUT_FAMILY, kinds=["path", "key"], lengths=[1024, 2048, 4096])
for out in ("p1.jsonl", "p2.jsonl"):
    na.python_set(args, "test", spec, f"{w}/{out}")
a, b = (open(f"{w}/{x}", "rb").read() for x in ("p1.jsonl", "p2.jsonl"))
ex = [json.loads(x) for x in a.decode().splitlines()]
fam = nd.FAMILIES[nd.HELDOUT_FAMILY]
bad = []
if a != b:
    bad.append("made twice, the bytes differ")
if [e["index"] for e in ex] != list(range(6)):
    bad.append(f"indices {[e['index'] for e in ex]}")
for i, e in enumerate(ex):
    label, value = e["needle"].split(": ", 1)
    msgs = e["request"]["messages"]
    text = "\n".join(m["content"] for m in msgs if isinstance(m.get("content"), str))
    asked = msgs[-1]["content"]
    with open(f"{w}/req.json", "w") as f:
        json.dump(e["request"], f)
    ids = json.loads(subprocess.run([st, "render", "--request", f"{w}/req.json", "--model", release, "--ids",
                                     "--thinking", "off"], capture_output=True, text=True, check=True).stdout)
    want = spec["lengths"][i % 3]
    checks = {"family": e["family"] == nd.HELDOUT_FAMILY, "kind": e["kind"] == spec["kinds"][i % 2],
              "thinking off": e["thinking"] is False, "value": e["value"] == value,
              "needle line once": text.count(e["needle"]) == 1,
              "a question of the family": asked in [q.format(label=label, lower=label.lower()) for q in fam.questions],
              "ids rendered": e["ids"] == ids, "length": abs(len(ids) - want) <= 0.1 * want}
    bad += [f"example {i}: {k} ({len(ids)} ids)" for k, ok in checks.items() if not ok]
print("\n".join("FAIL: " + x for x in bad) or "ok: python_set: six examples, the same twice, each as its spec asks")
raise SystemExit(bool(bad))
PY

# SOUP_ALPHA_FOR: the soup step passes it to needle_soup.py --alpha-for (the same weights)
mkdir -p "$work/tdir2" && cp -r "$work/tdir/release" "$work/tdir2/"
env PATH="$work/py:$PATH" INIT="$release" NEEDLE_TRAIN_DIR="$work/tdir2" ST_BIN="$work/st" ADOPT_DEMO=0 ADOPT_WORK="$work/w3" \
  ADOPT_SETS=e-composed48 ADOPT_FIRST=1 SOUP_ALPHA=0.75 SOUP_ALPHA_FOR='*.attn.indexer.*=0' \
  "$src/tools/train_needle_gpu.sh" "$work/soup2.out" soup >"$work/soup2.log" 2>&1 || fail "train_needle_gpu.sh soup, SOUP_ALPHA_FOR: $(tail -3 "$work/soup2.log")"
/usr/bin/python3 "$src/tools/needle_soup.py" "$release" "$work/tdir2/release" "$work/soup2-direct" --alpha 0.75 \
  --alpha-for '*.attn.indexer.*=0' >/dev/null 2>&1 || fail "needle_soup.py --alpha-for on the same pair"
cmp -s "$work/tdir2/soup/model.safetensors" "$work/soup2-direct/model.safetensors" \
  && ! cmp -s "$work/soup2-direct/model.safetensors" "$work/soup-direct/model.safetensors" \
  && echo "ok: train_needle_gpu.sh soup: SOUP_ALPHA_FOR gives needle_soup.py --alpha-for's weights" \
  || fail "train_needle_gpu.sh soup with SOUP_ALPHA_FOR: not needle_soup.py --alpha-for's weights: $(tail -2 "$work/soup2.log")"

# the demo gate (item 5 of the model's issue): its reading of the demo's figures at the item's bounds,
# an adopted candidate that fails it kept out; on the engine, needle-v4 fails it where tools/demo.sh
# stops (its bisect: no layer's verdict flips under rotate=q), which it names. The release passes it:
# tests/test_demo.sh runs the demo on it. A sanitizer build leaves the engine's run out (16k tokens).
PYTHONPATH=$src/tools python3 - <<'EOF2' || fail "the demo gate's rule"
import needle_adopt as na
bad = 0
fig = {"layer": 5, "kept": 15, "kept_q": 4, "positions": 17}
for sweep, sweep_q, want in (("16/16", "0/16", True), ("15/16", "2/16", True), ("14/16", "0/16", False),
                             ("16/16", "3/16", False)):
    ok, why = na.demo_verdict(0, dict(fig, sweep=sweep, sweep_q=sweep_q))
    if ok != want or f"sweep {sweep} -> {sweep_q}" not in why or "layer 5: 15 -> 4 of 17" not in why:
        print("demo_verdict", sweep, sweep_q, ok, why); bad += 1
for rc, figures in ((1, None), (0, None), (1, dict(fig, sweep="16/16", sweep_q="0/16"))):
    ok, why = na.demo_verdict(rc, figures, "7. bisect")
    if ok or f"stopped (exit {rc}): 7. bisect" not in why:
        print("demo_verdict stopped", rc, ok, why); bad += 1
if na.with_demo("adopt", "better on s0", False, "x")[0] != "keep" or na.with_demo("adopt", "r", True, "x") != ("adopt", "r") \
        or na.with_demo("keep", "r", False, "x") != ("keep", "r"):
    print("with_demo"); bad += 1
raise SystemExit(bad > 0)
EOF2
[ $? = 0 ] && echo "ok: the demo gate's rule at item 5's bounds; a failing candidate is kept out"
if [ "${ST_SANITIZE:-0}" != 1 ]; then
  PYTHONPATH=$src/tools python3 -c 'import sys, needle_adopt as na; print(*na.demo(sys.argv[1], sys.argv[2]), sep="\n")' \
    "$st" "$candidate" >"$work/demo-gate.txt" 2>&1
  if [ "$(head -1 "$work/demo-gate.txt")" = False ] && grep -q "^tools/demo.sh stopped (exit 1): 7. bisect; layer 1 " "$work/demo-gate.txt" \
     && grep -q "no flip" "$work/demo-gate.txt"; then
    echo "ok: needle-v4 fails the demo gate: $(tail -1 "$work/demo-gate.txt" | cut -c1-100)"
  else
    fail "needle-v4's demo gate: $(cat "$work/demo-gate.txt")"
  fi
fi

# a corrupt answer store is named and not read
store=$(ls "$work"/w/answers/e-composed48-*.json | head -1)
printf '{"answers": {"0": "trunc' >"$store"
if adopt --first $b >"$work/corrupt.txt" 2>&1; then
  fail "a corrupt answer store was read"
else
  grep -q "$store: unreadable" "$work/corrupt.txt" && echo "ok: a corrupt answer store is named" \
    || fail "a corrupt store: $(tail -2 "$work/corrupt.txt")"
fi

# another tokenizer is refused
mkdir -p "$work/other" && cp "$release"/{model.safetensors,config.json} "$work/other/" && echo '{}' >"$work/other/tokenizer.json"
if python3 "$tool" "$work/other" --release "$release" --st "$work/st" --work "$work/w" >"$work/tok.txt" 2>&1; then
  fail "a candidate with another tokenizer was asked"
else
  grep -q "different tokenizer.json" "$work/tok.txt" && echo "ok: another tokenizer is refused" \
    || fail "another tokenizer: $(tail -2 "$work/tok.txt")"
fi

[ "$failures" -eq 0 ] && echo "test_needle_adopt: all passed" || echo "test_needle_adopt: $failures failed"
exit $((failures > 0))
