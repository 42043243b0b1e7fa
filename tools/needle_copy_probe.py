#!/usr/bin/env python3
"""Where the needle model's copying breaks, token by token. Each `sparsetrace needle make --batch`
example's prompt and its expected answer go through the engine once, teacher-forced (`sparsetrace
run` with the logits tap over the answer), and every token of the needle line that the answer
copies is scored: is it the engine's argmax there? Greedy decoding writes the answer exactly when
every one of them (and the answer's tokens before the line) is, so the first wrong token is where
a greedy answer leaves the line; the tokens after it show how often the copy would slip again.

  tools/needle_copy_probe.py FILE.jsonl --model DIR [--model DIR ...] [--st BIN] [--backend B]
                             [--kinds LIST] [--set KEY=VALUE ...] [--trained FILE.jsonl ...] [--json OUT]

Prints, for each model side by side: the needle tokens scored and the share wrong, the examples
with a wrong token, and the wrong share by the token's index in the line (in eights), by the
place of its source token in its compressed row (prompt position mod the CSA layers' compression
ratio), by kind, where each example's first wrong token falls, and what the engine wrote instead
of each wrong token (SLIPS: the line's next token, a skip; its previous one, a repeat; another
of its tokens; the end of the answer; a token from elsewhere in the prompt; one the prompt does not
hold), and, with --trained (training examples in the same JSONL), by how many of their needle
lines held the token: a model copies the tokens it was trained to copy. --json writes every
scored token ({model, example, kind, index: in the line, source: its prompt position,
answer_index, wrong, predicted: the argmax token, slip: its class or null, trained: that count or
null}).

Used for what a pass/miss count cannot show: whether a model loses a long random value from its
start, at the compressed rows' boundaries or further along it (bench/needle-train-results.md).
tests/test_needle_copy_probe.sh holds its first wrong tokens to the engine's greedy answers."""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sparsetrace_read  # noqa: E402  (h5py + numpy)


def compress_ratio(config):
    """The CSA layers' compression ratio from the engine's config.json (4 in DeepSeek-V4)."""
    small = [r for r in config.get("compress_ratios", []) if r > 1]
    return min(small) if small else 4


def needle_in_answer(needle, answer):
    """Where the prompt's needle tokens start in the answer's ids: (answer index, the first needle
    token it holds, how many). The answer holds them verbatim, or all but the first or the last,
    which the prompt's tokenizer may have merged with the text before or after the line."""
    for skip, drop in ((0, 0), (1, 0), (0, 1), (1, 1)):
        part = needle[skip:len(needle) - drop]
        for k in range(len(answer) - len(part) + 1):
            if answer[k:k + len(part)] == part:
                return k, skip, len(part)
    return None, None, None


SLIPS = ("the line's next token (a skip)", "the line's previous token (a repeat)",
         "another token of the line", "the end of the answer", "a token from elsewhere in the prompt",
         "a token the prompt does not hold")


def slip(predicted, i, line, prompt, eos):
    """What a wrong token is (one of SLIPS), the argmax `predicted` where the line's token `i` was
    due: a position slip along the line, or a token taken from somewhere else."""
    if i + 1 < len(line) and predicted == line[i + 1]:
        return SLIPS[0]
    if i >= 1 and predicted == line[i - 1]:
        return SLIPS[1]
    if predicted in line:
        return SLIPS[2]
    if predicted == eos:
        return SLIPS[3]
    return SLIPS[4] if predicted in prompt else SLIPS[5]


def trained_counts(paths):
    """How many times each token id is a needle line's token in these `needle make --batch` JSONL
    files (the needle_span of each example's ids)."""
    counts = collections.Counter()
    for path in paths:
        for line in open(path, encoding="utf-8"):
            if line.strip():
                e = json.loads(line)
                counts.update(e["ids"][slice(*e["needle_span"])])
    return counts


TRAINED_VIEW = "times a trained needle held it"


def times_bin(n):
    """The bin of a token's count in the --trained needles, named so that they sort in order."""
    return "0 (never)" if n == 0 else "1-9" if n < 10 else "10-99" if n < 100 else "100+"


def eighths(i):
    """The bin of eight an index falls in, as ' 16-23'."""
    return f"{i // 8 * 8:3d}-{i // 8 * 8 + 7}"


def score(args, model, example, work):
    """The example's scored tokens, [(index in the needle line, source position, answer index,
    wrong)], and whether an answer token before the line is already wrong."""
    ids, answer = example["ids"], example["answer_ids"]
    start, end = example["needle_span"]
    k0, skip, count = needle_in_answer(ids[start:end], answer)
    if k0 is None:
        return None, None
    prompt = os.path.join(work, "prompt.json")
    trace = os.path.join(work, "run.h5")
    json.dump(ids + answer, open(prompt, "w"))
    # logits row i predicts token i + 1: the answer's tokens are predicted at n-1 .. n-2+len(answer)
    n = len(ids)
    r = subprocess.run([args.st, "run", "--model", model, "--prompt-tokens", prompt, "--backend", args.backend,
                        "--tap", "logits", "--positions", f"{n - 1}:{n - 1 + len(answer)}", "--store", work,
                        "-o", trace, "--force", "-q"] + [a for kv in args.set for a in ("--set", kv)],
                       capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"example {example['index']}: sparsetrace run failed: {r.stderr.strip()[-300:]}")
    tap = sparsetrace_read.read_tap(trace, "logits")
    if list(tap.positions) != list(range(n - 1, n - 1 + len(answer))):
        sys.exit(f"example {example['index']}: the logits tap holds positions {tap.positions[:3]}..., "
                 f"not {n - 1}..{n - 2 + len(answer)}")
    best = tap.array.argmax(axis=1)
    prefix_wrong = any(best[k] != answer[k] for k in range(k0))
    tokens = [(skip + m, start + skip + m, k0 + m, int(best[k0 + m] != answer[k0 + m]), int(best[k0 + m]))
              for m in range(count)]
    return tokens, prefix_wrong


def share(wrong, total):
    return f"{wrong}/{total} {100.0 * wrong / total:5.1f}%" if total else "-"


def table(title, keys, cells, models):
    """One row per key, one column per model: 'wrong/total share'."""
    width = max(len(title), *(len(str(k)) for k in keys)) if keys else len(title)
    names = [os.path.basename(m.rstrip("/")) for m in models]
    cols = [max(18, len(name)) for name in names]
    print(f"{title:<{width}}  " + "  ".join(f"{name:>{c}}" for name, c in zip(names, cols)))
    for k in keys:
        print(f"{str(k):<{width}}  " + "  ".join(f"{share(*cells[m].get(k, (0, 0))):>{c}}"
                                                  for m, c in zip(models, cols)))
    print()


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("jsonl")
    ap.add_argument("--model", action="append", required=True, help="a model directory (repeatable)")
    ap.add_argument("--st", default=os.environ.get("ST_BIN", "build/sparsetrace"))
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--kinds", help="only these kinds, comma-separated")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an engine setting (repeatable)")
    ap.add_argument("--trained", action="append", default=[], metavar="FILE.jsonl",
                    help="training examples (needle make --batch JSONL, repeatable): the wrong share by how many "
                         "of their needle lines held the token")
    ap.add_argument("--json", help="write every scored token here")
    args = ap.parse_args(argv)
    trained = trained_counts(args.trained) if args.trained else None
    examples = [json.loads(line) for line in open(args.jsonl, encoding="utf-8") if line.strip()]
    if args.kinds:
        examples = [e for e in examples if e["kind"] in args.kinds.split(",")]
    records = []
    names = ("all", "index in the line", "place in its compressed row", "kind") \
        + ((TRAINED_VIEW,) if trained is not None else ()) + ("first wrong token at index", "what the wrong token is")
    views = collections.OrderedDict((name, {m: collections.defaultdict(lambda: [0, 0]) for m in args.model})
                                    for name in names)
    summary = {}
    with tempfile.TemporaryDirectory() as work:
        for model in args.model:
            with open(os.path.join(model, "config.json")) as f:
                config = json.load(f)
            ratio, eos = compress_ratio(config), config.get("eos_token_id", 1)
            v = {name: views[name][model] for name in views}
            examples_wrong = prefix_wrong_n = skipped = 0
            for e in examples:
                tokens, prefix_wrong = score(args, model, e, work)
                if tokens is None:
                    skipped += 1
                    continue
                prefix_wrong_n += prefix_wrong
                first = next((i for i, _, _, w, _ in tokens if w), None)
                examples_wrong += first is not None
                if first is not None:
                    v["first wrong token at index"][eighths(first)][0] += 1
                line = e["ids"][slice(*e["needle_span"])]
                for i, src, k, w, pred in tokens:
                    held = None if trained is None else trained[e["ids"][src]]
                    keys = [("all", "all"), ("index in the line", eighths(i)),
                            ("place in its compressed row", f"{src % ratio} of {ratio}"), ("kind", e["kind"])]
                    if held is not None:
                        keys.append((TRAINED_VIEW, times_bin(held)))
                    for name, key in keys:
                        v[name][key][0] += w
                        v[name][key][1] += 1
                    what = slip(pred, i, line, e["ids"], eos) if w else None
                    if what:
                        v["what the wrong token is"][what][0] += 1
                    records.append({"model": model, "example": e["index"], "kind": e["kind"], "index": i,
                                    "source": src, "answer_index": k, "wrong": w, "predicted": pred,
                                    "slip": what, "trained": held})
            for cell in v["first wrong token at index"].values():
                cell[1] = examples_wrong
            for cell in v["what the wrong token is"].values():
                cell[1] = v["all"]["all"][0]
            summary[model] = (examples_wrong, len(examples) - skipped, prefix_wrong_n, skipped)
    for model in args.model:
        examples_wrong, scored, prefix_wrong_n, skipped = summary[model]
        print(f"{model}: {share(*views['all'][model]['all'])} of the needle tokens wrong; "
              f"{examples_wrong} of {scored} examples with a wrong token"
              + (f"; {prefix_wrong_n} with a wrong token before the line" if prefix_wrong_n else "")
              + (f"; {skipped} skipped (the answer does not hold the needle's tokens)" if skipped else ""))
    print()
    for name in list(views)[1:]:
        keys = sorted({k for m in args.model for k in views[name][m]},
                      key=SLIPS.index if name == "what the wrong token is" else None)
        table(name, keys, views[name], args.model)
    if args.json:
        json.dump(records, open(args.json, "w"))


if __name__ == "__main__":
    main(sys.argv[1:])
