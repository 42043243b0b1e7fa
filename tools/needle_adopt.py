#!/usr/bin/env python3
"""Whether a trained needle model replaces the release. Both answer the adoption sets in the
engine (greedy, `sparsetrace run`, each example asked as tools/needle_engine_batch.py asks it),
and one rule reads the paired verdicts.

  tools/needle_adopt.py CANDIDATE [--release DIR] [--sets NAME,...] [--first N] [--st BIN]
                        [--jobs N] [--work DIR] [--answers FILE] [--no-demo]
  tools/needle_adopt.py --list     the sets, each with its `needle make` command
  tools/needle_adopt.py --seeds    the `needle make` seeds of every set the bench evaluates on
                                   (tools/train_needle_gpu.sh's cdata refuses them for training)

The rule (`verdict`). On each set, the candidate's gains are the examples it passes and the
release fails, its losses the reverse. If the two models were equally good, each such example
would be a fair coin, so the exact one-sided sign test gives p(worse) = P(X >= losses) and
p(better) = P(X >= gains), X ~ Binomial(gains + losses, 1/2). A set tells the models apart when
that p is below ALPHA divided by the number of sets asked (Bonferroni: ALPHA over all of them).
The candidate is adopted when it is better on some set and worse on none. When it is worse on any
set, the release is kept. Otherwise no set tells them apart, and the release is kept too.
An adopted candidate is released only when its card adopts it as well: `tools/train_needle.py
compare` applies this same rule to the card's evaluations, each case paired by prompt (the card
step of tools/train_needle_gpu.sh writes it). The sets here are the engine's; the card's are the
fast forward's to 32k, and a line has passed these and lost there (bench, tenth session).

The demo gate (`demo`). Item 5 of the model's issue, which the release meets, is asked of the
candidate too: tools/demo.sh on it runs to its end (its bisect names the layer whose needle verdict
rotate=q flips), and its recall sweep passes at least DEMO_TRAINED_MIN of its 16 as trained and at
most DEMO_Q_MAX under rotate=q. An adopted candidate that fails it is kept out (line L copied better
on eight sets and its layer 5 kept the needle at 12 of 17 positions under rotate=q: no flip).
--no-demo leaves the demo out (the table alone).

The engine is deterministic, so each model's answers are kept in WORK/answers (default
/tmp/needle-adopt), one file per model, set and engine, keyed by the bytes of the model and the
set and by the engine's build (`--version`: its sources, compiler and build type, so that a
commit touching only models, docs or tools keeps the answers; a build whose sources were modified,
or one too old to name them, by its binary's bytes), and written after every example: the release is run once, a candidate only for
itself, and a run stopped midway goes on where it stopped. --jobs N runs N engines at once, each
with --threads (cores / N) (the answers do not depend on it). --first N asks only each set's first
N examples (a quick look: its verdict is said to be partial). --answers writes every example's
verdicts and each miss's answer, as needle_engine_batch prints them. Under the table, each set of
several needle kinds gets a `by kind` line (release -> candidate passes of each kind's examples):
the rule reads only the sets' rows. About 9 minutes a model for
nine of the ten sets on 2 cores (--jobs 2); the first eight took 86-96 s on 16.
tests/test_needle_adopt.sh holds the counts to needle_engine_batch and the sign test to a count
of every outcome."""
import argparse
import concurrent.futures
import hashlib
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import needle_data as nd  # noqa: E402
import needle_engine_batch as neb  # noqa: E402

ALPHA = 0.05
TRAINED_KINDS = "path,host,key,number,ticket,url,commit,random"
POOL_KINDS = "path,host,key,number,ticket,url,commit,random,key,commit,random"  # cdata's default draw

# Python generator's (needle_data) kinds a model trains on and the card evaluates
PY_TRAINED_KINDS = [k for k in nd.EVAL_KINDS if k != nd.HELDOUT_KIND]

# (name, what it asks, how its examples are made): `sparsetrace needle make --batch` options, or
# {"python": ...}, needle_data.make_sample's prompts (python_set). The release's figures on each
# are in bench/needle-train-results.md.
SETS = [
    ("e-plain384", "trained kinds, their own questions, 1k-2k tokens",
     ["--batch", "384", "--seed", "4244", "--lengths", "1k,2k", "--kinds", TRAINED_KINDS]),
    ("e-fresh220", "the training pool's kind mix on needles no run trains on, 1k-2k tokens",
     ["--batch", "220", "--seed", "2000", "--lengths", "1k,2k", "--split", "train", "--kinds", POOL_KINDS]),
    ("e-long48", "trained kinds, 8k-16k tokens",
     ["--batch", "48", "--seed", "4242", "--lengths", "8k,16k", "--kinds", TRAINED_KINDS]),
    ("e-composed48", "trained kinds, every question composed from parts, 1k-2k tokens",
     ["--batch", "48", "--seed", "4242", "--lengths", "1k,2k", "--kinds", TRAINED_KINDS, "--composed", "1"]),
    ("e-heldoutq48", "trained kinds in the bug-report shape, asked in the held-out wordings (q5, q6), 1k-2k tokens",
     ["--batch", "48", "--seed", "4245", "--lengths", "1k,2k", "--split", "heldout", "--shapes", "toollist",
      "--kinds", TRAINED_KINDS]),
    ("e-decoys64", "trained kinds after 1-4 earlier lines of the needle's label (needle make --decoys), "
     "asked for the last one, 1k-2k tokens",
     ["--batch", "64", "--seed", "2004", "--lengths", "1k,2k", "--split", "train", "--kinds", TRAINED_KINDS,
      "--decoys", "1-4"]),
    ("p-heldoutf192", "needle_data's prompts (the card's generator) in its held-out template family, "
     "trained kinds, 1k-4k tokens: the card's first table (heldout_family.json), asked of the engine",
     {"python": dict(batch=192, seed="adopt-heldoutf", family=nd.HELDOUT_FAMILY, kinds=PY_TRAINED_KINDS,
                     lengths=[1024, 2048, 4096])}),
    ("e-open48", "trained kinds, every needle under a made-up label (needle make --open-labels 1), 1k-2k "
     "tokens: the lever meant for the held-out kinds",
     ["--batch", "48", "--seed", "2006", "--lengths", "1k,2k", "--split", "train", "--kinds", TRAINED_KINDS,
      "--open-labels", "1"]),
    ("e-heldoutk48", "the kinds no run trains on (email, env), their own questions or the held-out wordings, "
     "1k-2k tokens: whether a model finds a line by the label the question names",
     ["--batch", "48", "--seed", "2005", "--lengths", "1k,2k", "--split", "heldout", "--kinds", "email,env"]),
    ("e-assorted48", "the assorted kind (16 value shapes no other kind has, each under its own label), 1k-2k "
     "tokens: values of new shapes, the held-out kinds' other lack (the release passes 2)",
     ["--batch", "48", "--seed", "2007", "--lengths", "1k,2k", "--split", "train", "--kinds", "assorted"]),
    ("e-vocab48", "the vocab kind (label and value of tokens drawn from the whole vocabulary, 6-14 of them), "
     "1k-2k tokens: a line no pattern predicts, copied token by token or not at all (the release passes none)",
     ["--batch", "48", "--seed", "2008", "--lengths", "1k,2k", "--split", "train", "--kinds", "vocab"]),
]
# Seeds of the bench's other engine sets, kept out of training as well.
OTHER_SEEDS = {
    777: "the copy probe's set (needle_copy_probe.py, bench 2026-12-05 second session)",
    2001: "the new needles of the seen/unseen comparison (bench 2026-12-05 fifth session)",
    2002: "the same", 2003: "the same",
    90003: "the toollist prompts asked in each wording (engine-wording-7893.txt)",
}


def seeds():
    """Every seed the bench's engine sets are drawn at, in order."""
    found = {int(opts[opts.index("--seed") + 1]) for _, _, opts in SETS if isinstance(opts, list)}
    return sorted(found | set(OTHER_SEEDS))


def sign_p(k, n):
    """P(X >= k) for X ~ Binomial(n, 1/2): the one-sided exact sign test."""
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2 ** n


def compare(release_oks, candidate_oks):
    """Gains, losses and both one-sided p-values of the paired verdicts."""
    gains = sum(c and not r for r, c in zip(release_oks, candidate_oks))
    losses = sum(r and not c for r, c in zip(release_oks, candidate_oks))
    n = gains + losses
    return {"release": sum(release_oks), "candidate": sum(candidate_oks), "examples": len(release_oks),
            "gains": gains, "losses": losses, "p_worse": sign_p(losses, n), "p_better": sign_p(gains, n)}


def by_kind(examples, release_oks, candidate_oks):
    """compare(...) of each needle kind's examples of a set, by kind name: where a set's gains and
    losses come from (a line that learns one kind and forgets another nets out in the set's row)."""
    kinds = {}
    for e, r, c in zip(examples, release_oks, candidate_oks):
        oks = kinds.setdefault(e["kind"], ([], []))
        oks[0].append(r)
        oks[1].append(c)
    return {kind: compare(*kinds[kind]) for kind in sorted(kinds)}


def kind_line(name, kinds):
    """A set's by_kind counts on one line: `by kind SET: KIND RELEASE->CANDIDATE/EXAMPLES ...`."""
    return f"by kind {name}: " + "  ".join(f"{k} {r['release']}->{r['candidate']}/{r['examples']}"
                                           for k, r in kinds.items())


def verdict(rows, alpha=ALPHA):
    """The rule of the module's doc over {set: compare(...)}: (word, reason) where word is adopt
    or keep; each row gains "tells": better, worse or "" at alpha / len(rows)."""
    level = alpha / max(len(rows), 1)
    for row in rows.values():
        row["tells"] = "worse" if row["p_worse"] < level else "better" if row["p_better"] < level else ""
    worse = [name for name, row in rows.items() if row["tells"] == "worse"]
    better = [name for name, row in rows.items() if row["tells"] == "better"]
    if worse:
        return "keep", f"worse on {', '.join(worse)} (p(worse) < {level:.3g})"
    if better:
        return "adopt", f"better on {', '.join(better)} and worse on none (p(better) < {level:.3g})"
    return "keep", f"no set tells them apart at {level:.3g}: the release stays"


# Item 5 of the needle model's issue: the demo's sweep (1k and 4k x 4 positions x seeds 1-2) passes at
# least this many of its 16 as trained and at most this many under rotate=q
DEMO_TRAINED_MIN, DEMO_Q_MAX = 15, 2


def demo_verdict(rc, figures, stopped=""):
    """(passes, why) of the demo gate: tools/demo.sh's exit status, the figures its closing text
    printed (its store's figures.json; None when it stopped before them) and, when it stopped, the
    step and what that step printed last."""
    if rc != 0 or figures is None:
        return False, f"tools/demo.sh stopped (exit {rc}){': ' + stopped if stopped else ''}"
    trained, q = (int(figures[k].split("/")[0]) for k in ("sweep", "sweep_q"))
    why = (f"bisect flips layer {figures['layer']}: {figures['kept']} -> {figures['kept_q']} of "
           f"{figures['positions']}; sweep {figures['sweep']} -> {figures['sweep_q']}")
    if trained < DEMO_TRAINED_MIN:
        return False, f"{why}: fewer than {DEMO_TRAINED_MIN} as trained"
    if q > DEMO_Q_MAX:
        return False, f"{why}: more than {DEMO_Q_MAX} under rotate=q"
    return True, why


def demo(st, model):
    """demo_verdict of tools/demo.sh run on MODEL with the engine ST (CPU backend, a store of its own)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as work:
        store = os.path.join(work, "demo")
        env = dict(os.environ, ST_BIN=os.path.abspath(st), ST_DEMO_MODEL=os.path.abspath(model), ST_DEMO_STORE=store)
        r = subprocess.run([os.path.join(root, "tools", "demo.sh")], env=env, capture_output=True, text=True)
        figures = None
        if os.path.exists(os.path.join(store, "figures.json")):
            with open(os.path.join(store, "figures.json"), encoding="utf-8") as f:
                figures = json.load(f)
        # where it stopped: the last step's header and that step's flagged lines (bisect's "<-")
        steps = re.split(r"^== ", r.stdout, flags=re.M)
        last, stopped = (steps[-1].splitlines() if len(steps) > 1 else []), ""
        if last:
            flagged = ["layer " + " ".join(line.split()) for line in last if "<-" in line]
            stopped = "; ".join([last[0].split(":")[0]] + flagged)
        elif r.stderr:
            stopped = r.stderr.strip().splitlines()[-1]
        return demo_verdict(r.returncode, figures, stopped)


def with_demo(word, reason, passes, why):
    """The verdict after the demo gate: an adopted candidate that fails it is kept out."""
    if word == "adopt" and not passes:
        return "keep", f"{reason}, but the demo fails item 5 ({why})"
    return word, reason


def digest(paths):
    """The sha256 of the files' bytes, one after another (hex)."""
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def engine_key(st):
    """What the engine's answers depend on: the build's sources (the digest `--version` prints of
    the source paths' git trees, cmake/build_info.cmake), compiler and build type; the binary's
    bytes when it names no sources (modified, unknown, or a build from before they were named)."""
    r = subprocess.run([st, "--version"], capture_output=True, text=True)
    m = re.match(r"sparsetrace \S+ \((.+), (.+); sources ([0-9a-f]{12})\)$", r.stdout.strip()) if r.returncode == 0 else None
    if not m:
        return digest([st])
    compiler, build_type, sources = m.groups()
    return hashlib.sha256(f"sources {sources} {compiler} {build_type}".encode()).hexdigest()


def model_digest(model):
    files = [os.path.join(model, f) for f in ("model.safetensors", "config.json", "tokenizer.json")]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        sys.exit(f"needle_adopt: {model} is not a release: {', '.join(missing)} missing")
    return digest(files)


def python_set(args, name, spec, out):
    """A set of needle_data's prompts, as `needle make --batch` writes its examples (index, kind,
    family, thinking, needle, value, request, ids): example i is make_sample(f"{seed}:{i}") of
    spec's family, kind i of spec's kinds in turn, aimed at length i of spec's lengths in turn
    (characters by the release's measured characters per token), at a position drawn from its own
    stream, thinking off, its ids rendered by the engine (`sparsetrace render`) and its characters
    rescaled by them until within 3% of the length (three tries)."""
    info_path = os.path.join(args.release, "training", "tokenizer_info.json")
    try:
        with open(info_path, encoding="utf-8") as f:
            chars_per_token = json.load(f)["chars_per_token"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"needle_adopt: {name}: {info_path}: no chars_per_token ({e})")
    render_args = argparse.Namespace(st=args.st, model=[args.release])  # needle_engine_batch.rerender's
    with tempfile.TemporaryDirectory() as work, open(out, "w", encoding="utf-8") as f:
        for i in range(spec["batch"]):
            kind, length = spec["kinds"][i % len(spec["kinds"])], spec["lengths"][i % len(spec["lengths"])]
            position = random.Random(f"{spec['seed']}:position:{i}").random()
            chars = int(length * chars_per_token)
            for _ in range(3):  # aim at the length: rescaled by the tokens rendered, as the card's cases are
                s = nd.make_sample(f"{spec['seed']}:{i}", spec["family"], kind, chars, position, False, train=False)
                ids = neb.rerender(render_args, s.request, False, work)
                if abs(len(ids) - length) < 0.03 * length:
                    break
                chars = int(chars * length / len(ids))
            f.write(json.dumps({"index": i, "kind": s.kind, "family": s.family, "thinking": False,
                                "needle": s.needle, "value": s.needle[len(s.label) + 2:], "position": position,
                                "request": s.request, "ids": ids}) + "\n")


def set_file(args, name, opts):
    """The set's examples, written by needle make (or python_set) into WORK/sets (again when missing)."""
    path = os.path.join(args.work, "sets", name + ".jsonl")
    if not os.path.isfile(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".part"
        if isinstance(opts, dict):
            python_set(args, name, opts["python"], tmp)
        else:
            r = subprocess.run([args.st, "needle", "make", "--model", args.release, "--jsonl", tmp, "--quiet"] + opts,
                               capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"needle_adopt: {name}: needle make failed: {r.stderr.strip()[-300:]}")
        os.replace(tmp, path)
    return path


def answers(args, model, mdigest, name, path, sdigest, engine):
    """The model's answers to the set's examples (the first --first), from WORK/answers where
    already asked, else from the engine, each saved as soon as it comes. mdigest, sdigest and
    engine: the model's, the set file's and the engine's keys."""
    key = f"{mdigest[:16]}-{sdigest[:16]}-{engine[:12]}"
    store = os.path.join(args.work, "answers", f"{name}-{key}.json")
    got = {}
    if os.path.isfile(store):
        try:
            with open(store, encoding="utf-8") as f:
                got = json.load(f)["answers"]
        except (ValueError, KeyError) as e:
            sys.exit(f"needle_adopt: {store}: unreadable ({e}); remove it to ask again")
    os.makedirs(os.path.dirname(store), exist_ok=True)
    with open(path, encoding="utf-8") as f:
        examples = [json.loads(line) for line in f][:args.first or None]
    engine_args = argparse.Namespace(st=args.st, backend="cpu", max_new_tokens=48, set=[],
                                     threads=neb.threads_per_job(args.jobs))

    def ask(e):
        with tempfile.TemporaryDirectory() as work:
            prompt = os.path.join(work, "prompt.json")
            with open(prompt, "w") as f:
                json.dump(e["ids"], f)
            return neb.answer_of(engine_args, model, prompt, work, e["index"])

    todo = [e for e in examples if str(e["index"]) not in got]
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for e, answer in zip(todo, pool.map(ask, todo)):  # in order, each saved as it comes
            got[str(e["index"])] = answer
            tmp = store + ".part"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"model": model, "set": name, "answers": got}, f)
            os.replace(tmp, store)
    return examples, [got[str(e["index"])] for e in examples]


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("candidate", nargs="?")
    ap.add_argument("--release", default="models/needle-v5")
    ap.add_argument("--sets", help="only these sets, comma-separated (default: all)")
    ap.add_argument("--first", type=int, default=0, help="only each set's first N examples (a partial verdict)")
    ap.add_argument("--st", default=os.environ.get("ST_BIN", "build/sparsetrace"))
    ap.add_argument("--jobs", type=int, default=1, help="engine runs at once (default 1)")
    ap.add_argument("--work", default="/tmp/needle-adopt")
    ap.add_argument("--answers", help="write every example's verdicts and each miss's answer here")
    ap.add_argument("--no-demo", action="store_true", help="leave the demo gate out (the table alone)")
    ap.add_argument("--list", action="store_true"), ap.add_argument("--seeds", action="store_true")
    args = ap.parse_args(argv)
    if args.seeds:
        print(" ".join(map(str, seeds())))
        return 0
    if args.list:
        for name, what, opts in SETS:
            made = (f"needle_data.make_sample: {json.dumps(opts['python'])}" if isinstance(opts, dict) else
                    f"sparsetrace needle make --model {args.release} --jsonl {name}.jsonl " + " ".join(opts))
            print(f"{name}: {what}\n  {made}")
        return 0
    if not args.candidate:
        ap.error("a candidate model directory is needed (or --list, --seeds)")
    chosen = SETS
    if args.sets:
        names = args.sets.split(",")
        unknown = [n for n in names if n not in [s[0] for s in SETS]]
        if unknown:
            sys.exit(f"needle_adopt: no set {', '.join(unknown)} (--list names them)")
        chosen = [s for s in SETS if s[0] in names]
    if neb.tokenizer_bytes(args.release) != neb.tokenizer_bytes(args.candidate):
        sys.exit("needle_adopt: the release and the candidate have different tokenizer.json: one prompt's "
                 "ids cannot be asked of both")
    if not os.access(args.st, os.X_OK):
        sys.exit(f"needle_adopt: {args.st}: not an executable (--st, ST_BIN)")
    if args.jobs < 1:
        ap.error("--jobs is at least 1")
    engine = engine_key(args.st)
    rd, cd = model_digest(args.release), model_digest(args.candidate)
    print(f"release   {args.release} ({rd[:12]})\ncandidate {args.candidate} ({cd[:12]})", flush=True)
    rows, kinds, lines = {}, {}, []
    for name, _, opts in chosen:
        path = set_file(args, name, opts)
        sd = digest([path])
        examples, ra = answers(args, args.release, rd, name, path, sd, engine)
        _, ca = answers(args, args.candidate, cd, name, path, sd, engine)
        roks = [neb.passes(e, a) for e, a in zip(examples, ra)]
        coks = [neb.passes(e, a) for e, a in zip(examples, ca)]
        rows[name] = compare(roks, coks)
        kinds[name] = by_kind(examples, roks, coks)
        lines.append(f"== {name}")
        for e, r, c, a_r, a_c in zip(examples, roks, coks, ra, ca):
            lines.append(neb.example_line(e, (r, c)))
            lines += [f"      {who}: {a[:90]!r}" for who, ok, a in (("release", r, a_r), ("candidate", c, a_c)) if not ok]
    word, reason = verdict(rows)
    print(f"{'set':14s} {'examples':>8s} {'release':>8s} {'candidate':>9s} {'gains':>6s} {'losses':>6s} "
          f"{'p(worse)':>9s} {'p(better)':>9s}")
    for name, row in rows.items():
        print(f"{name:14s} {row['examples']:8d} {row['release']:8d} {row['candidate']:9d} {row['gains']:6d} "
              f"{row['losses']:6d} {row['p_worse']:9.2g} {row['p_better']:9.2g}  {row['tells']}")
    for name, k in kinds.items():
        if len(k) > 1:
            print(kind_line(name, k))
    if not args.no_demo:
        passes, why = demo(args.st, args.candidate)
        print(f"demo: the candidate {'passes' if passes else 'fails'} item 5: {why}", flush=True)
        word, reason = with_demo(word, reason, passes, why)
    partial = f" (partial: the first {args.first} examples of each set)" if args.first else ""
    print(f"verdict: {word}: {reason}{partial}")
    if args.answers:
        with open(args.answers, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
