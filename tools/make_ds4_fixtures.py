#!/usr/bin/env python3
"""Writes a run of sparsetrace's own engine as antirez/ds4 graph dumps, for `sparsetrace import ds4`.

ds4 (ds4.c, metal_graph_debug_dump_tensor / _i32_tensor) writes, under
DS4_METAL_GRAPH_DUMP_PREFIX=PREFIX, one raw little-endian file per tensor, layer and batch:
PREFIX_NAME-LAYER_posPOS.bin (float32) or .i32 (int32), no header, POS the batch's first
position: the prefill is one batch (rows 0..n_prompt-1 at pos 0), each decode step one row. The
indexer's scores ([n, n_comp], n_comp = the compressed rows after the batch) and top-k ([n, K],
K = index_topk) are dumped only when n_comp > K, as ds4 does. The logits go to
PREFIX_result_output-<n_layers>_pos0.bin (ds4 writes them at position 0 whatever the step).

Which tap is which ds4 name comes from schemas/import/ds4.map (the importer's own table), so the
two cannot disagree. The run is recorded with `sparsetrace run` (every layer tap, every position)
and read back with h5py; the fixture is then exactly our engine's bits in ds4's files.

  python3 tools/make_ds4_fixtures.py --sparsetrace build/sparsetrace --model tests/data/oracle/tiny \
      --prompt-tokens 132 --max-new-tokens 3 --out tests/data/import/ds4 \
      --names attn_out,ffn_out,ffn_moe_topk,indexer_scores,indexer_topk
"""
import argparse
import json
import os
import sys
import tempfile

import h5py
import numpy as np

from engine_fixture import prompt_ids, read_map, record_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def csa_ratio(cfg, layer):
    """The compress ratio of a CSA layer, in either config dialect (engine/config.c reads both)."""
    if "compress_ratios" in cfg:
        return cfg["compress_ratios"][layer]
    return cfg.get("compress_rates", {}).get("compressed_sparse_attention", cfg.get("compress_rate_csa", 4))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sparsetrace", default=os.path.join(ROOT, "build", "sparsetrace"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-tokens", type=int, default=132, help="prompt length (ids from a fixed sequence)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--max-new-tokens", type=int, default=3)
    ap.add_argument("--set", action="append", default=[], help="engine setting of the run (KEY=VALUE)")
    ap.add_argument("--out", required=True, help="directory of the dumps (created)")
    ap.add_argument("--prefix", default="ds4", help="the file names' PREFIX (DS4_METAL_GRAPH_DUMP_PREFIX's last part)")
    ap.add_argument("--names", help="comma-separated ds4 names to write (DS4_METAL_GRAPH_DUMP_NAME); default every mapped one")
    a = ap.parse_args()

    mapping = read_map(os.path.join(ROOT, "schemas", "import", "ds4.map"), with_alignment=False)
    if a.names:
        wanted = a.names.split(",")
        unknown = [n for n in wanted if n not in dict(mapping)]
        if unknown:
            sys.exit(f"--names: {unknown} are not in schemas/import/ds4.map")
        mapping = [(n, t) for n, t in mapping if n in wanted]
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    K = cfg["index_topk"]
    os.makedirs(a.out, exist_ok=True)
    ids = prompt_ids(a.prompt_tokens, a.seed)
    with tempfile.TemporaryDirectory() as work:
        f = h5py.File(record_run(a.sparsetrace, a.model, ids, a.max_new_tokens, a.set, work), "r")
        tokens = [int(t) for t in f["tokens"][()]]
        n_prompt = int(f["tokens"].attrs["n_prompt"])
        taps = f["taps"]
        n_layers = int(f.attrs["n_layers"])
        settings = json.loads(f.attrs["settings"])
        written = 0

        def write(name, layer, pos, array):
            nonlocal written
            ext = ".i32" if array.dtype.kind == "i" else ".bin"
            data = array.astype("<i4" if ext == ".i32" else "<f4")
            data.tofile(os.path.join(a.out, f"{a.prefix}_{name}-{layer}_pos{pos}{ext}"))
            written += 1

        for layer in range(n_layers):
            for name, tap in mapping:
                key = f"layers.{layer}.{tap}"
                if key not in taps:
                    continue
                x = taps[key][()]
                T = x.shape[0]
                batches = [(0, n_prompt)] + [(p, p + 1) for p in range(n_prompt, T)]
                for p0, p1 in batches:
                    rows = x[p0:p1]
                    if tap in ("indexer.scores", "indexer.topk"):
                        n_comp = p1 // csa_ratio(cfg, layer)  # the compressed rows once the batch is stored
                        if n_comp <= K:
                            continue  # ds4 runs no indexer then: every row is attended
                        if tap == "indexer.scores":
                            rows = rows[:, :n_comp]
                        else:
                            pad = np.full((rows.shape[0], K), -1, np.int32)
                            pad[:, :min(K, rows.shape[1])] = rows[:, :K]
                            rows = pad
                    write(name, layer, p0, rows.reshape(rows.shape[0], -1))
        if "logits" in taps:  # unmapped on import: ds4 dumps them at position 0 whatever the step
            write("result_output", n_layers, 0, taps["logits"][()][-1:])
    json.dump(tokens, open(os.path.join(a.out, "tokens.json"), "w"))
    json.dump({"model": os.path.relpath(a.model, ROOT) if a.model.startswith(ROOT) else a.model,
               "n_prompt": n_prompt, "tokens": len(tokens), "settings": settings,
               "names": [n for n, _ in mapping], "files": written,
               "command": " ".join(["tools/make_ds4_fixtures.py"] + sys.argv[1:])},
              open(os.path.join(a.out, "fixture.json"), "w"), indent=1)
    print(f"{written} dump files, {len(tokens)} tokens ({n_prompt} prompt) -> {a.out}")


if __name__ == "__main__":
    main()
