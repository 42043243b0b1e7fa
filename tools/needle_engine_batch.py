#!/usr/bin/env python3
"""The engine's greedy answers to `sparsetrace needle make --batch` examples: each example's
prompt ids go through `sparsetrace run` (no taps), and it passes when the answer holds the
needle's value verbatim, as `needle sweep` counts. Prints one line per example (kind, question
family, mode, the needle, the answer) and the passes by family and by kind.

  tools/needle_engine_batch.py FILE.jsonl --model DIR [--st BIN] [--max-new-tokens N] [--backend B]
                               [--question TEMPLATE] [--kinds LIST] [--set KEY=VALUE ...]

--question asks every example TEMPLATE instead of its own question ({label}: the needle's label,
{lower}: the same in lower case); the request is rendered again (`sparsetrace render`), so the
same prompts can be asked in several wordings. --kinds: only the examples of these kinds. --set:
the engine's settings for every run (`sparsetrace run --set`, repeatable): topk=all tells a miss
of the indexer's choice from a miss of the answer itself.

Used for what the card's teacher-forced evaluations cannot show: what the model writes instead
(bench/needle-train-results.md). Each example is one engine run, about a second at 1k tokens on
two cores. tests/test_needle_engine_batch.sh holds its verdicts to the engine run directly."""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile


def ask(request, question):
    """The request with its last user message's text replaced by question (a string content, or
    the text of its text blocks)."""
    turns = request.get("messages") or request.get("input")
    last = turns[-1]
    if isinstance(last["content"], str):
        last["content"] = question
    else:
        for block in last["content"]:
            if "text" in block:
                block["text"] = question
    return request


def rerender(args, request, thinking, work):
    path = os.path.join(work, "request.json")
    json.dump(request, open(path, "w"))
    r = subprocess.run([args.st, "render", "--request", path, "--model", args.model, "--ids", "--thinking",
                        "on" if thinking else "off"], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"sparsetrace render failed: {r.stderr.strip()[-300:]}")
    return json.loads(r.stdout)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("jsonl"), ap.add_argument("--model", required=True)
    ap.add_argument("--st", default=os.environ.get("ST_BIN", "build/sparsetrace"))
    ap.add_argument("--max-new-tokens", type=int, default=48), ap.add_argument("--backend", default="cpu")
    ap.add_argument("--question", help="ask this instead ({label}, {lower})")
    ap.add_argument("--kinds", help="only these kinds, comma-separated")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an engine setting (repeatable)")
    args = ap.parse_args(argv)
    passed = collections.defaultdict(lambda: [0, 0])
    with tempfile.TemporaryDirectory() as work:
        prompt = os.path.join(work, "prompt.json")
        for line in open(args.jsonl, encoding="utf-8"):
            e = json.loads(line)
            if args.kinds and e["kind"] not in args.kinds.split(","):
                continue
            ids = e["ids"]
            if args.question:
                label = e["needle"].split(": ", 1)[0]
                ids = rerender(args, ask(e["request"], args.question.format(label=label, lower=label.lower())),
                               e["thinking"], work)
            json.dump(ids, open(prompt, "w"))
            r = subprocess.run([args.st, "run", "--model", args.model, "--prompt-tokens", prompt, "--backend",
                                args.backend, "--max-new-tokens", str(args.max_new_tokens), "--store", work,
                                "-o", os.path.join(work, "run.h5"), "--force", "--json", "-q"]
                               + [a for kv in args.set for a in ("--set", kv)],
                               capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"example {e['index']}: sparsetrace run failed: {r.stderr.strip()[-300:]}")
            answer = json.loads(r.stdout)["text"]
            ok = e["value"] in answer
            for key in ("family " + e["family"], "kind " + e["kind"], "all"):
                passed[key][0] += ok
                passed[key][1] += 1
            print(f"{e['index']:3d} {e['kind']:7s} {e['family']:8s} {'thinking' if e['thinking'] else 'chat':8s} "
                  f"{'PASS' if ok else 'miss'}  {e['needle'][:60]!r} -> {answer[:90]!r}", flush=True)
    for key in sorted(passed, key=lambda k: (k == "all", k)):
        print(f"{key}: {passed[key][0]}/{passed[key][1]}")


if __name__ == "__main__":
    main(sys.argv[1:])
