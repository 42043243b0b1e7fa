#!/usr/bin/env python3
"""The torch.save reader (recorder/import/torchsave.c, through `sparsetrace import show`) against
references it cannot have made itself:

  pickle   Python's own pickle module (protocols 2, 3, 4) on plain data: the reader's JSON view
           must equal the view this script derives from the Python objects.
  zip      archives built here with zipfile and pickle, laid out as torch.save lays them out
           (a stand-in torch module supplies the names the pickle refers to; no torch needed):
           STORED and zip64 entries, views with offsets and strides, Parameter, fp8 through
           _rebuild_tensor_v3, OrderedDict with _metadata; then hostile variants, each of which
           must fail with exit 1 and a message naming the problem (never a crash).
  manifest torch.save files written by real torch with a manifest of torch's own view of every
           leaf (tools/make_import_fixtures.py): each DIR argument holding manifest.json.

Usage: torchsave_check.py SPARSETRACE WORKDIR [FIXTURE_DIR ...]; exit 0 when every check passes.
"""
import collections
import io
import json
import math
import os
import pickle
import struct
import subprocess
import sys
import types
import zipfile

BIN, WORK = sys.argv[1], sys.argv[2]
FIXTURE_DIRS = sys.argv[3:]
failures = []
checks = 0


def check(ok, what):
    global checks
    checks += 1
    if not ok:
        failures.append(what)
        print("FAIL:", what)


def show(path, *extra):
    p = subprocess.run([BIN, "import", "show", path, *extra], capture_output=True)
    p.stdout, p.stderr = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
    return p.returncode, p.stdout, p.stderr


def f17(x):
    return "%.17g" % x


def view(o):
    """The reader's JSON view of a plain Python object (the contract of st_py_write_json)."""
    if o is None or isinstance(o, (bool, str)):
        return o
    if isinstance(o, int):
        return o
    if isinstance(o, float):
        return {"float": f17(o)}
    if isinstance(o, tuple):
        return {"tuple": [view(x) for x in o]}
    if isinstance(o, list):
        return [view(x) for x in o]
    if isinstance(o, dict):
        key = "ordered_dict" if isinstance(o, collections.OrderedDict) else "dict"
        return {key: [[view(k), view(v)] for k, v in o.items()]}
    raise TypeError(type(o))


# ------------------------------------------------------------------------------- pickle

PLAIN = {
    "scalars": [None, True, False, 0, 1, -1, 255, 256, 65535, 65536, -256, 2 ** 31 - 1, -(2 ** 31),
                2 ** 31, -(2 ** 31) - 1, 2 ** 62, 2 ** 63 - 1, -(2 ** 63), 0.0, -0.0, 1.5, -2.25e-300,
                5e-324, float("inf"), float("-inf"), 1e308],
    "strings": ["", "a", "µ-naïve ✓ 中文", "x" * 300, "quote\" back\\ nl\n tab\t nul\x00 end"],
    "nesting": {"a": [1, [2, [3, [4, (5, (6,))]]]], "b": {"c": {"d": {}}}, "e": (), "f": (1,), "g": (1, 2),
                "h": (1, 2, 3), "i": tuple(range(10)), "j": []},
    "dict_keys": {1: "int key", "s": "str key", (1, 2): "tuple key", None: "none key"},
    "ordered": collections.OrderedDict([("z", 1), ("a", 2), ("m", 3)]),
    "many": list(range(1000)),
    "wide": {f"k{i}": i for i in range(300)},
}
shared = [1, 2]
PLAIN["shared"] = [shared, shared, {"again": shared}]


def pickle_checks():
    for proto in (2, 3, 4):
        for name, obj in PLAIN.items():
            path = os.path.join(WORK, f"plain_{name}_p{proto}.pkl")
            with open(path, "wb") as f:
                pickle.dump(obj, f, protocol=proto)
            rc, out, err = show(path, "--pickle")
            ok = rc == 0 and json.loads(out) == view(obj)
            check(ok, f"pickle protocol {proto} {name}: rc {rc} {err.strip()[:300]}")
    # Refused, by name, without running anything.
    for name, obj, needle in [("global", os.system, "refuses the global posix.system"),
                              ("set", {1, 2}, "refuses the global __builtin__.set"),
                              ("bytes", b"abc", "refuses the global _codecs.encode")]:
        path = os.path.join(WORK, f"refused_{name}.pkl")
        with open(path, "wb") as f:
            pickle.dump(obj, f, protocol=2)
        rc, out, err = show(path, "--pickle")
        check(rc == 1 and needle in err, f"pickle {name} refused: rc {rc} {err.strip()[:300]}")
    for name, data, needle in [("empty", b"", "no STOP"), ("truncated", pickle.dumps([1, 2, 3], 2)[:-3], "truncated"),
                               ("stop_on_empty", b"\x80\x02.", "STOP with 0 objects"),
                               ("bad_memo", b"\x80\x02h\x05.", "memo entry 5 was never stored"),
                               ("huge_string", b"\x80\x02X\xff\xff\xff\x7f", "truncated"),
                               ("pop_empty", b"\x80\x02t.", "needs a MARK"),
                               ("long_int", b"\x80\x02\x8a\x09" + b"\x01" * 9 + b".", "integer of 9 bytes"),
                               ("unknown_op", b"\x80\x02\xff.", "opcode 0xff"),
                               ("persid_bare", b"\x80\x02)Q.", "persistent id outside")]:
        path = os.path.join(WORK, f"bad_{name}.pkl")
        with open(path, "wb") as f:
            f.write(data)
        rc, out, err = show(path, "--pickle")
        check(rc == 1 and needle in err, f"hostile pickle {name}: rc {rc} {err.strip()[:300]}")


# ------------------------------------------------------------------------------- zip

def fake_torch():
    """Modules named torch, torch._utils, ... holding the names a torch.save pickle refers to."""
    mods = {}
    for m in ("torch", "torch._utils", "torch._tensor", "torch.nn", "torch.nn.parameter"):
        mods[m] = types.ModuleType(m)
        sys.modules[m] = mods[m]

    def named(module, name, obj):
        obj.__module__, obj.__qualname__, obj.__name__ = module, name, name
        setattr(mods[module], name, obj)
        return obj

    for n in ("_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter"):
        named("torch._utils", n, lambda *a: None)
    for n in ("FloatStorage", "BFloat16Storage", "LongStorage", "UntypedStorage", "HalfStorage"):
        named("torch", n, type(n, (), {}))
    for n in ("float8_e4m3fn", "float32"):
        named("torch", n, type(n, (), {}))
    return mods


class Storage:
    def __init__(self, cls, key, data, elem):
        self.cls, self.key, self.data, self.elem = cls, key, data, elem


class Tensor:
    def __init__(self, storage, offset, size, stride, v3_dtype=None, parameter=False):
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride
        self.v3_dtype, self.parameter = v3_dtype, parameter

    def __reduce__(self):
        t = sys.modules["torch"]
        u = sys.modules["torch._utils"]
        if self.v3_dtype is not None:
            inner = (u._rebuild_tensor_v3, (self.storage, self.offset, tuple(self.size), tuple(self.stride), False,
                                            collections.OrderedDict(), self.v3_dtype))
        else:
            inner = (u._rebuild_tensor_v2, (self.storage, self.offset, tuple(self.size), tuple(self.stride), False,
                                            collections.OrderedDict()))
        if self.parameter:
            return (u._rebuild_parameter, (Rebuilt(inner), True, collections.OrderedDict()))
        return inner


class Rebuilt:
    def __init__(self, r):
        self.r = r

    def __reduce__(self):
        return self.r


class TorchPickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", obj.cls, obj.key, "cpu", len(obj.data) // obj.elem)
        return None


def write_archive(path, obj, storages, prefix="archive/", zip64=False, compress=False, extra=None, byteorder="little",
                  zip64_everywhere=False):
    """zip64: zip64 local headers; zip64_everywhere: also saturated central directory fields and
    the zip64 end records (zipfile's limit lowered to 0 while writing)."""
    limit = zipfile.ZIP64_LIMIT
    if zip64_everywhere:
        zipfile.ZIP64_LIMIT = 0
    try:
        write_archive_inner(path, obj, storages, prefix, zip64 or zip64_everywhere, compress, extra, byteorder)
    finally:
        zipfile.ZIP64_LIMIT = limit


def write_archive_inner(path, obj, storages, prefix, zip64, compress, extra, byteorder):
    buf = io.BytesIO()
    TorchPickler(buf, protocol=2).dump(obj)
    comp = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        def put(name, data, c=zipfile.ZIP_STORED):
            info = zipfile.ZipInfo(prefix + name)
            info.compress_type = c
            with z.open(info, "w", force_zip64=zip64) as f:
                f.write(data)
        put("data.pkl", buf.getvalue(), comp)
        if byteorder is not None:
            put("byteorder", byteorder.encode())
        for s in storages:
            put("data/" + s.key, s.data)
        for name, data in (extra or {}).items():
            put(name, data)
        put("version", b"3\n")


def elements(s, t):
    """The tensor's row-major element bytes, computed from the storage here (the reference)."""
    out = b""
    idx = [0] * len(t.size)
    n = 1
    for d in t.size:
        n *= d
    for _ in range(n):
        e = t.offset + sum(i * st for i, st in zip(idx, t.stride))
        out += s.data[e * s.elem:(e + 1) * s.elem]
        for d in reversed(range(len(idx))):
            idx[d] += 1
            if idx[d] < t.size[d]:
                break
            idx[d] = 0
    return out


def zip_checks():
    torch = fake_torch()
    f32 = Storage(torch["torch"].FloatStorage, "0", struct.pack("<24f", *[i * 0.5 - 3 for i in range(24)]), 4)
    i64 = Storage(torch["torch"].LongStorage, "7", struct.pack("<5q", -(2 ** 63), -1, 0, 1, 2 ** 63 - 1), 8)
    fp8 = Storage(torch["torch"].UntypedStorage, "fp8", bytes(range(0, 240, 10)), 1)
    bf16 = Storage(torch["torch"].BFloat16Storage, "2", bytes(range(40)), 2)
    base = Tensor(f32, 0, [4, 6], [6, 1])
    tensors = {
        "base": base,
        "rows": Tensor(f32, 6, [2, 6], [6, 1]),
        "cols": Tensor(f32, 2, [4, 3], [6, 1]),
        "transposed": Tensor(f32, 0, [6, 4], [1, 6]),
        "strided": Tensor(f32, 7, [2, 2], [12, 2]),
        "scalar": Tensor(f32, 23, [], []),
        "broadcast": Tensor(f32, 5, [3, 4], [0, 1]),
        "empty": Tensor(f32, 0, [0, 5], [5, 1]),
        "i64": Tensor(i64, 0, [5], [1]),
        "fp8": Tensor(fp8, 3, [3, 4], [4, 1], v3_dtype=torch["torch"].float8_e4m3fn),
        "bf16": Tensor(bf16, 1, [3, 3], [6, 2]),
        "param": Tensor(f32, 0, [2, 2], [6, 1], parameter=True),
    }
    storages = [f32, i64, fp8, bf16]
    meta = {"name": "x", "layer_id": 3, "ratio": 0.5}
    obj = {"tensors": tensors, "meta": meta, "od": collections.OrderedDict([("w", base)])}
    for variant, kw in [("stored", {}), ("zip64", {"zip64": True}), ("zip64_everywhere", {"zip64_everywhere": True}),
                        ("prefix", {"prefix": "my_stem/"}),
                        ("no_byteorder", {"byteorder": None})]:
        path = os.path.join(WORK, f"archive_{variant}.pt")
        write_archive(path, obj, storages, **kw)
        rc, out, err = show(path)
        if rc:
            check(False, f"archive {variant}: rc {rc} {err.strip()[:300]}")
            continue
        got = json.loads(out)["dict"]
        top = {k: v for k, v in got}
        check(top["meta"] == view(meta), f"archive {variant}: meta")
        check(top["od"]["ordered_dict"][0][0] == "w", f"archive {variant}: OrderedDict")
        mine = {k: v["tensor"] for k, v in top["tensors"]["dict"]}
        for name, t in tensors.items():
            m = mine.get(name)
            ok = (m is not None and m["shape"] == t.size and m["stride"] == t.stride and m["storage_offset"] == t.offset
                  and m["hex"] == elements(t.storage, t).hex() and m["is_parameter"] == t.parameter)
            check(ok, f"archive {variant}: tensor {name}: {m}")
        check(mine["fp8"]["dtype"] == "float8_e4m3fn" and mine["bf16"]["dtype"] == "bfloat16" and
              mine["i64"]["dtype"] == "int64", f"archive {variant}: dtypes")

    # Hostile archives: a clear error, exit 1.
    short = Storage(torch["torch"].FloatStorage, "0", f32.data[:40], 4)
    cases = [
        ("view_past_storage", {"t": Tensor(f32, 20, [2, 3], [3, 1])}, [f32], {}, "reaches element 25 of storage 0"),
        ("stride_past_storage", {"t": Tensor(f32, 0, [3, 3], [12, 1])}, [f32], {}, "reaches element 26"),
        ("numel_past_entry", {"t": Tensor(short, 0, [2], [1])}, [], {"extra": {"data/0": short.data[:8]}},
         "claims 10 float32 elements but its entry holds 8 bytes"),
        ("negative_stride", {"t": Tensor(f32, 5, [3], [-1])}, [f32], {}, "stride -1"),
        ("missing_storage", {"t": base}, [], {}, "storage 0 has no entry archive/data/0"),
        ("compressed", {"t": base}, [f32], {"compress": True}, "compressed (method 8)"),
        ("big_endian", {"t": base}, [f32], {"byteorder": "big"}, "byteorder is 'big'"),
        ("huge_dims", {"t": Tensor(f32, 0, [2 ** 40, 2 ** 40], [1, 1])}, [f32], {}, "more than 2^62 elements"),
        ("too_many_dims", {"t": Tensor(f32, 0, [1] * 17, [1] * 17)}, [f32], {}, "17 dimensions"),
    ]
    for name, o, st, kw, needle in cases:
        path = os.path.join(WORK, f"hostile_{name}.pt")
        write_archive(path, o, st, **kw)
        rc, out, err = show(path)
        check(rc == 1 and needle in err, f"hostile archive {name}: rc {rc}: {err.strip()[:300]}")
    good = os.path.join(WORK, "archive_stored.pt")
    data = open(good, "rb").read()
    for name, blob, needle in [("truncated_tail", data[:-30], "no end-of-central-directory"),
                               ("truncated_half", data[:len(data) // 2], "no end-of-central-directory"),
                               ("not_zip", b"hello world" * 10, "not a ZIP archive"),
                               ("tiny", b"PK", "too short")]:
        path = os.path.join(WORK, f"hostile_{name}.pt")
        with open(path, "wb") as f:
            f.write(blob)
        rc, out, err = show(path)
        check(rc == 1 and needle in err, f"hostile file {name}: rc {rc}: {err.strip()[:300]}")
    # Every single-byte corruption of the archive's metadata: never a crash (exit 0 or 1 only).
    crashes = 0
    cd = data.rfind(b"PK\x01\x02")
    for pos in list(range(0, 120)) + list(range(max(0, cd - 40), len(data))):
        blob = bytearray(data)
        blob[pos] ^= 0xFF
        path = os.path.join(WORK, "flip.pt")
        with open(path, "wb") as f:
            f.write(blob)
        rc, out, err = show(path)
        if rc not in (0, 1):
            crashes += 1
            print(f"flip at byte {pos}: rc {rc} {err.strip()[:200]}")
    check(crashes == 0, f"byte flips: {crashes} crashes")


# ------------------------------------------------------------------------------- manifest

def manifest_checks(d):
    with open(os.path.join(d, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    for fname, entry in manifest["files"].items():
        rc, out, err = show(os.path.join(d, fname))
        if rc:
            check(False, f"{d}/{fname}: rc {rc} {err.strip()[:300]}")
            continue
        root = json.loads(out)
        for rec in entry["records"]:
            node = resolve(root, rec["path"])
            check(node is not MISSING and matches(node, rec), f"{fname}{rec['path']}: {str(node)[:300]} vs {str(rec)[:300]}")


MISSING = object()


def resolve(node, path):
    for part in [p for p in path.split("/") if p != ""]:
        if isinstance(node, dict) and "tuple" in node:
            node = node["tuple"]
        if isinstance(node, list):
            node = node[int(part)] if int(part) < len(node) else MISSING
        elif isinstance(node, dict) and ("dict" in node or "ordered_dict" in node):
            pairs = node.get("dict", node.get("ordered_dict"))
            hit = [v for k, v in pairs if str(k) == part]
            node = hit[0] if hit else MISSING
        else:
            return MISSING
        if node is MISSING:
            return MISSING
    return node


def scalar(v):
    return {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}.get(v, v) if isinstance(v, str) else v


def matches(node, rec):
    kind = rec["kind"]
    if kind == "tensor":
        t = node.get("tensor") if isinstance(node, dict) else None
        return (t is not None and t["dtype"] == rec["dtype"] and t["shape"] == rec["shape"] and t["stride"] == rec["stride"]
                and t["storage_offset"] == rec["storage_offset"] and t["hex"] == rec["hex"]
                and t["is_parameter"] == rec["is_parameter"])
    if kind in ("dict", "ordered_dict"):
        pairs = node.get(kind) if isinstance(node, dict) else None
        return pairs is not None and [str(k) for k, _ in pairs] == rec["keys"]
    if kind == "list":
        return isinstance(node, list) and len(node) == rec["length"]
    if kind == "tuple":
        return isinstance(node, dict) and len(node.get("tuple", [])) == rec["length"]
    if kind == "float":
        want = scalar(rec["value"])
        return isinstance(node, dict) and "float" in node and f17(float(node["float"])) == f17(want)
    return node == rec["value"] and type(node) is type(rec["value"])


os.makedirs(WORK, exist_ok=True)
pickle_checks()
zip_checks()
for d in FIXTURE_DIRS:
    manifest_checks(d)
print(f"torchsave_check: {checks} checks, {len(failures)} failed")
sys.exit(1 if failures else 0)
