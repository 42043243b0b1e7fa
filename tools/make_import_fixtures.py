#!/usr/bin/env python3
"""Write the import fixtures where torch and transformers are (run once on the GPU machine; CPU
is enough): the independent references for the torch.save reader and the planted-bug test.

OUT/torchsave/*.pt        torch.save files covering what the reader must read: fp32, fp16, bf16,
                          fp64, int8/uint8/int32/int64, bool, fp8 (e4m3fn, e5m2: the
                          _rebuild_tensor_v3 path), 0-d tensors, views with offsets and strides
                          sharing one storage, an nn.Parameter, a state_dict (OrderedDict with
                          _metadata), a dumper-style {"value": ..., "meta": {...}} dict, 300
                          tensors in one list (memo indices past 255), nested containers
OUT/torchsave/manifest.json
                          for every leaf of every file: its path, and for a tensor its dtype,
                          shape, stride, storage offset, its elements' bytes (hex, row-major,
                          little-endian) and values (non-finite as "nan"/"inf"/"-inf"); for a
                          scalar its Python type and value. Written from torch's own view of the
                          objects it saved, then checked by reloading each file with torch.load.
OUT/hf/prompt_tokens.json the prompt (a JSON array of ids, for `sparsetrace run --prompt-tokens`)
OUT/hf/exact/             tools/export_hf.py on tests/data/oracle/tiny, unpatched
OUT/hf/rotate_q/          the same prompt with the planted bug (indexer query Hadamard-rotated,
                          key not)
OUT/hf/summary.json       per CSA layer: positions whose top-k sets differ between the two runs
OUT/log.txt               everything the steps printed; the exit status is 1 if any step failed

Usage (from the repository root): python3 tools/make_import_fixtures.py OUT [--torchsave-only]
(--torchsave-only: the torch.save set alone, which needs torch but not transformers; the
reader's test makes it with whatever torch the machine has.)
"""
import collections
import json
import math
import os
import subprocess
import sys
import traceback

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "tests", "data", "oracle", "tiny")
PROMPT_LEN = 192          # 48 CSA rows at the end: well above index_topk = 32
POSITIONS = "160:192"     # kept token rows: every one has more visible rows than the top-k
PROMPT_SEED = 4321

LOG = []


def log(msg):
    print(msg, flush=True)
    LOG.append(msg)


# ---------------------------------------------------------------- the torch.save fixture set

def fixture_objects():
    """name -> object saved with torch.save. Values are exact in their dtype by construction."""
    g = torch.Generator().manual_seed(7)
    objs = {}
    specials = torch.tensor([0.0, -0.0, 1.0, -2.5, float("inf"), float("-inf"), float("nan"), 65504.0])
    objs["dtypes"] = {
        "f32": (torch.arange(12, dtype=torch.float32).reshape(3, 4) - 5.5) * 0.25,
        "f32_specials": specials.clone(),
        "f16": ((torch.arange(10, dtype=torch.float32) - 4) * 0.125).to(torch.float16).reshape(2, 5),
        "f16_specials": specials.to(torch.float16),
        "bf16": ((torch.arange(15, dtype=torch.float32) - 7) * 0.375).to(torch.bfloat16).reshape(3, 5),
        "bf16_specials": specials.to(torch.bfloat16),
        "bf16_random": torch.randn(4, 6, generator=g).to(torch.bfloat16),
        "f64": torch.tensor([[1.0 / 3.0, -1e300], [5e-324, 2.0 ** 0.5]], dtype=torch.float64),
        "i8": torch.tensor([-128, -1, 0, 1, 127], dtype=torch.int8),
        "u8": torch.tensor([0, 1, 128, 255], dtype=torch.uint8),
        "i16": torch.tensor([-32768, 0, 32767], dtype=torch.int16),
        "i32": torch.tensor([[-2147483648, -1, 0], [1, 2147483647, 12345]], dtype=torch.int32),
        "i64": torch.tensor([-(2 ** 63), -1, 0, 2 ** 40 + 3, 2 ** 63 - 1], dtype=torch.int64),
        "bool": torch.tensor([True, False, True, True]),
        "scalar_f32": torch.tensor(3.5),
        "scalar_i64": torch.tensor(-7),
        "empty": torch.zeros(0, 3),
    }
    fp8 = {}
    grid = torch.tensor([0.0, 0.015625, -0.5, 1.0, 1.5, -3.0, 240.0, 448.0, -448.0, 0.001953125])
    if hasattr(torch, "float8_e4m3fn"):
        fp8["e4m3fn"] = grid.to(torch.float8_e4m3fn).reshape(2, 5)
    if hasattr(torch, "float8_e5m2"):
        fp8["e5m2"] = torch.tensor([0.0, 1.0, -2.0, 57344.0, 0.5, -0.25]).to(torch.float8_e5m2)
    if hasattr(torch, "float8_e4m3fnuz"):
        fp8["e4m3fnuz"] = grid[:8].to(torch.float8_e4m3fnuz)
    objs["fp8"] = fp8
    base = torch.arange(60, dtype=torch.float32).reshape(6, 10) * 0.5
    objs["views"] = {
        "base": base,
        "rows_2_5": base[2:5],             # storage offset 20
        "cols_3_7": base[:, 3:7],          # offset 3, strides (10, 1)
        "transposed": base.t(),            # strides (1, 10)
        "strided": base[1::2, 2::3],       # offset 12, strides (20, 3)
        "one_row": base[4],                # offset 40
        "element": base[5, 9],             # 0-d, offset 59
        "bf16_view": torch.arange(16, dtype=torch.float32).to(torch.bfloat16).reshape(4, 4)[1:, ::2],
    }
    objs["parameter"] = torch.nn.Parameter(torch.tensor([[1.0, -2.0], [0.5, 4.0]]), requires_grad=True)
    lin = torch.nn.Linear(3, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 2.0, 3.0], [-1.0, -2.0, -3.0]]))
        lin.bias.copy_(torch.tensor([0.25, -0.75]))
    objs["state_dict"] = lin.state_dict()
    objs["dumper_value"] = {
        "value": ((torch.arange(12, dtype=torch.float32) - 6) / 8).to(torch.bfloat16).reshape(4, 3),
        "meta": {"step": 0, "rank": 0, "dump_index": 17, "name": "indexer_q", "layer_id": 3,
                 "recompute_status": "disabled", "dims": "t h(tp) d", "world_size": 1,
                 "ratio": 0.5, "negative": -12, "big": 2 ** 40, "flag": True, "off": False,
                 "nothing": None, "shape": [4, 3], "pair": (1, "a"), "text": "µ-naïve ✓"},
    }
    objs["many"] = [torch.tensor([i], dtype=torch.int32) for i in range(300)]
    objs["nested"] = {
        "list": [1, 2.5, "s", None, True, False, (1, 2), [], {}],
        "tuple": (torch.tensor([1.0, 2.0]), ("inner", (3,))),
        "dict": collections.OrderedDict([("z", 1), ("a", 2)]),
        "ints": [0, 255, 256, 65535, 65536, -1, -256, 2 ** 31 - 1, -(2 ** 31), 2 ** 31, 2 ** 62, -(2 ** 63)],
        "floats": [0.0, -0.0, 1e-310, 1.5, -1e300],
        "long_string": "x" * 300,
    }
    return objs


def value_text(v):
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def tensor_record(t):
    is_parameter = isinstance(t, torch.nn.Parameter)
    t = t.detach()
    c = t.contiguous()
    raw = c.reshape(-1).view(torch.uint8) if c.numel() else torch.zeros(0, dtype=torch.uint8)
    if t.dtype == torch.bool:
        values = c.reshape(-1).tolist()
    elif t.dtype == torch.float64:
        values = [value_text(v) for v in c.reshape(-1).tolist()]
    elif t.dtype.is_floating_point:  # every narrower float is exact in float32
        values = [value_text(v) for v in c.reshape(-1).float().tolist()]
    else:
        values = c.reshape(-1).tolist()
    return {"kind": "tensor", "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
            "stride": list(t.stride()), "storage_offset": t.storage_offset(),
            "is_parameter": is_parameter,
            "hex": bytes(raw.tolist()).hex(), "values": values}


def walk(obj, path, out):
    """Appends one record per leaf; containers get a record with their kind and length too."""
    if isinstance(obj, torch.Tensor):
        out.append(dict(tensor_record(obj), path=path))
    elif isinstance(obj, dict):
        kind = "ordered_dict" if isinstance(obj, collections.OrderedDict) else "dict"
        out.append({"path": path, "kind": kind, "keys": [str(k) for k in obj]})
        for k, v in obj.items():
            walk(v, f"{path}/{k}", out)
    elif isinstance(obj, (list, tuple)):
        out.append({"path": path, "kind": type(obj).__name__, "length": len(obj)})
        for i, v in enumerate(obj):
            walk(v, f"{path}/{i}", out)
    elif obj is None or isinstance(obj, (bool, int, float, str)):
        out.append({"path": path, "kind": type(obj).__name__, "value": value_text(obj)})
    else:
        raise TypeError(f"no manifest rule for {type(obj)} at {path}")


def same(a, b):
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and a.stride() == b.stride() and a.storage_offset() == b.storage_offset()
                and torch.equal(a.contiguous().reshape(-1).view(torch.uint8) if a.numel() else a,
                                b.contiguous().reshape(-1).view(torch.uint8) if b.numel() else b))
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


def make_torchsave(outdir):
    d = os.path.join(outdir, "torchsave")
    os.makedirs(d, exist_ok=True)
    manifest = {"torch": str(torch.__version__), "files": {}}
    for name, obj in fixture_objects().items():
        path = os.path.join(d, name + ".pt")
        torch.save(obj, path)
        records = []
        walk(obj, "", records)
        # A sanity check of the file by torch itself (the manifest comes from the objects, not
        # from this): weights_only first; torch 1.x's weights_only refuses floats (BINFLOAT), so
        # then the full loader on this file we just wrote.
        loader = "weights_only"
        try:
            reloads = same(obj, torch.load(path, weights_only=True))
        except Exception as e:
            loader = f"full (weights_only refused: {str(e)[-80:]})"
            try:
                reloads = same(obj, torch.load(path, weights_only=False))
            except Exception as e2:  # recorded, not fatal: the file itself is what the reader tests
                reloads = f"torch.load failed: {e2}"
        manifest["files"][name + ".pt"] = {"size": os.path.getsize(path), "reloads_equal": reloads,
                                           "reloaded_with": loader, "records": records}
        log(f"torchsave: {name}.pt {os.path.getsize(path)} bytes, {len(records)} records, "
            f"reloads equal: {reloads}")
    with open(os.path.join(d, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False)


# ---------------------------------------------------------------- the transformers exports

def run_export(outdir, name, prompt_file, extra):
    cmd = [sys.executable, os.path.join(ROOT, "tools", "export_hf.py"), "--model", MODEL,
           "--out", os.path.join(outdir, "hf", name), "--prompt-tokens", prompt_file,
           "--positions", POSITIONS] + extra
    log("$ " + " ".join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True)
    log(p.stdout.rstrip())
    if p.stderr.strip():
        log(p.stderr.rstrip()[-8000:])
    if p.returncode:
        raise RuntimeError(f"export_hf.py {name} exited with {p.returncode}")


def topk_sets(run_dir):
    """layer -> list of sets (one per kept position) from an export's indexer top-k files."""
    with open(os.path.join(run_dir, "export.json")) as f:
        info = json.load(f)
    sets = {}
    for e in info["files"]:
        if e["name"].endswith("compressor.indexer.output"):
            v = torch.load(os.path.join(run_dir, e["file"]), weights_only=True)["value"][0]
            sets[e["layer_id"]] = [set(int(x) for x in row if x >= 0) for row in v]
    return sets


def make_hf(outdir):
    d = os.path.join(outdir, "hf")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(MODEL, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    gen = torch.Generator().manual_seed(PROMPT_SEED)
    ids = torch.randint(0, vocab, (PROMPT_LEN,), generator=gen).tolist()
    prompt_file = os.path.join(d, "prompt_tokens.json")
    with open(prompt_file, "w") as f:
        json.dump(ids, f)
    run_export(outdir, "exact", prompt_file, [])
    run_export(outdir, "rotate_q", prompt_file, ["--rotate-q"])
    a, b = topk_sets(os.path.join(d, "exact")), topk_sets(os.path.join(d, "rotate_q"))
    summary = {"prompt_len": PROMPT_LEN, "positions": POSITIONS, "layers": {}}
    for layer in sorted(a):
        diff = [i for i, (x, y) in enumerate(zip(a[layer], b[layer])) if x != y]
        summary["layers"][str(layer)] = {"positions_kept": len(a[layer]),
                                         "topk_sets_differ_at": len(diff),
                                         "first_differing_row": diff[0] if diff else None}
    with open(os.path.join(d, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    log("hf summary: " + json.dumps(summary))


def main():
    args = [a for a in sys.argv[1:] if a != "--torchsave-only"]
    if len(args) != 1:
        sys.exit(__doc__)
    outdir = args[0]
    steps = (make_torchsave,) if "--torchsave-only" in sys.argv else (make_torchsave, make_hf)
    os.makedirs(outdir, exist_ok=True)
    log(f"make_import_fixtures: torch {torch.__version__}, python {sys.version.split()[0]}")
    failed = 0
    for step in steps:
        try:
            step(outdir)
        except Exception:
            failed += 1
            log(f"FAILED {step.__name__}:\n{traceback.format_exc()}")
    total = 0
    for root, _, files in os.walk(outdir):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    log(f"make_import_fixtures: {total} bytes in {outdir}; {failed} step(s) failed")
    with open(os.path.join(outdir, "log.txt"), "w") as f:
        f.write("\n".join(LOG) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
