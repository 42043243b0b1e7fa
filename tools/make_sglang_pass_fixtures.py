#!/usr/bin/env python3
"""Writes a run of sparsetrace's own engine as sglang --debug-tensor-dump-output-folder Pass files.

sglang's debug_utils/tensor_dump_forward_hook.py hooks every leaf module and the top-level
`model`; per forward pass it torch.saves DIR/TP{t}_PP{p}_Rank{r}_pid{pid}/Pass{N:05d}.pt, a dict
{module name: output} plus model.forward_batch_info.{input_ids,seq_lens,positions}. The outputs
of `model` and `logits_processor` are added after the pass is written, so they land in the next
pass's file; this writer does the same (the importer leaves them out). Pass 0 is the prefill,
each later pass one decode step.

Which tap is which module comes from schemas/import/sglang-pass.map (the importer's own table).
The run is recorded with `sparsetrace run` and read back with h5py; the values are saved in
--dtype (bfloat16 as sglang runs, or float32 for a bit-exact comparison) with real torch.save.

  python3 tools/make_sglang_pass_fixtures.py --model tests/data/oracle/tiny --out /tmp/pass
"""
import argparse
import json
import os
import tempfile

import h5py
import torch

from engine_fixture import prompt_ids, read_map, record_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sparsetrace", default=os.path.join(ROOT, "build", "sparsetrace"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-tokens", type=int, default=40)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=3)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tp", type=int, default=1, help="also write empty-ish rank directories TP1.. (left out on import)")
    a = ap.parse_args()

    mapping = read_map(os.path.join(ROOT, "schemas", "import", "sglang-pass.map"))
    dtype = getattr(torch, a.dtype)
    ids = prompt_ids(a.prompt_tokens, a.seed)
    with tempfile.TemporaryDirectory() as work:
        f = h5py.File(record_run(a.sparsetrace, a.model, ids, a.max_new_tokens, a.set, work), "r")
        tokens = [int(t) for t in f["tokens"][()]]
        n_prompt = int(f["tokens"].attrs["n_prompt"])
        taps = f["taps"]
        n_layers = int(f.attrs["n_layers"])
        T = taps["layers.0.attn.x"].shape[0]
        passes = [(0, n_prompt)] + [(p, p + 1) for p in range(n_prompt, T)]
        for tp in range(a.tp):
            rank_dir = os.path.join(a.out, f"TP{tp}_PP0_Rank{tp}_pid{4242 + tp}")
            os.makedirs(rank_dir, exist_ok=True)
            carried = {}  # the `model` / `logits_processor` outputs of the previous pass
            for n, (p0, p1) in enumerate(passes):
                d = dict(carried)
                for name, tap in mapping:
                    if tap.startswith("@"):
                        continue
                    for layer in range(n_layers):
                        key = f"layers.{layer}.{tap}"
                        if key in taps:
                            d[name.replace("{L}", str(layer))] = torch.from_numpy(taps[key][p0:p1]).to(dtype)
                d["model.layers.0.mlp.gate"] = torch.zeros(p1 - p0, 4, dtype=dtype)  # a leaf no tap holds
                d["model.forward_batch_info.input_ids"] = torch.tensor(tokens[p0:p1], dtype=torch.int64)
                d["model.forward_batch_info.seq_lens"] = torch.tensor([p1], dtype=torch.int64)
                d["model.forward_batch_info.positions"] = torch.arange(p0, p1, dtype=torch.int64)
                torch.save(d, os.path.join(rank_dir, f"Pass{n:05d}.pt"))
                carried = {"model": torch.from_numpy(taps[f"layers.{n_layers - 1}.output"][p0:p1]).to(dtype)}
                if "logits" in taps:
                    carried["logits_processor"] = torch.from_numpy(taps["logits"][p1 - 1:p1]).to(dtype)
    json.dump(tokens, open(os.path.join(a.out, "tokens.json"), "w"))
    print(f"{len(passes)} passes, {len(tokens)} tokens ({n_prompt} prompt) -> {a.out}")


if __name__ == "__main__":
    main()
