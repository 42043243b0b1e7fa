#!/usr/bin/env bash
# tools/train_needle.py card_tables, the model card's recall tables, on evaluation files made
# here with known verdicts: a table that mixes trained and held-out needle kinds gets one
# subtotal row for each (the aims are set apart for the two), counted from the same cases as
# the rows by kind, and a table of one kind alone gets none; rows by question family; the decoy
# ladder's rows by count. The time the card's evaluations share (train_needle.eval_share): by
# mode, against an even split, and the time left over to those that stopped short of the last
# length (unfinished, reach). And compare_cards, two releases' evaluations side by side, the
# cases paired by prompt with their sign test.
set -uo pipefail
src=$(cd "${ST_SOURCE_DIR:?}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
exec /usr/bin/python3 - "$src" "$work" <<'PY'
import json, os, sys
src, work = sys.argv[1:]
sys.path.insert(0, os.path.join(src, "tools"))
import train_needle as tn

open(os.path.join(work, "log.jsonl"), "w").close()
# (kind, sparse, q-rot): path 2 of 3, host 1 of 1, branch (held out) 0 of 2 as trained;
# trained kinds 3 of 4 = 75.0%, held-out kinds 0 of 2 = 0.0%; q-rot: path 1 of 3, the others 0
verdicts = [("path", True, True), ("path", True, False), ("path", False, False), ("host", True, False),
            ("branch", False, False), ("branch", False, False)]
def write(name, rows):
    cases = [{"L": 1024, "position": 0.25, "seed": i, "a0": 1000, "needle_tok": 500, "needle": "x: y",
              "kind": k, "family": "f", "exact": {"sparse": s, "q-rot": q}} for i, (k, s, q) in enumerate(rows)]
    res = {"family": "f", "kind": None, "seeds": 1, "index_topk": 32, "window": 64,
           "mean_prompt_tokens": {"1024": 1024}, "summary": {}, "table": {"sparse": {}, "q-rot": {}}, "cases": cases}
    for mode, at in (("sparse", 1), ("q-rot", 2)):
        res["summary"][mode] = round(100 * sum(r[at] for r in rows) / len(rows), 1)
        res["table"][mode] = {"1024": {"0.25": res["summary"][mode]}}
    json.dump(res, open(os.path.join(work, name), "w"))

write("heldout_family.json", verdicts)
text = tn.card_tables(work, work, "v5")
rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in text.splitlines() if line.startswith("| ") and "(" in line.split("|")[1]}
want = {"path (3)": ["66.7", "33.3"], "host (1)": ["100.0", "0.0"], "branch (held out) (2)": ["0.0", "0.0"],
        "**trained kinds** (4)": ["75.0", "25.0"], "**held-out kinds** (2)": ["0.0", "0.0"]}
for label, cells in want.items():
    if rows.get(label) != cells:
        sys.exit(f"FAIL: row {label!r}: {rows.get(label)}, expected {cells}\n{text}")
print("ok: rows by kind, and the trained / held-out subtotals, count the cases")

write("heldout_family.json", [v for v in verdicts if v[0] == "path"])
text = tn.card_tables(work, work, "v5")
if "kinds**" in text or "By needle kind" in text:
    sys.exit(f"FAIL: one kind alone got rows by kind or a subtotal\n{text}")
print("ok: a table of one kind has no subtotal")

# rows by question family count the trained kinds' cases alone (a held-out kind fails in any
# wording), the held-out families marked: c/q0 path 1 of 2 (its branch case left out), c/q5 path
# and host 1 of 2 (its branch case left out); a table of one family has no such rows
write("bug_report.json", [("path", True, False), ("path", False, False), ("branch", False, False),
                          ("path", False, False), ("host", True, False), ("branch", True, False)])
res = json.load(open(os.path.join(work, "bug_report.json")))
for c, fam in zip(res["cases"], ["c/q0", "c/q0", "c/q0", "c/q5", "c/q5", "c/q5"]):
    c["family"] = fam
json.dump(res, open(os.path.join(work, "bug_report.json"), "w"))
os.remove(os.path.join(work, "heldout_family.json"))
text = tn.card_tables(work, work, "v5")
rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in text.splitlines() if line.startswith("| ") and "(" in line.split("|")[1]}
want = {"c/q0 (2)": ["50.0", "0.0"], "c/q5 (held out) (2)": ["50.0", "0.0"]}
if {k: rows.get(k) for k in want} != want or "By question family, trained kinds" not in text:
    sys.exit(f"FAIL: rows by question family: {rows}, expected {want}\n{text}")
write("bug_report.json", verdicts)
if "By question family" in tn.card_tables(work, work, "v5"):
    sys.exit("FAIL: a table of one family got rows by family")
print("ok: rows by question family count the trained kinds' cases, held-out families marked")
os.remove(os.path.join(work, "bug_report.json"))
write("heldout_family.json", verdicts)

# the decoy ladder: rows by decoys placed, binned 1, 2-3, 4-7, 8-15, 16-31 (tn.decoy_bin), each
# counted from its cases: 1 placed twice (1 of 2 pass), 4, 5 (1 of 2), 12 (0 of 1), 24 and 30 (0 of 2)
ladder = [(1, True, False), (1, False, False), (4, True, False), (5, False, False), (12, False, False),
          (24, False, False), (30, False, False)]
os.remove(os.path.join(work, "heldout_family.json"))
write("decoys.json", [("path", ok, q) for _, ok, q in ladder])
res = json.load(open(os.path.join(work, "decoys.json")))
res["decoys"] = [1, 4, 12, 24]
for c, (n, _, _) in zip(res["cases"], ladder):
    c["decoys"] = n
json.dump(res, open(os.path.join(work, "decoys.json"), "w"))
text = tn.card_tables(work, work, "v5")
rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in text.splitlines() if line.startswith("| ") and "(" in line.split("|")[1]}
want = {"1 (2)": ["50.0", "0.0"], "4-7 (2)": ["50.0", "0.0"], "8-15 (1)": ["0.0", "0.0"], "16-31 (2)": ["0.0", "0.0"]}
if {k: rows.get(k) for k in want} != want or "1/4/12/24 decoys" not in text:
    sys.exit(f"FAIL: rows by decoys placed: {rows}, expected {want}, and the ladder named\n{text}")
print("ok: rows by decoys placed, binned, count the cases")

# compare_cards: two evals directories side by side, counted from the cases. Old: the verdicts
# above (trained 3 of 4, held-out 0 of 2); new: every path case passes, the rest as before
# (trained 4 of 4, +25 points; all 4 of 6 against 3 of 6, +16.7)
old_dir, new_dir = os.path.join(work, "old"), os.path.join(work, "new")
for d, rows in ((old_dir, verdicts), (new_dir, [(k, True if k == "path" else s, q) for k, s, q in verdicts])):
    os.makedirs(d)
    write("heldout_family.json", rows)
    os.replace(os.path.join(work, "heldout_family.json"), os.path.join(d, "heldout_family.json"))
text = tn.compare_cards(old_dir, new_dir, "v5", ["sparse"])
rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in text.splitlines() if line.startswith("| ")}
want = {"all": ["3/6 (50.0%)", "4/6 (66.7%)", "+16.7"], "1k tokens": ["3/6 (50.0%)", "4/6 (66.7%)", "+16.7"],
        "kind path": ["2/3 (66.7%)", "3/3 (100.0%)", "+33.3"],
        "kind **trained kinds**": ["3/4 (75.0%)", "4/4 (100.0%)", "+25.0"],
        "kind **held-out kinds**": ["0/2 (0.0%)", "0/2 (0.0%)", "+0.0"]}
if {k: rows.get(k) for k in want} != want:
    sys.exit(f"FAIL: compare_cards: {rows}, expected {want}\n{text}")
print("ok: compare_cards counts both releases' cases, the card's rows and subtotals among them")
# paired: the one path case the old failed is the only change (1 gain, 0 losses): p(better) is
# P(X >= 1) for X ~ B(1, 1/2) = 0.5, p(worse) P(X >= 0) = 1
want = "Paired (the same prompt in both): 6 cases, 1 gains, 0 losses; p(worse) 1, p(better) 0.5"
if want not in text:
    sys.exit(f"FAIL: compare_cards' paired line: expected '{want}'\n{text}")
print("ok: compare_cards pairs the cases by prompt and gives their sign test")
if "card verdict: keep: no set tells them apart" not in text:
    sys.exit(f"FAIL: one gain, no loss: the card's verdict should keep the release\n{text}")
# 12 cases the old passes and the new fails: p(worse) = 2^-12, below 0.05 over the 2 rows (sparse
# and q-rot, each measured in both): the card keeps the release, naming where it is worse
many = [("path", True, True)] * 12
for d, rows in ((old_dir, many), (new_dir, [("path", False, True)] * 12)):
    write("heldout_family.json", rows)
    os.replace(os.path.join(work, "heldout_family.json"), os.path.join(d, "heldout_family.json"))
text = tn.compare_cards(old_dir, new_dir, "v5", ["sparse", "q-rot"])
if "card verdict: keep: worse on heldout_family.json sparse (p(worse) < 0.025)" not in text:
    sys.exit(f"FAIL: 12 losses of 12: the card's verdict should be worse on heldout_family.json sparse\n{text}")
print("ok: the card's verdict is the adoption rule on its paired rows")

# summarise: a mode no case was measured in has no recall (None), not 0.0; the others count only
# the cases measured (2 of 3 here, one passed: 50.0)
cases = [{"exact": {"sparse": True}}, {"exact": {"sparse": False}}, {}]
got = tn.summarise(cases, ["sparse", "q-rot"])
if got != {"sparse": 50.0, "q-rot": None}:
    sys.exit(f"FAIL: summarise: {got}, expected sparse 50.0 and q-rot None")
print("ok: a mode no case was measured in has no recall, not 0.0")

# the card's evaluation budget (tn.eval_share): 600 s for three evaluations of 11, 2 and 2 modes
# go 440 / 80 / 80 (by mode): 160 left for the last two is 80 each, and the last gets all that is left
evals = [("a.json", "A", "release", ("python", None, None), ["m"] * 11),
         ("b.json", "B", "release", ("jsonl", "x", "train"), ["m", "n"]),
         ("c.json", "C", "release", ("jsonl", "y", "train"), ["m", "n"])]
got = [round(tn.eval_share(600, evals, n), 6) for n in range(3)]
if got[0] != 440 or round(tn.eval_share(160, evals, 1), 6) != 80 or round(tn.eval_share(500, evals, 2), 6) != 500:
    sys.exit(f"FAIL: eval_share: {got}, expected 440 for 11 of 15 modes")
print("ok: the card's evaluations share their budget by mode, the unused passed on")

# the second pass (tn.unfinished, tn.reach): b stopped at 16k of 1k-32k, a and c reached 32k; of
# two runs of b, the one that completed more lengths is kept, and at as many lengths the one that
# measured more cases
L = [1024, 2048, 4096, 8192, 16384, 32768]
case = lambda done: {"L": 32768, **({"exact": {"m": True}} if done else {})}
results = {"a.json": {"lengths_complete": L, "cases": [case(True)]},
           "b.json": {"lengths_complete": L[:5], "cases": [case(True), case(False)]},
           "c.json": {"lengths_complete": L, "cases": [case(True)]}}
short = [e[0] for e in tn.unfinished(evals, results, L)]
b_more = {"lengths_complete": L[:5], "cases": [case(True), case(True)]}
b_all = {"lengths_complete": L, "cases": [case(True)]}
if short != ["b.json"] or not tn.reach(b_more) > tn.reach(results["b.json"]) or not tn.reach(b_all) > tn.reach(b_more):
    sys.exit(f"FAIL: unfinished {short}, reach {tn.reach(results['b.json'])} {tn.reach(b_more)} {tn.reach(b_all)}")
print("ok: an evaluation stopped before the last length is measured again, the further run kept")
PY
