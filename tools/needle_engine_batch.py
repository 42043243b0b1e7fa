#!/usr/bin/env python3
"""The engine's greedy answers to `sparsetrace needle make --batch` examples: each example's
prompt ids go through `sparsetrace run` (no taps), and it passes when the answer holds the
needle's value verbatim, as `needle sweep` counts. Prints one line per example (kind, question
family, mode, the needle, the answer) and the passes by family and by kind.

  tools/needle_engine_batch.py FILE.jsonl --model DIR [--model DIR ...] [--st BIN] [--max-new-tokens N]
                               [--backend B] [--question TEMPLATE] [--kinds LIST] [--set KEY=VALUE ...]

With several --model, each example is answered by each model: its line holds every model's
verdict in order, then each missing model's answer; the totals give a column per model, and the
last lines name the examples each later model passes and fails against the first (a candidate
against the release: what it gains and what it loses).

--question asks every example TEMPLATE instead of its own question ({label}: the needle's label,
{lower}: the same in lower case, {question}: the example's own question, {needle}: its needle
line); the request is rendered again (`sparsetrace render`), so the same prompts can be asked in
several wordings, and '{question}\n\n{needle}' puts a second copy of the line right before the
answer, inside the sliding window: whether a miss belongs to reaching the line or to copying it.
--relabel LABEL puts LABEL in place of the
needle's label wherever the request says it (the question included), rendered again: whether a
miss belongs to the label's words or to the kind's values. --kinds: only the examples of these kinds. --set:
the engine's settings for every run (`sparsetrace run --set`, repeatable): topk=all tells a miss
of the indexer's choice from a miss of the answer itself.

Used for what the card's teacher-forced evaluations cannot show: what the model writes instead
(bench/needle-train-results.md). Each example is one engine run, about a second at 1k tokens on
two cores; --jobs N runs N at once (the cores shared among them unless --threads), the output the
same. tests/test_needle_engine_batch.sh holds its verdicts to the engine run directly."""
import argparse
import collections
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import threading


def last_turn(request):
    """The request's last message (its question), whatever its format: messages or Responses input."""
    return (request.get("messages") or request.get("input"))[-1]


def question_of(request):
    """The text of the request's last user message (its question)."""
    content = last_turn(request)["content"]
    return content if isinstance(content, str) else next(b["text"] for b in content if "text" in b)


def ask(request, question):
    """The request with its last user message's text replaced by question (a string content, or
    the text of its text blocks)."""
    last = last_turn(request)
    if isinstance(last["content"], str):
        last["content"] = question
    else:
        for block in last["content"]:
            if "text" in block:
                block["text"] = question
    return request


def relabel(request, old, new):
    """The request with every occurrence of the label old, as written and in lower case, replaced
    by new (likewise) in every text it holds, whatever its format: messages, an Anthropic
    `system`, Responses `instructions`, tool results. Identifiers and names (KEEP_KEYS) are left
    as they are."""
    def walk(x, key=None):
        if isinstance(x, str):
            return x if key in KEEP_KEYS else x.replace(old, new).replace(old.lower(), new.lower())
        if isinstance(x, list):
            return [walk(v, key) for v in x]
        if isinstance(x, dict):
            return {k: walk(v, k) for k, v in x.items()}
        return x
    return walk(request)


KEEP_KEYS = {"model", "role", "type", "id", "call_id", "tool_use_id", "tool_call_id", "name"}


def rerender(args, request, thinking, work):
    path = os.path.join(work, "request.json")
    json.dump(request, open(path, "w"))
    r = subprocess.run([args.st, "render", "--request", path, "--model", args.model[0], "--ids", "--thinking",
                        "on" if thinking else "off"], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"sparsetrace render failed: {r.stderr.strip()[-300:]}")
    return json.loads(r.stdout)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("jsonl")
    ap.add_argument("--model", required=True, action="append", help="a model directory (repeatable: compared)")
    ap.add_argument("--st", default=os.environ.get("ST_BIN", "build/sparsetrace"))
    ap.add_argument("--max-new-tokens", type=int, default=48), ap.add_argument("--backend", default="cpu")
    ap.add_argument("--question", help="ask this instead ({label}, {lower}, {question}, {needle})")
    ap.add_argument("--relabel", help="the needle's label replaced by this one wherever the request says it "
                                      "(as written and in lower case), then rendered again")
    ap.add_argument("--kinds", help="only these kinds, comma-separated")
    ap.add_argument("--retrieval", action="store_true", help="per CSA layer, whether its indexer retrieves the "
                                                             "needle, counted among passes and misses")
    ap.add_argument("--threads", type=int, help="the engine's threads (`sparsetrace run --threads`; default: "
                                                "the cores shared among the --jobs)")
    ap.add_argument("--jobs", type=int, default=1, help="examples run at once (default 1); the output is the "
                                                        "same, in the same order")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an engine setting (repeatable)")
    args = ap.parse_args(argv)
    if args.retrieval and args.question and "{needle}" in args.question:
        sys.exit("needle_engine_batch: --retrieval with a question that repeats the needle: the engine "
                 "judges the line it finds by its text, and the prompt holds two")
    tokenizers = {tokenizer_bytes(m) for m in args.model}
    if len(tokenizers) > 1:
        sys.exit("needle_engine_batch: the models' tokenizer.json differ: one prompt's ids cannot be "
                 "asked of all of them")
    names = [os.path.basename(os.path.normpath(m)) for m in args.model]
    if len(set(names)) < len(names):
        names = args.model
    passed = collections.defaultdict(lambda: [[0] * len(args.model), 0])
    verdicts = []  # (index, kind, [ok per model])
    # retrieval[model][layer][ok]: [examples whose answer was ok (or not) where the layer retrieves, examples]
    retrieval = [collections.defaultdict(lambda: {True: [0, 0], False: [0, 0]}) for _ in args.model]
    if args.jobs < 1:
        sys.exit("needle_engine_batch: --jobs must be at least 1")
    if args.threads is None:
        args.threads = threads_per_job(args.jobs)
    examples = [e for e in map(json.loads, open(args.jsonl, encoding="utf-8"))
                if not args.kinds or e["kind"] in args.kinds.split(",")]
    with tempfile.TemporaryDirectory() as work, concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        mine = threading.local()

        def answered(e):
            """The example as asked, and each model's run of it, in a work directory of this thread's."""
            if not hasattr(mine, "work"):
                mine.work = tempfile.mkdtemp(dir=work)
            return answer_example(args, e, mine.work)

        # map yields in order; a run that fails (one the engine refused) raises here, and map
        # cancels the examples not yet started
        for e, runs in pool.map(answered, examples):
            answers = [r["text"] for r in runs]
            oks = [passes(e, a) for a in answers]
            for i, (r, ok) in enumerate(zip(runs, oks)):
                for layer in (r.get("needle") or {}).get("layers", []):  # only with --retrieval
                    count = retrieval[i][layer["layer"]][ok]
                    count[0] += bool(layer["retrieves"])
                    count[1] += 1
            verdicts.append((e["index"], e["kind"], oks))
            for key in ("family " + e["family"], "kind " + e["kind"], "all"):
                for i, ok in enumerate(oks):
                    passed[key][0][i] += ok
                passed[key][1] += 1
            head = example_line(e, oks)
            if len(answers) == 1:
                print(f"{head} -> {answers[0][:90]!r}", flush=True)
                continue
            print(head, flush=True)
            for name, ok, answer in zip(names, oks, answers):
                if not ok:
                    print(f"      {name}: {answer[:90]!r}", flush=True)
    if len(names) > 1:
        print("models: " + " ".join(names))
    for key in sorted(passed, key=lambda k: (k == "all", k)):
        hits, n = passed[key]
        print(f"{key}: " + " ".join(f"{h}/{n}" for h in hits))
    if args.retrieval:
        print("retrieval (a CSA layer retrieves the needle when its top-k keeps it at more than half of the "
              "answer positions):")
        for name, layers in zip(names, retrieval):
            for layer in sorted(layers):
                (rp, np), (rm, nm) = layers[layer][True], layers[layer][False]
                print(f"  {name} layer {layer}: retrieves in {rp}/{np} passes, {rm}/{nm} misses")
    for i, name in enumerate(names[1:], 1):
        gains = [f"{idx} {kind}" for idx, kind, oks in verdicts if oks[i] and not oks[0]]
        losses = [f"{idx} {kind}" for idx, kind, oks in verdicts if oks[0] and not oks[i]]
        print(f"{name} against {names[0]}: passes {len(gains)} it fails ({', '.join(gains) or 'none'}); "
              f"fails {len(losses)} it passes ({', '.join(losses) or 'none'})")


def answer_example(args, e, work):
    """The example as asked (--relabel, --question: its request rendered again) and each model's
    greedy run on its ids (with --retrieval, judged on its needle), using the directory work."""
    ids = e["ids"]
    label = e["needle"].split(": ", 1)[0]
    if args.relabel:
        e["request"] = relabel(e["request"], label, args.relabel)
        e["needle"] = args.relabel + e["needle"][len(label):]
        label = args.relabel
    if args.question:
        e["request"] = ask(e["request"], args.question.format(label=label, lower=label.lower(),
                                                              question=question_of(e["request"]), needle=e["needle"]))
    needle = ["--needle-tokens", "%d:%d" % tuple(e["needle_span"])]
    if args.question or args.relabel:
        ids = rerender(args, e["request"], e["thinking"], work)
        needle = ["--needle", e["needle"]]
    prompt = os.path.join(work, "prompt.json")
    json.dump(ids, open(prompt, "w"))
    return e, [run_of(args, model, prompt, work, e["index"], needle if args.retrieval else [])
               for model in args.model]


def example_line(example, oks):
    """An example's line: its index, kind, question family and mode, each model's verdict (PASS or
    miss, in order) and the needle."""
    e = example
    return (f"{e['index']:3d} {e['kind']:7s} {e['family']:8s} {'thinking' if e['thinking'] else 'chat':8s} "
            f"{' '.join('PASS' if ok else 'miss' for ok in oks)}  {e['needle'][:60]!r}")


def passes(example, answer):
    """An answer passes when it holds the needle's value verbatim, as `needle sweep` counts."""
    return example["value"] in answer


def threads_per_job(jobs):
    """The engine's --threads for each of jobs runs at once: the cores shared among them (None, the
    engine's default of every core, for one)."""
    return max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else None


def tokenizer_bytes(model):
    try:
        with open(os.path.join(model, "tokenizer.json"), "rb") as f:
            return f.read()
    except OSError as e:
        sys.exit(f"needle_engine_batch: {model}: {e.strerror} (tokenizer.json)")


def answer_of(args, model, prompt, work, index):
    """The engine's greedy answer (text) to the prompt ids in the file prompt."""
    return run_of(args, model, prompt, work, index)["text"]


def run_of(args, model, prompt, work, index, needle=()):
    """The engine's greedy run on the prompt ids in the file prompt (`sparsetrace run --json`: its
    answer in "text"; with needle, `--needle-tokens A:B` or `--needle TEXT`, its per-layer verdicts
    in "needle")."""
    r = subprocess.run([args.st, "run", "--model", model, "--prompt-tokens", prompt, "--backend",
                        args.backend, "--max-new-tokens", str(args.max_new_tokens), "--store", work,
                        "-o", os.path.join(work, "run.h5"), "--force", "--json", "-q"]
                       + [a for kv in args.set for a in ("--set", kv)]
                       + (["--threads", str(args.threads)] if getattr(args, "threads", None) else [])
                       + list(needle), capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"example {index}: sparsetrace run failed ({model}): {r.stderr.strip()[-300:]}")
    return json.loads(r.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
