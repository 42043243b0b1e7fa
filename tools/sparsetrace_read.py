#!/usr/bin/env python3
"""sparsetrace_read — read a sparsetrace store from Python (numpy + h5py + sqlite3, nothing else).

A store is a directory with index.sqlite (schemas/migrations/) and one HDF5 trace per run
(schemas/trace-layout.md). In a notebook:

    import sys; sys.path.insert(0, "tools")
    import sparsetrace_read as st
    s = st.Store("traces")
    s.runs()                                  # [{'run_id': ..., 'rotate': 'none', ...}, ...]
    t = s.tap("last", "layers.5.indexer.scores")
    t.array, t.positions                      # numpy array [rows, ...]; token position of each row
    t.needle, t.settings                      # {'start': 1135, 'end': 1150, 'text': ...}, {...}
    t.at(2069)                                # the row recorded for token position 2069

A run is named by its run id, any unique prefix of it, "last" (the newest run) or the path of a
trace file (which needs no store: read_tap(path, name)).

From a shell:

    python3 tools/sparsetrace_read.py STORE runs [--json]
    python3 tools/sparsetrace_read.py STORE tap RUN NAME [--json]

`runs` prints one line per run; `tap` prints the tap's shape, dtype, positions, needle span and
settings (with --json: one JSON object, the array included as nested lists).

The reader never writes: the index is opened read-only (SQLite URI mode=ro) and traces with "r".
"""

import json
import os
import sqlite3
import sys
import urllib.parse

import h5py
import numpy as np

__all__ = ["Store", "Tap", "read_tap", "trace_needles", "trace_settings", "bf16_to_float32"]

TRACE_FORMAT = "sparsetrace-trace"
SCHEMA_VERSION = 1  # the newest trace layout this reader understands


def bf16_to_float32(bits):
    """Raw bfloat16 bits (uint16, as traces store them) to float32."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _str(v):
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def _open_trace(path):
    f = h5py.File(path, "r")
    fmt = _str(f.attrs.get("format", ""))
    if fmt != TRACE_FORMAT:
        f.close()
        raise ValueError(f"{path}: not a sparsetrace trace (format {fmt!r})")
    version = int(f.attrs.get("schema_version", 0))
    if version > SCHEMA_VERSION:
        f.close()
        raise ValueError(f"{path}: trace schema {version} is newer than this reader ({SCHEMA_VERSION})")
    return f


def trace_settings(f):
    """The run's resolved settings (file attribute settings) as a dict."""
    return json.loads(_str(f.attrs.get("settings", "{}")))


def trace_needles(f):
    """The needle span(s) the trace carries as a list of {'start', 'end', 'text'} dicts:
    file attributes needle_start / needle_end / needle_text (run --needle / --needle-tokens)."""
    if "needle_start" not in f.attrs or "needle_end" not in f.attrs:
        return []
    text = _str(f.attrs["needle_text"]) if "needle_text" in f.attrs else None
    return [{"start": int(f.attrs["needle_start"]), "end": int(f.attrs["needle_end"]), "text": text}]


class Tap:
    """One recorded tap: array (numpy, axis 0 = rows), positions (int64 per row: the token
    position, or the compressed row index for row taps), attrs (the dataset's attributes:
    tap, layer, dtype, statistics), needle / needles (the run's needle span(s)), settings,
    run (the index row of the run, or the trace's file attributes when read without a store)."""

    def __init__(self, name, array, positions, attrs, needles, settings, run):
        self.name, self.array, self.positions, self.attrs = name, array, positions, attrs
        self.needles, self.settings, self.run = needles, settings, run

    @property
    def needle(self):
        """The first needle span, or None."""
        return self.needles[0] if self.needles else None

    @property
    def dtype(self):
        """The tap's element type name (bfloat16 taps are returned as float32)."""
        return self.attrs.get("dtype", str(self.array.dtype))

    def at(self, position):
        """The row recorded for one token position (KeyError if it was not recorded)."""
        hit = np.flatnonzero(self.positions == position)
        if hit.size == 0:
            raise KeyError(f"{self.name}: position {position} was not recorded")
        return self.array[hit[0]]

    def __repr__(self):
        return (f"Tap({self.name!r}, shape={tuple(self.array.shape)}, dtype={self.dtype}, "
                f"positions={len(self.positions)}, needle={self.needle})")


def _attrs(obj):
    return {k: (_str(v) if isinstance(v, (bytes, str)) else v.item() if hasattr(v, "item") else v)
            for k, v in obj.attrs.items()}


def read_tap(trace, name, raw=False, run=None, needles=None):
    """A tap of a trace file. raw=True keeps bfloat16 as its uint16 bits. needles: spans to use
    when the trace carries none (older traces; Store.tap passes the index's)."""
    with _open_trace(trace) as f:
        if "taps" not in f or name not in f["taps"]:
            have = sorted(f["taps"].keys()) if "taps" in f else []
            raise KeyError(f"{trace}: no tap {name!r} (recorded: {', '.join(have) or 'none'})")
        d = f["taps"][name]
        attrs = _attrs(d)
        array = d[()]
        if not raw and attrs.get("dtype") == "bfloat16":
            array = bf16_to_float32(array)
        if "positions" in attrs:
            positions = f[attrs["positions"]][()].astype(np.int64)
        else:
            positions = np.arange(array.shape[0], dtype=np.int64)
        carried = trace_needles(f)
        return Tap(name, array, positions, attrs, carried or list(needles or []), trace_settings(f),
                   run if run is not None else _attrs(f))


class Store:
    """A trace store: index.sqlite plus the traces it lists."""

    def __init__(self, path="traces"):
        self.path = path
        index = os.path.join(path, "index.sqlite")
        if not os.path.isfile(index):
            raise FileNotFoundError(f"{path}: no index.sqlite (not a sparsetrace store)")
        uri = "file:" + urllib.parse.quote(os.path.abspath(index)) + "?mode=ro"
        self.db = sqlite3.connect(uri, uri=True)
        self.db.row_factory = sqlite3.Row

    def close(self):
        self.db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def query(self, sql, params=()):
        """Rows of any read-only statement as dicts."""
        return [dict(r) for r in self.db.execute(sql, params)]

    def runs(self):
        """Every run, oldest first, as dicts: the runs table's columns (settings decoded to a
        dict; tap_positions, the positions filter) and the build's (revision, compiler,
        build_type, backend, kernel_mode)."""
        rows = self.query("SELECT r.*, b.revision, b.compiler, b.build_type, b.backend, b.kernel_mode "
                          "FROM runs r JOIN builds b USING (build_id) ORDER BY r.created_at, r.run_id")
        for r in rows:
            r["settings"] = json.loads(r["settings"] or "{}")
            if "tap_positions" not in r and "positions" in r:  # an index from before migration 0008
                r["tap_positions"] = r.pop("positions")
        return rows

    def run(self, which):
        """One run's row: by run id, unique prefix, or "last"."""
        if which == "last":
            rows = self.query("SELECT run_id FROM runs ORDER BY created_at DESC, rowid DESC LIMIT 1")
        else:
            rows = self.query("SELECT run_id FROM runs WHERE run_id = ? OR substr(run_id, 1, length(?)) = ?",
                              (which, which, which))
            exact = [r for r in rows if r["run_id"] == which]
            rows = exact or rows
        if not rows:
            raise KeyError(f"{self.path}: no run {which!r}")
        if len(rows) > 1:
            raise KeyError(f"{self.path}: run {which!r} is ambiguous ({len(rows)} runs)")
        return next(r for r in self.runs() if r["run_id"] == rows[0]["run_id"])

    def trace_path(self, which):
        """The trace file of a run (the index stores it relative to the store)."""
        p = self.run(which)["trace_path"]
        if os.path.isabs(p):
            return p
        inside = os.path.join(self.path, p)
        # older indexes stored a trace outside the store as given on the command line
        return inside if os.path.exists(inside) or not os.path.exists(p) else p

    def needles(self, which):
        """The run's needle spans from the index: [{'start', 'end', 'text', 'source', ...}]."""
        run_id = self.run(which)["run_id"]
        return [{"start": r["token_start"], "end": r["token_end"], "text": r["text"], "source": r["source"],
                 "needle_id": r["needle_id"]}
                for r in self.query("SELECT * FROM needles WHERE run_id = ? ORDER BY needle_id", (run_id,))]

    def taps(self, which):
        """The run's taps table rows (shape decoded to a list)."""
        run_id = self.run(which)["run_id"]
        rows = self.query("SELECT * FROM taps WHERE run_id = ? ORDER BY layer, name", (run_id,))
        for r in rows:
            r["shape"] = json.loads(r["shape"])
        return rows

    def settings(self, which):
        return self.run(which)["settings"]

    def tap(self, which, name, raw=False):
        """A tap of a run as a Tap (array, positions, needle, settings)."""
        run = self.run(which)
        return read_tap(self.trace_path(run["run_id"]), name, raw=raw, run=run,
                        needles=self.needles(run["run_id"]))


def _clean(v):
    """JSON-safe: non-finite floats as null (as sparsetrace query --json does)."""
    if isinstance(v, float):
        return v if np.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, np.ndarray):
        return _clean(v.tolist())
    return v


USAGE = """usage: sparsetrace_read.py STORE runs [--json]
       sparsetrace_read.py STORE tap RUN NAME [--json]
RUN: a run id, a unique prefix of one, or "last"; NAME: a full tap name (layers.2.indexer.scores)."""


def main(argv):
    args = [a for a in argv if a != "--json"]
    as_json = len(args) != len(argv)
    if any(a in ("-h", "--help") for a in args):
        print(USAGE)
        return 0
    if len(args) < 2 or args[1] not in ("runs", "tap") or (args[1] == "runs" and len(args) != 2) or \
            (args[1] == "tap" and len(args) != 4):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        with Store(args[0]) as s:
            if args[1] == "runs":
                rows = s.runs()
                if as_json:
                    print(json.dumps(_clean(rows), indent=1))
                else:
                    for r in rows:
                        sets = " ".join(f"{k}={v}" for k, v in r["settings"].items() if not isinstance(v, (dict, list)))
                        print(f"{r['run_id']}  {r['created_at']}  {r['model']}  {r['n_prompt']}+{r['n_generated']} tokens  "
                              f"positions {r['tap_positions']}  {sets}")
                return 0
            t = s.tap(args[2], args[3])
            if as_json:
                print(json.dumps(_clean({"run_id": t.run["run_id"], "name": t.name, "dtype": t.dtype,
                                         "shape": list(t.array.shape), "positions": t.positions.tolist(),
                                         "needles": t.needles, "settings": t.settings, "attrs": t.attrs,
                                         "array": t.array.tolist()})))
            else:
                pos = t.positions
                span = f"{pos[0]}..{pos[-1]}" if len(pos) else "none"
                print(f"run       {t.run['run_id']}")
                print(f"tap       {t.name}  {t.dtype}  shape {list(t.array.shape)}")
                print(f"positions {len(pos)} rows ({span})")
                print("needle    " + (", ".join(f"{n['start']}:{n['end']}" + (f" ({n['text']!r})" if n.get("text") else "")
                                                for n in t.needles) or "none"))
                print("settings  " + json.dumps(t.settings))
            return 0
    except (OSError, KeyError, ValueError, sqlite3.Error) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"sparsetrace_read: {msg}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
