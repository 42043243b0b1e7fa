"""report_check.py — checks a `sparsetrace report` page, as Chromium rendered it (--dump-dom), against
the store it was drawn from, read here independently: the index with Python's sqlite3, the traces
with h5py, the metrics recomputed with numpy from their definitions (docs/design.md "Metrics",
schemas/needle-verdicts.md). Used by tests/test_report.sh.

usage: report_check.py DOM.html STORE TRACE_A TRACE_B HOSTILE_TEXT BISECT.json
Prints one 'ok: ...' or 'FAIL: ...' line per check; exit status 1 when any check failed.
"""
import html.parser
import json
import sqlite3
import sys

import h5py
import numpy as np

dom_path, store, trace_a, trace_b, hostile, bisect_json = sys.argv[1:7]
failures = 0


def check(what, good, detail=""):
    global failures
    print(("ok: " if good else "FAIL: ") + what + ("" if good else ": " + str(detail)))
    if not good:
        failures += 1


class Node:
    def __init__(self, tag, attrs, parent):
        self.tag, self.attrs, self.parent, self.children, self.text = tag, dict(attrs), parent, [], ""

    def find_all(self, pred):
        out = []
        for c in self.children:
            if pred(c):
                out.append(c)
            out.extend(c.find_all(pred))
        return out

    def all_text(self):
        return self.text + "".join(c.all_text() for c in self.children)


class Tree(html.parser.HTMLParser):
    VOID = {"meta", "br", "img", "input", "link", "hr", "col"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", [], None)
        self.cur = self.root

    def handle_starttag(self, tag, attrs):
        n = Node(tag, attrs, self.cur)
        self.cur.children.append(n)
        if tag not in self.VOID:
            self.cur = n

    def handle_startendtag(self, tag, attrs):
        self.cur.children.append(Node(tag, attrs, self.cur))

    def handle_endtag(self, tag):
        n = self.cur
        while n is not self.root and n.tag != tag:
            n = n.parent
        if n is not self.root:
            self.cur = n.parent

    def handle_data(self, data):
        self.cur.text += data


tree = Tree()
tree.feed(open(dom_path, encoding="utf-8").read())
root = tree.root


def by_id(i):
    found = root.find_all(lambda n: n.attrs.get("id") == i)
    return found[0] if found else None


db = sqlite3.connect(store + "/index.sqlite")
runs = {}
for path in (trace_a, trace_b):
    with h5py.File(path, "r") as f:
        runs[path] = f.attrs["run_id"] if isinstance(f.attrs["run_id"], str) else f.attrs["run_id"].decode()

# ---------------------------------------------------------------- the page itself
scripts = root.find_all(lambda n: n.tag == "script")
check("one script element (the page's own): hostile text did not add one", len(scripts) == 1, len(scripts))
external = root.find_all(lambda n: any(k in ("src", "href") for k in n.attrs))
check("nothing loaded from anywhere (no src/href attributes)", not external, [e.attrs for e in external][:3])
titles = [n.all_text() for n in root.find_all(lambda n: n.tag == "title")]
tds = [n.all_text() for n in root.find_all(lambda n: n.tag == "td")]
check("the hostile answer is shown as text, in the sweep grid's hover and its table",
      any(hostile in t for t in titles) and any(hostile in t for t in tds), hostile)
injected = root.find_all(lambda n: n.tag in ("b", "img", "iframe") or n.attrs.get("id") == "pwned")
check("no element the hostile strings spell was created", not injected, [n.tag for n in injected])
trace_cells = root.find_all(lambda n: n.tag == "td" and n.attrs.get("data-key") == "trace")
check("the hostile store path is shown literally", len(trace_cells) == 2 and all("<b>" in c.all_text() for c in trace_cells),
      [c.all_text() for c in trace_cells])

# ---------------------------------------------------------------- heat map == needle_verdicts
for i, path in enumerate((trace_a, trace_b)):
    rid = runs[path]
    want = {(l, p): (-1 if r is None else r) for l, p, r in db.execute(
        "SELECT v.layer, v.position, v.best_rank FROM needle_verdicts v WHERE v.run_id = ? AND v.replay_id IS NULL "
        "AND v.needle_id = (SELECT max(needle_id) FROM needles WHERE run_id = ?)", (rid, rid))}
    topk = db.execute("SELECT topk FROM needle_verdicts WHERE run_id = ? LIMIT 1", (rid,)).fetchone()[0]
    for fig in ("rank-%d" % i, "rank-pair-%d" % i):
        svg = by_id(fig)
        if svg is None:
            check(fig + " drawn", False, "missing")
            continue
        cells = svg.find_all(lambda n: n.tag == "rect" and "data-row" in n.attrs)
        got = {(int(c.attrs["data-row"]), int(c.attrs["data-col"])): float(c.attrs["data-value"]) for c in cells}
        drawn = {k: v for k, v in got.items() if v >= 0}
        check("%s: every (layer, position) rank equals needle_verdicts' (%d cells)" % (fig, len(want)),
              drawn == {k: float(v) for k, v in want.items()},
              sorted(set(drawn.items()) ^ set((k, float(v)) for k, v in want.items()))[:4])
        over = {k for k, c in zip(got, cells) if c.attrs["data-over"] == "1"}
        want_over = {k for k, v in want.items() if v >= topk}
        check("%s: the cells beyond the top-%d line are those with rank >= %d" % (fig, topk, topk), over == want_over,
              sorted(over ^ want_over)[:4])
    # the verdict table == the view needle_rank_by_layer (the SQL form of the rule)
    table = by_id("verdicts-%d" % i)
    rows = [[td.all_text() for td in tr.find_all(lambda n: n.tag == "td")]
            for tr in table.find_all(lambda n: n.tag == "tr")] if table else []
    rows = [r for r in rows if r]
    view = db.execute("SELECT layer, retrieves, answer_positions_kept, answer_positions, best_rank, worst_rank FROM "
                      "needle_rank_by_layer WHERE run_id = ? AND replay_id IS NULL ORDER BY layer", (rid,)).fetchall()
    mine = [(int(r[0]), {"yes": 1, "no": 0}.get(r[1]), int(r[2].split(" of ")[0]), int(r[2].split(" of ")[1]),
             int(r[4]), int(r[5])) for r in rows]
    check("run %d: the verdict table is needle_rank_by_layer's" % i, mine == [tuple(v) for v in view], (mine, view))

# ---------------------------------------------------------------- stored replays == the view
svg = by_id("replay-kept-0")
got = [float(b.attrs["data-value"]) for b in svg.find_all(lambda n: "data-name" in n.attrs)] if svg else []
want = [float(k) for (k,) in db.execute(
    "SELECT v.answer_positions_kept FROM replays r JOIN needle_rank_by_layer v ON v.replay_id = r.replay_id "
    "WHERE r.run_id = ? ORDER BY r.created_at, r.rowid", (runs[trace_a],))]
flags = [b.attrs["data-flag"] for b in svg.find_all(lambda n: "data-name" in n.attrs)] if svg else []
want_flags = ["0" if r == 1 else "1" for (r,) in db.execute(
    "SELECT v.retrieves FROM replays r JOIN needle_rank_by_layer v ON v.replay_id = r.replay_id "
    "WHERE r.run_id = ? ORDER BY r.created_at, r.rowid", (runs[trace_a],))]
check("replay cells: positions kept are needle_rank_by_layer's per replay (%d cells)" % len(want),
      got == want and len(want) == 2 and flags == want_flags, (got, want, flags, want_flags))

# ---------------------------------------------------------------- score histograms == the trace
with h5py.File(trace_a, "r") as f:
    n_prompt = int(f["tokens"].attrs["n_prompt"])
    cfg = json.loads(f.attrs["config"])
    ratios = cfg["compress_ratios"]
    start, end = db.execute("SELECT token_start, token_end FROM needles WHERE run_id = ? ORDER BY needle_id DESC",
                            (runs[trace_a],)).fetchone()
    pos = n_prompt - 1
    for layer in range(cfg["num_hidden_layers"]):
        name = "layers.%d.indexer.scores" % layer
        if name not in f["taps"]:
            continue
        row = list(f["positions/" + name][:]).index(pos)
        scores = f["taps/" + name][row]
        topk = f["taps/layers.%d.indexer.topk" % layer][list(f["positions/layers.%d.indexer.topk" % layer][:]).index(pos)]
        svg = by_id("scores-0-layer-%d" % layer)
        if svg is None:
            check("histogram of layer %d drawn" % layer, False, "missing")
            continue
        bins = svg.find_all(lambda n: n.tag == "rect" and "data-bin" in n.attrs)
        counts = [int(b.attrs["data-count"]) for b in bins]
        finite = scores[np.isfinite(scores)]
        lo, hi = float(finite.min()), float(finite.max())
        want = np.histogram(finite.astype(np.float64), bins=len(bins), range=(lo, hi))[0].tolist()
        # numpy's last bin is closed like ours; a value on an inner edge may fall either side by rounding
        check("layer %d: %d bins hold the %d visible scores, as numpy bins them" % (layer, len(bins), finite.size),
              sum(counts) == finite.size and sum(abs(a - b) for a, b in zip(counts, want)) <= 2, (counts, want))
        m = ratios[layer]
        rows_needle = [j for j in range(scores.size) if m * (j - 1) < end and m * j + m - 1 >= start]
        marks = {n.attrs["data-mark"]: float(n.attrs["data-value"]) for n in svg.find_all(lambda n: "data-mark" in n.attrs)}
        want_marks = {"row %d" % j: float(scores[j]) for j in rows_needle}
        check("layer %d: the needle's rows %s marked at their scores" % (layer, rows_needle),
              marks.keys() == want_marks.keys() and all(abs(marks[k] - want_marks[k]) <= 1e-6 * max(1, abs(want_marks[k]))
                                                       for k in marks), (marks, want_marks))
        line = [float(n.attrs["data-line"]) for n in svg.find_all(lambda n: "data-line" in n.attrs)]
        kth = float(min(scores[j] for j in topk if j >= 0))
        check("layer %d: the dashed line is the lowest selected score %.6g" % (layer, kth),
              len(line) == 1 and abs(line[0] - kth) <= 1e-6 * max(1, abs(kth)), line)

# ---------------------------------------------------------------- the diff
with h5py.File(trace_a, "r") as fa, h5py.File(trace_b, "r") as fb:
    ta, tb = fa["tokens"][:], fb["tokens"][:]
    n = min(len(ta), len(tb))
    d = next((i for i in range(n) if ta[i] != tb[i]), n if len(ta) != len(tb) else None)
    jac = by_id("topk-jaccard")
    bars = {b.attrs["data-name"]: float(b.attrs["data-value"]) for b in jac.find_all(lambda n: "data-name" in n.attrs)} if jac else {}
    for layer in range(cfg["num_hidden_layers"]):
        name = "layers.%d.indexer.topk" % layer
        if name not in fa["taps"]:
            continue
        pa, pb = list(fa["positions/" + name][:]), list(fb["positions/" + name][:])
        js = []
        for p in sorted(set(pa) & set(pb)):
            if d is not None and p >= d:
                continue
            A = {int(x) for x in fa["taps/" + name][pa.index(p)] if x >= 0}
            B = {int(x) for x in fb["taps/" + name][pb.index(p)] if x >= 0}
            js.append(1.0 if not A and not B else len(A & B) / len(A | B))
        want = sum(js) / len(js) if js else 1.0
        got = bars.get("layer %d" % layer)
        check("layer %d: top-k Jaccard %.6f over %d positions before the tokens differ" % (layer, want, len(js)),
              got is not None and abs(got - want) < 1e-9, got)
    first = by_id("first-divergence")
    tap = first.attrs.get("data-tap") if first else None
    diffs = by_id("tap-difference")
    vals = {b.attrs["data-name"]: float(b.attrs["data-value"]) for b in diffs.find_all(lambda n: "data-name" in n.attrs)} if diffs else {}
    if tap and tap in fa["taps"]:
        pa, pb = list(fa["positions/" + tap][:]), list(fb["positions/" + tap][:])
        common = [p for p in sorted(set(pa) & set(pb)) if d is None or p < d]
        x = np.stack([fa["taps/" + tap][pa.index(p)] for p in common]).astype(np.float64)
        y = np.stack([fb["taps/" + tap][pb.index(p)] for p in common]).astype(np.float64)
        want = float(((x - y) ** 2).sum() / ((x * x).sum() + (y * y).sum()))
        check("first divergence %s: its difference bar %.9g is numpy's %.9g" % (tap, vals.get(tap, float("nan")), want),
              tap in vals and abs(vals[tap] - want) <= 1e-9 * max(1, want), vals.get(tap))
        earlier = [t for t in vals if list(vals).index(t) < list(vals).index(tap)]
        check("no float tap before it in forward order is flagged", all(
            by_id("tap-difference").find_all(lambda n: n.attrs.get("data-name") == t)[0].attrs["data-flag"] == "0"
            for t in earlier), earlier)
    else:
        check("a first divergence is named", False, tap)

# ---------------------------------------------------------------- the sweep grid == needle_attempts
grids = root.find_all(lambda n: n.tag == "svg" and n.attrs.get("id", "").startswith("sweep-grid-"))
check("a sweep grid per sweep", len(grids) == db.execute("SELECT count(DISTINCT sweep_id) FROM needle_attempts").fetchone()[0],
      len(grids))
for g in grids:
    cells = g.find_all(lambda n: n.tag == "rect" and "data-state" in n.attrs)
    sweep = db.execute("SELECT sweep_id FROM needle_attempts GROUP BY sweep_id ORDER BY min(created_at) "
                       "LIMIT 1 OFFSET ?", (int(g.attrs["id"].split("-")[-1]),)).fetchone()[0]
    want = {("%d tokens" % t, "%.2f" % p): (s, c) for t, p, s, c in db.execute(
        "SELECT tokens_requested, position, sum(pass), count(*) FROM needle_attempts WHERE sweep_id = ? "
        "GROUP BY tokens_requested, position", (sweep,))}
    got = {(c.attrs["data-row"], c.attrs["data-col"]): c.attrs["data-label"] for c in cells if c.attrs["data-state"] != "-1"}
    check("sweep %s: every cell's passed/attempts is needle_attempts'" % sweep[:8],
          got == {k: "%d/%d" % v for k, v in want.items()}, (got, want))
    states = {(c.attrs["data-row"], c.attrs["data-col"]): c.attrs["data-state"] for c in cells}
    check("sweep %s: green/red/amber follow the counts" % sweep[:8], all(
        states[k] == ("1" if s == n else "0" if s == 0 else "2") for k, (s, n) in want.items()), states)

# ---------------------------------------------------------------- the bisect
bisect = json.load(open(bisect_json))
sentence = by_id("bisect-sentence")
check("the bisect sentence is `sparsetrace bisect`'s", sentence is not None and sentence.all_text() == bisect["explanation"],
      sentence.all_text() if sentence else None)
table = by_id("bisect-layers")
rows = [[td.all_text() for td in tr.find_all(lambda n: n.tag == "td")] for tr in table.find_all(lambda n: n.tag == "tr")] if table else []
rows = [r for r in rows if r]
# good = the recorded settings of run A (rotate=none): its verdicts are the index's view
view = db.execute("SELECT layer, retrieves, answer_positions_kept, answer_positions FROM needle_rank_by_layer "
                  "WHERE run_id = ? AND replay_id IS NULL ORDER BY layer", (runs[trace_a],)).fetchall()
good = [(int(r[0]), 1 if r[1] == "yes" else 0, int(r[2].split(" of ")[0]), int(r[2].split(" of ")[1])) for r in rows]
check("bisect's good column is run A's recorded verdicts (needle_rank_by_layer)", good == [tuple(v) for v in view], (good, view))
bad_cols = [(int(r[0]), r[4] == "yes", int(r[5].split(" of ")[0])) for r in rows]
want_bad = [(l["layer"], l["bad"]["retrieves"], l["bad"]["kept"]) for l in bisect["layers"]]
check("bisect's bad column is `sparsetrace bisect --json`'s", bad_cols == want_bad, (bad_cols, want_bad))

sys.exit(1 if failures else 0)
