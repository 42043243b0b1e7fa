#!/usr/bin/env bash
# `sparsetrace needle make --batch`: the training data of the next bundled model, written by the
# same generator the harness uses. Checked against independent references: the tokenizer's own
# decoding (`sparsetrace tokenize --decode`), the rendered prompt's bytes, `sparsetrace render`
# on the example's request (one truth with the engine's rendering), regular expressions per
# needle kind, and the held-out lists as the README states them (kinds email, env; families q5, q6).
set -uo pipefail
st=${ST_BIN:?}
src=$(cd "${ST_SOURCE_DIR:?}" && pwd)
model=$src/models/needle-v4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[ -f "$model/tokenizer.json" ] || { echo "FAIL: $model/tokenizer.json is missing"; exit 1; }
fail() { echo "FAIL: $*"; exit 1; }

# determinism: same arguments, same bytes; another seed, other bytes
$st needle make --batch 24 --jsonl "$work/a.jsonl" --seed 7 --model "$model" --lengths 512,1k -q || fail "batch a"
$st needle make --batch 24 --jsonl "$work/b.jsonl" --seed 7 --model "$model" --lengths 512,1k -q || fail "batch b"
$st needle make --batch 24 --jsonl "$work/c.jsonl" --seed 8 --model "$model" --lengths 512,1k -q || fail "batch c"
cmp -s "$work/a.jsonl" "$work/b.jsonl" || fail "the same arguments gave different bytes"
cmp -s "$work/a.jsonl" "$work/c.jsonl" && fail "seeds 7 and 8 gave the same bytes"
[ "$(wc -l < "$work/a.jsonl")" = 24 ] || fail "24 examples asked, $(wc -l < "$work/a.jsonl") lines written"

$st needle make --batch 40 --jsonl "$work/h.jsonl" --seed 7 --split heldout --model "$model" --lengths 512 -q \
  || fail "heldout batch"

# every kind x format x shape renders (email and env only in the held-out split)
for k in path host key number ticket branch url email commit env random assorted vocab; do
  split=train; case $k in email|env) split=heldout;; esac
  for f in anthropic openai-chat openai-responses; do
    for s in agent toollist; do
      $st needle make --batch 1 --jsonl "$work/k-$k-$f-$s.jsonl" --seed 3 --kinds $k --formats $f --shapes $s \
        --split $split --model "$model" --lengths 512 -q || fail "kind $k format $f shape $s"
    done
  done
done

# bad input: a clear usage error, no file
out=$($st needle make --batch 2 --jsonl "$work/x.jsonl" --seed 1 --kinds email --model "$model" 2>&1); rc=$?
[ $rc = 2 ] && grep -q "held out" <<< "$out" || fail "--kinds email in the train split: rc $rc, '$out'"
out=$($st needle make --batch 2 --jsonl "$work/x.jsonl" --seed 1 --kinds colour --model "$model" 2>&1); rc=$?
[ $rc = 2 ] && grep -q "kinds 'colour'" <<< "$out" || fail "--kinds colour: rc $rc, '$out'"
out=$($st needle make --batch 2 --jsonl "$work/x.jsonl" --seed 1 2>&1); rc=$?
[ $rc = 2 ] && grep -q "model" <<< "$out" || fail "--batch without --model: rc $rc, '$out'"
out=$($st needle make --batch 2 --jsonl "$work/x.jsonl" --seed 1 --kind host --model "$model" 2>&1); rc=$?
[ $rc = 2 ] && grep -q "not --kind" <<< "$out" || fail "--kind with --batch: rc $rc, '$out'"
out=$($st needle make --batch 2 --jsonl "$work/x.jsonl" --seed 1 --shapes tree --model "$model" 2>&1); rc=$?
[ $rc = 2 ] && grep -q "shapes 'tree'" <<< "$out" || fail "--shapes tree: rc $rc, '$out'"
[ -e "$work/x.jsonl" ] && fail "a refused batch left $work/x.jsonl"

# decoys: 8 asked for in every example (a.jsonl's draws unchanged); a range, each example's count
# drawn (the same bytes twice; 8-8 is 8); a malformed count or range, or a range outside --batch,
# refused with the option named and no file
$st needle make --batch 24 --jsonl "$work/d.jsonl" --seed 7 --model "$model" --lengths 512,1k --decoys 8 -q ||
  fail "batch --decoys 8"
$st needle make --batch 24 --jsonl "$work/d8.jsonl" --seed 7 --model "$model" --lengths 512,1k --decoys 8-8 -q ||
  fail "batch --decoys 8-8"
cmp -s "$work/d.jsonl" "$work/d8.jsonl" || fail "--decoys 8-8 wrote other bytes than --decoys 8"
for f in r r2; do
  $st needle make --batch 32 --jsonl "$work/$f.jsonl" --seed 7 --model "$model" --lengths 512,1k --decoys 1-6 -q ||
    fail "batch --decoys 1-6"
done
cmp -s "$work/r.jsonl" "$work/r2.jsonl" || fail "--decoys 1-6: the same arguments gave different bytes"
for bad in 5-2 0-65 65 1- -3 a-b 2-3x 1-2-3; do
  out=$($st needle make --batch 2 --jsonl "$work/x.jsonl" --seed 1 --model "$model" --decoys "$bad" 2>&1); rc=$?
  [ $rc = 2 ] && grep -q -- "--decoys '$bad'" <<< "$out" || fail "--decoys $bad: rc $rc, '$out'"
done
out=$($st needle make --tokens 1k --position 0.5 --seed 1 --decoys 2-4 2>&1); rc=$?
[ $rc = 2 ] && grep -q "LO-HI are for --batch" <<< "$out" || fail "--decoys 2-4 without --batch: rc $rc, '$out'"
[ -e "$work/x.jsonl" ] && fail "a refused --decoys left $work/x.jsonl"

# composed questions (training only): 0 writes the bytes of no option; a share draws the rest as
# without it (checked below); a share outside [0, 1], a word, --split heldout or no --batch refused
$st needle make --batch 24 --jsonl "$work/c0.jsonl" --seed 7 --model "$model" --lengths 512,1k --composed 0 -q ||
  fail "batch --composed 0"
cmp -s "$work/a.jsonl" "$work/c0.jsonl" || fail "--composed 0 wrote other bytes than no --composed"
$st needle make --batch 24 --jsonl "$work/c.jsonl" --seed 7 --model "$model" --lengths 512,1k --composed 0.5 -q ||
  fail "batch --composed 0.5"
$st needle make --batch 24 --jsonl "$work/cd.jsonl" --seed 7 --model "$model" --lengths 512,1k --composed 1 \
  --decoys 2-6 -q || fail "batch --composed 1 --decoys 2-6"
for bad in 1.5 -0.1 half; do
  out=$($st needle make --batch 2 --jsonl "$work/x.jsonl" --seed 1 --model "$model" --composed "$bad" 2>&1); rc=$?
  [ $rc = 2 ] && grep -q -- "composed" <<< "$out" || fail "--composed $bad: rc $rc, '$out'"
done
out=$($st needle make --batch 2 --jsonl "$work/x.jsonl" --seed 1 --model "$model" --split heldout --composed 0.5 2>&1); rc=$?
[ $rc = 2 ] && grep -q "training wordings" <<< "$out" || fail "--composed with --split heldout: rc $rc, '$out'"
out=$($st needle make --tokens 1k --position 0.5 --seed 1 --composed 0.5 2>&1); rc=$?
[ $rc = 2 ] && grep -q "are for --batch" <<< "$out" || fail "--composed without --batch: rc $rc, '$out'"
[ -e "$work/x.jsonl" ] && fail "a refused --composed left $work/x.jsonl"

# made-up labels (training only): 0 writes the bytes of no option; a share changes the needles'
# labels alone (checked below); refused like --composed
$st needle make --batch 24 --jsonl "$work/l0.jsonl" --seed 7 --model "$model" --lengths 512,1k --open-labels 0 -q ||
  fail "batch --open-labels 0"
cmp -s "$work/a.jsonl" "$work/l0.jsonl" || fail "--open-labels 0 wrote other bytes than no --open-labels"
$st needle make --batch 24 --jsonl "$work/l.jsonl" --seed 7 --model "$model" --lengths 512,1k --open-labels 0.5 -q ||
  fail "batch --open-labels 0.5"
$st needle make --batch 40 --jsonl "$work/l1.jsonl" --seed 9 --model "$model" --lengths 1k --open-labels 1 \
  --decoys 0-3 --composed 0.5 -q || fail "batch --open-labels 1 --decoys 0-3 --composed 0.5"
for bad in 2 -1 some; do
  out=$($st needle make --batch 2 --jsonl "$work/x.jsonl" --seed 1 --model "$model" --open-labels "$bad" 2>&1); rc=$?
  [ $rc = 2 ] && grep -q -- "open-labels" <<< "$out" || fail "--open-labels $bad: rc $rc, '$out'"
done
out=$($st needle make --batch 2 --jsonl "$work/x.jsonl" --seed 1 --model "$model" --split heldout --open-labels 1 2>&1); rc=$?
[ $rc = 2 ] && grep -q "training data" <<< "$out" || fail "--open-labels with --split heldout: rc $rc, '$out'"
out=$($st needle make --tokens 1k --position 0.5 --seed 1 --open-labels 1 2>&1); rc=$?
[ $rc = 2 ] && grep -q "are for --batch" <<< "$out" || fail "--open-labels without --batch: rc $rc, '$out'"
[ -e "$work/x.jsonl" ] && fail "a refused --open-labels left $work/x.jsonl"
out=$($st needle make --tokens 1k --position 0.5 --seed 1 --kind vocab 2>&1); rc=$?
[ $rc = 2 ] && grep -q "tokenizer" <<< "$out" || fail "--kind vocab without a model: rc $rc, '$out'"
# --kinds: a kind named twice is drawn twice as often, up to 64 entries
out=$($st needle make --batch 2 --jsonl "$work/x.jsonl" --seed 1 --model "$model" \
        --kinds "$(printf 'path,%.0s' $(seq 64))host" 2>&1); rc=$?
[ $rc = 2 ] && grep -q "65 entries; at most 64" <<< "$out" || fail "--kinds of 65 entries: rc $rc, '$out'"
[ -e "$work/x.jsonl" ] && fail "a refused --kinds left $work/x.jsonl"
$st needle make --batch 280 --jsonl "$work/weighted.jsonl" --seed 5 --model "$model" --lengths 512 \
  --kinds "$(printf 'path,%.0s' $(seq 13))host" -q || fail "--kinds of 14 entries"

# the assorted kind: drawn only when named (a large default batch has none); with decoys of its
# needle's shape
$st needle make --batch 200 --jsonl "$work/default.jsonl" --seed 12 --model "$model" --lengths 512 -q ||
  fail "a default batch of 200"
$st needle make --batch 96 --jsonl "$work/assorted.jsonl" --seed 12 --model "$model" --lengths 512,1k \
  --kinds assorted --decoys 1-3 -q || fail "an assorted batch"
# the vocab kind: its tokens from the whole vocabulary
$st needle make --batch 120 --jsonl "$work/vocab.jsonl" --seed 12 --model "$model" --lengths 512 --kinds vocab -q ||
  fail "a vocab batch"
# --vocab-tokens: its long values (checked below), and what it refuses, leaving no file
$st needle make --batch 24 --jsonl "$work/vocablong.jsonl" --seed 13 --model "$model" --lengths 1k --kinds vocab \
  --vocab-tokens 48-96 --decoys 0-2 -q || fail "a vocab batch with --vocab-tokens 48-96"
for r in 0-5 5-3 1-161 x; do
  out=$($st needle make --batch 2 --jsonl "$work/x.jsonl" --seed 1 --model "$model" --kinds vocab --vocab-tokens "$r" 2>&1); rc=$?
  [ $rc = 2 ] && grep -q "1 <= LO <= HI <= 160" <<< "$out" || fail "--vocab-tokens $r: rc $rc, '$out'"
done
out=$($st needle make --batch 2 --jsonl "$work/x.jsonl" --seed 1 --model "$model" --kinds path --vocab-tokens 10 2>&1); rc=$?
[ $rc = 2 ] && grep -q "name vocab in --kinds" <<< "$out" || fail "--vocab-tokens without vocab in --kinds: rc $rc, '$out'"
out=$($st needle make --tokens 1k --position 0.5 --seed 1 --model "$model" --vocab-tokens 10 2>&1); rc=$?
[ $rc = 2 ] && grep -q "give --kind vocab" <<< "$out" || fail "--vocab-tokens with --kind path: rc $rc, '$out'"
[ -e "$work/x.jsonl" ] && fail "a refused --vocab-tokens left $work/x.jsonl"

exec /usr/bin/python3 - "$st" "$model" "$work" <<'PY'
import collections, glob, json, os, re, subprocess, sys
st, model, work = sys.argv[1:]
HELD_KINDS, HELD_FAMILIES = {"email", "env"}, {"q5", "q6"}
VALUE = {  # what each kind's value looks like (needle_prompt.h)
    "path": r"/home/dev/projects/[a-z]+-[a-z]+-[0-9a-f]{4}/services/[a-z_]+",
    "host": r"pg-[a-z]+-\d\d\.[a-z0-9-]+\.internal\.[a-z]+-[0-9a-f]{3}\.net",
    "key": r"sk-live-[A-Za-z0-9]{32}", "number": r"[1-9]\d{13}", "ticket": r"[A-Z]{2,4}-\d{2,5}",
    "branch": r"release/[a-z]+-[a-z_]+-\d\.\d{1,2}",
    "url": r"https://artifacts\.[a-z]+\.dev/[a-z_]+/[a-z_]+-[0-9a-f]{4}\.tar\.gz\?build=\d{3,5}",
    "email": r"[a-z]+\.[a-z]+\d{1,2}@[a-z]+-ops\.example\.org", "commit": r"[0-9a-f]{40}",
    "env": r"[A-Z_]+=[A-Za-z0-9]{12}", "random": r"[!-~]{24}",
    "vocab": r"[!#-\[\]-_a-~]{1,96}"}  # printable ASCII but space, quote, backslash, backtick
ASSORTED = {  # the assorted kind's value by its label (needle_prompt.c assorted_value)
    "Build version": r"v\d{1,2}\.\d{1,2}\.\d{1,2}-rc\.\d{1,2}\+build\.\d{3,5}",
    "Service address": r"10\.\d{1,3}\.\d{1,3}\.\d{1,3}:\d{4,5}",
    "Request id": r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
    "Cutover time": r"20\d\d-\d\d-\d\dT\d\d:\d\d:\d\dZ", "Base image": r"ghcr\.io/[a-z]+/[a-z_]+:\d\.\d{1,2}\.\d{1,2}",
    "Bucket ARN": r"arn:aws:s3:::[a-z]+-[a-z_]+-[0-9a-f]{4}", "Escalation phone": r"\+\d\d \d\d \d{4} \d{4}",
    "Device MAC": r"[0-9a-f]{2}(?::[0-9a-f]{2}){5}", "Cleanup schedule": r"\d{1,2} \d{1,2} \* \* [0-2]-[4-6]",
    "Config key": r"[a-z_]+\.[a-z_]+\.[a-z_]+", "Feature flag": r"[a-z_]+_\d{1,3}",
    "Handler class": r"[A-Z][A-Za-z]*Handler\d{1,2}",
    "Export path": r"s3://[a-z]+-[a-z_]+/[a-z_]+/20\d\d/\d\d/part-\d{5}\.parquet",
    "Budget cap": r"EUR \d{1,3},\d{3}\.\d\d", "Site coordinates": r"\d{1,2}\.\d{4}N, \d{1,3}\.\d{4}E",
    "Signing fingerprint": r"SHA256:[A-Za-z0-9+/]{43}"}
VALUE["assorted"] = "|".join(f"(?:{v})" for v in ASSORTED.values())
failures = 0
def bad(msg):
    global failures
    failures += 1
    print("FAIL:", msg)
def decode(ids):
    p = subprocess.run([st, "tokenize", "--model", model, "--decode", "--json"], input=json.dumps(ids).encode(),
                       capture_output=True)
    if p.returncode: raise SystemExit(f"FAIL: decode: {p.stderr.decode()}")
    return json.loads(p.stdout)
def check(path, split):
    seen = []
    for n, line in enumerate(open(path, encoding="utf-8")):
        e = json.loads(line)
        where = f"{os.path.basename(path)}:{n + 1} ({e['kind']}, {e['format']}, {e['family']})"
        seen.append(e)
        if not re.fullmatch(VALUE[e["kind"]], e["value"]): bad(f"{where}: value {e['value']!r} is not a {e['kind']}")
        if e["answer"] != ("</think>" if e["thinking"] else "") + e["needle"] or not e["needle"].endswith(": " + e["value"]):
            bad(f"{where}: needle/answer")
        if decode(e["answer_ids"]) != e["answer"]: bad(f"{where}: answer_ids do not decode to the answer")
        n_ids = len(e["ids"])
        if e["answer_span"] != [n_ids, n_ids + len(e["answer_ids"])]: bad(f"{where}: answer_span {e['answer_span']}")
        prompt = decode(e["ids"]).encode()
        if not prompt.endswith(b"<\xef\xbd\x9cAssistant\xef\xbd\x9c>" + (b"<think>" if e["thinking"] else b"</think>")):
            bad(f"{where}: the prompt does not end in the assistant turn of its mode")
        needle, b = e["needle"].encode(), e["needle_byte"]
        if prompt[b:b + len(needle)] != needle: bad(f"{where}: the needle is not at byte {b}")
        if prompt.count(e["value"].encode()) != 1: bad(f"{where}: the value occurs {prompt.count(e['value'].encode())} times")
        s, t = e["needle_span"]
        before, upto = len(decode(e["ids"][:s]).encode()), len(decode(e["ids"][:t]).encode())
        if not (before <= b < len(decode(e["ids"][:s + 1]).encode()) and upto >= b + len(needle)
                and len(decode(e["ids"][:t - 1]).encode()) < b + len(needle)):
            bad(f"{where}: needle_span {s}:{t} is not the tokens of bytes {b}:{b + len(needle)}")
        if abs(e["position"] - s / n_ids) > 1e-9 or e["tokens"] != n_ids: bad(f"{where}: position/tokens")
        if split == "train" and (e["kind"] in HELD_KINDS or e["family"] in HELD_FAMILIES): bad(f"{where}: held out")
        if split == "heldout" and not (e["kind"] in HELD_KINDS or e["family"] in HELD_FAMILIES):
            bad(f"{where}: neither kind nor family is held out")
        body = e["request"]
        turns = body.get("messages", body.get("input", []))
        system = body.get("instructions") or (body["system"][0]["text"] if "system" in body else turns[0]["content"])
        if e["shape"] == "toollist":
            users = [t for t in turns if t.get("role") == "user"]
            lines = system.split("\n")
            env = lines.index("# Environment") if "# Environment" in lines else -1
            if "tools" in body or len(users) != 1 or len(turns) != len(users) + (e["format"] == "openai-chat"):
                bad(f"{where}: a toollist request has tools or more than one user turn")
            if not (0 < env and any(l.startswith("- ") and ": " in l for l in lines[:env])
                    and any(l.startswith("- ") and ": " in l for l in lines[env:])):
                bad(f"{where}: no one-line tools on both sides of the environment section")
        elif e["shape"] != "agent" or len(turns) < 4:  # task, a round (tool call or pasted output), summary, question
            bad(f"{where}: shape {e['shape']} with {len(turns)} turns")
        req = os.path.join(work, "req.json")
        json.dump(e["request"], open(req, "w", encoding="utf-8"))
        r = subprocess.run([st, "render", "--request", req, "--model", model, "--ids",
                            "--thinking", "on" if e["thinking"] else "off"], capture_output=True)
        if r.returncode or json.loads(r.stdout) != e["ids"]: bad(f"{where}: `sparsetrace render` gives other ids")
    return seen
train = check(os.path.join(work, "a.jsonl"), "train")
held = check(os.path.join(work, "h.jsonl"), "heldout")
if not {e["kind"] for e in held} & HELD_KINDS or not {e["family"] for e in held} & HELD_FAMILIES:
    bad("the held-out split shows no held-out kind or no held-out family")
if len({e["format"] for e in train}) < 3 or len({e["thinking"] for e in train}) < 2: bad("train lacks formats/modes")
combos = 0
for path in sorted(glob.glob(os.path.join(work, "k-*.jsonl"))):
    k, f, s = re.match(r"k-([a-z]+)-(.+)-([a-z]+)\.jsonl", os.path.basename(path)).groups()
    for e in check(path, "heldout" if k in HELD_KINDS else "train"):
        if (e["kind"], e["format"], e["shape"]) != (k, f, s):
            bad(f"{path}: asked {k} {f} {s}, got {e['kind']} {e['format']} {e['shape']}")
    combos += 1
if combos != 78: bad(f"{combos} kind x format x shape files, 78 expected")
if {e["shape"] for e in train} != {"agent", "toollist"}: bad("train lacks a shape")
# decoys: the same examples as without them (kind, format, shape, family, size, position, seed),
# the needle where it was and the size as it was, with up to 8 more lines of its label before the
# needle (fewer where fewer line boundaries precede it), whose values look like the kind's
plain = [json.loads(l) for l in open(f"{work}/a.jsonl")]
with_decoys = [json.loads(l) for l in open(f"{work}/d.jsonl")]
keys = ("kind", "format", "shape", "family", "tokens_requested", "position_requested", "seed", "thinking")
if any("decoys" in e for e in plain): bad("a batch without --decoys wrote a decoys field")
counts = []
for e, p in zip(with_decoys, plain):
    if any(e[k] != p[k] for k in keys): bad(f"--decoys changed example {e['index']}'s draws")
    n = e.get("decoys", -1)
    counts.append(n)
    if not 0 <= n <= 8: bad(f"example {e['index']}: {n} decoys")
    # the needle's place and the prompt's size as without decoys (the decoys are counted while both are searched)
    want = p["tokens_requested"]
    if abs(e["tokens"] - want) > max(abs(p["tokens"] - want), 0.02 * want) + 0.02 * want or \
            abs(e["position"] - p["position"]) > 0.07:
        bad(f"example {e['index']}: {e['tokens']} tokens, needle at {e['position']:.2f} with decoys; "
            f"{p['tokens']}, {p['position']:.2f} without")
    text = decode(e["ids"])
    head = e["needle"].split(": ", 1)[0] + ": "
    vals = [m.group(1) for m in re.finditer(re.escape(head) + "(" + VALUE[e["kind"]] + ")", text)]
    if len(vals) != n + 1 or vals[-1] != e["value"] or len(set(vals)) != n + 1:
        bad(f"example {e['index']}: {n} decoys, the prompt's lines of {head!r}: {vals}")
if counts.count(8) < 8: bad(f"--decoys 8: the counts placed are {counts}")
# --decoys 1-6: the same draws as without decoys again, and counts drawn over the range (each of
# 32 examples placed at most its draw, and counts 1 to 6 all placed: a fixed count fails)
ranged = [json.loads(l) for l in open(f"{work}/r.jsonl")]
plain32 = {e["index"]: e for e in plain}
for e in ranged:
    p = plain32.get(e["index"])
    if p and any(e[k] != p[k] for k in keys): bad(f"--decoys 1-6 changed example {e['index']}'s draws")
    if not 0 <= e.get("decoys", -1) <= 6: bad(f"--decoys 1-6: example {e['index']} placed {e.get('decoys')}")
placed = sorted({e["decoys"] for e in ranged})
if not set(range(1, 7)) <= set(placed): bad(f"--decoys 1-6: the counts placed are {placed}")
# composed: every example as without the option but its question; the composed ones name the
# needle's label and ask for its line, none in a family's own wording, about half of them; with
# decoys every question asks for the most recent line. Spans, ids and rendering as checked above.
def question(e):
    body = e["request"]
    c = body.get("messages", body.get("input", []))[-1]["content"]
    return c if isinstance(c, str) else " ".join(b.get("text", "") for b in c)
family_wordings = {question(e).replace(e["needle"].split(": ", 1)[0], "L").replace(
    e["needle"].split(": ", 1)[0].lower(), "l") for e in train}
composed = check(os.path.join(work, "c.jsonl"), "train")
for e, p in zip(composed, plain):
    where = f"c.jsonl example {e['index']}"
    if any(e[k] != p[k] for k in keys if k != "family") or e["needle"] != p["needle"]:
        bad(f"{where}: --composed changed the example's draws")
    label = e["needle"].split(": ", 1)[0]
    if e["family"] == "composed":
        q = question(e)
        if f'"{label}' not in q or q.replace(label, "L").replace(label.lower(), "l") in family_wordings:
            bad(f"{where}: composed question {q!r} does not name {label!r} or is a family's wording")
    elif e["family"] != p["family"] or question(e) != question(p):
        bad(f"{where}: not composed, yet its question differs from the example without --composed")
n_composed = sum(e["family"] == "composed" for e in composed)
if not 6 <= n_composed <= 18: bad(f"--composed 0.5: {n_composed} of {len(composed)} composed")
for e in check(os.path.join(work, "cd.jsonl"), "train"):
    if e["family"] != "composed" or not re.search(r"\b(last|most recent|newest|latest|current|final)\b", question(e)):
        bad(f"cd.jsonl example {e['index']}: --composed 1 --decoys 2-6 asked {question(e)!r} ({e['family']})")
# made-up labels: the same draws and values; the others' needles unchanged; the made-up ones no
# kind's label (held-out kinds' included: `needle make` of each kind, below), each holding a
# word found nowhere else in its prompt, named by the question, on every decoy line too
kind_labels = {e["needle"].split(": ", 1)[0] for path in glob.glob(os.path.join(work, "k-*.jsonl"))
               for e in map(json.loads, open(path)) if e["kind"] not in ("assorted", "vocab")}
if len(kind_labels) != 11: bad(f"the kinds' own labels: {sorted(kind_labels)}")
kind_labels |= set(ASSORTED)
opened, fresh = {"l.jsonl": 0, "l1.jsonl": 0}, 0
for name, plain_of in (("l.jsonl", plain), ("l1.jsonl", [None] * 40)):
    for e, p in zip(check(os.path.join(work, name), "train"), plain_of):
        where = f"{name} example {e['index']} ({e['needle'][:40]!r})"
        label, value = e["needle"].split(": ", 1)
        if p and (any(e[k] != p[k] for k in keys) or value != p["value"]):
            bad(f"{where}: --open-labels changed the example's draws or value")
        if label in kind_labels:
            if p and e["needle"] != p["needle"]: bad(f"{where}: a kind's label, yet another needle")
            continue
        opened[name] += 1
        text = decode(e["ids"]).replace(question(e), "")
        lines = re.findall(re.escape(label) + r": [^\n]*", text)
        rest = re.sub(re.escape(label) + r": [^\n]*", "", text)
        fresh += any(not re.search(r"\b" + re.escape(w) + r"\b", rest, re.I) for w in label.split())
        if label not in question(e):
            bad(f"{where}: the question {question(e)!r} does not name its label")
        if len(lines) != e.get("decoys", 0) + 1 or not lines[-1].startswith(e["needle"]):
            bad(f"{where}: {len(lines)} lines of the label, {e.get('decoys', 0)} decoys placed")
if not 6 <= opened["l.jsonl"] <= 18 or opened["l1.jsonl"] != 40:
    bad(f"made-up labels: {opened['l.jsonl']} of 24 at 0.5, {opened['l1.jsonl']} of 40 at 1")
opened = sum(opened.values())
if fresh < 0.8 * opened: bad(f"only {fresh} of {opened} made-up labels hold a word found nowhere else in the prompt")
# the assorted kind: a default batch of 200 draws the nine trained kinds and never it; its own
# batch every one of its 16 labels, each value of its label's shape, every decoy line (the
# needle's label) of that shape too
kinds = {json.loads(l)["kind"] for l in open(os.path.join(work, "default.jsonl"))}
if kinds != {"path", "host", "key", "number", "ticket", "branch", "url", "commit", "random"}:
    bad(f"a default train batch of 200 drew the kinds {sorted(kinds)}")
labels_seen = set()
for e in map(json.loads, open(os.path.join(work, "assorted.jsonl"))):
    label, value = e["needle"].split(": ", 1)
    labels_seen.add(label)
    if label not in ASSORTED or not re.fullmatch(ASSORTED[label], value):
        bad(f"assorted example {e['index']}: {e['needle']!r}"); continue
    text = decode(e["ids"]).replace(question(e), "")
    lines = len(re.findall(re.escape(label) + ": ", text))
    shaped = re.findall(re.escape(label) + ": (" + ASSORTED[label] + ")", text)
    if not lines == len(shaped) == e["decoys"] + 1 or shaped[-1] != value:
        bad(f"assorted example {e['index']}: {e['decoys']} decoys, {lines} lines of {label!r}, of its shape {shaped}")
if labels_seen != set(ASSORTED): bad(f"96 assorted examples: labels {sorted(labels_seen)}")
# the vocab kind: labels of word pieces, none a held-out kind's, each once in its prompt (the first
# 40 examples, with the spans, ids and rendering checked above); its 120 needles copy at least
# twice the distinct tokens of a default batch's first 120 (the kind's reason)
def distinct(path):
    ids = set()
    for e in map(json.loads, open(path).readlines()[:120]):
        s, t = e["needle_span"]
        ids.update(e["ids"][s:t])
    return len(ids)
open(os.path.join(work, "vocab40.jsonl"), "w").writelines(open(os.path.join(work, "vocab.jsonl")).readlines()[:40])
for e in check(os.path.join(work, "vocab40.jsonl"), "train"):
    label = e["needle"].split(": ", 1)[0]
    text = decode(e["ids"]).replace(question(e), "")
    if not re.fullmatch(r"[A-Z][A-Za-z -]*", label) or re.search(r"on-call contact|environment variable|branch",
                                                                  label, re.I) or text.count(label + ": ") != 1:
        bad(f"vocab example {e['index']}: label {label!r}, {text.count(label + ': ')} lines of it")
vocab_ids, default_ids = distinct(os.path.join(work, "vocab.jsonl")), distinct(os.path.join(work, "default.jsonl"))
if vocab_ids < 2 * default_ids: bad(f"120 vocab needles hold {vocab_ids} distinct tokens, a default batch's {default_ids}")
# --vocab-tokens 48-96: spans, ids, rendering and decoys checked as every batch's, with values of up
# to 639 bytes; its lines hold 48 tokens or more on average (the draws' mean is 72, and the label
# adds two or three; pieces joined may tokenize as fewer), and some value is past the default's 96 bytes
VALUE["vocab"] = r"[!#-\[\]-_a-~]{1,639}"
long = check(os.path.join(work, "vocablong.jsonl"), "train")
spans = [e["needle_span"][1] - e["needle_span"][0] for e in long]
if len(long) != 24 or sum(spans) < 48 * len(spans) or max(len(e["value"]) for e in long) <= 96:
    bad(f"--vocab-tokens 48-96: {len(long)} examples, line tokens {spans}, values up to "
        f"{max(len(e['value']) for e in long)} bytes")
weighted = collections.Counter(json.loads(l)["kind"] for l in open(os.path.join(work, "weighted.jsonl")))
if set(weighted) != {"path", "host"} or not 5 <= weighted["host"] <= 45:  # binomial(280, 1/14): 20 +- 4.4
    bad(f"--kinds path x13,host: drew {dict(weighted)}")
if failures: sys.exit(1)
print(f"--composed: {n_composed} of 24 composed; --open-labels: {opened} made-up labels, {fresh} with a word "
      "found nowhere else in their prompt")
print(f"{len(train)} train and {len(held)} held-out examples, and all {combos} kinds x formats x shapes: spans, answers, "
      "held-out lists and `sparsetrace render` ids check")
PY
