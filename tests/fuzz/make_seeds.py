#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz/corpus/ (except trace/, which make_trace_seeds writes)
from tests/data and a few hand-made inputs. Run from the repository root; idempotent."""
import json, os, struct, pathlib

root = pathlib.Path(__file__).resolve().parents[2]
corpus = root / "tests/fuzz/corpus"

def put(name, fname, data):
    d = corpus / name
    d.mkdir(parents=True, exist_ok=True)
    (d / fname).write_bytes(data if isinstance(data, bytes) else data.encode())

def safetensors(tensors, meta=None, pad=b""):
    hdr, data = {}, b""
    sizes = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
             "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
    for name, dt, shape in tensors:
        n = sizes[dt]
        for s in shape:
            n *= s
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + n]}
        data += bytes((i * 7 + 3) & 0xFF for i in range(n))
    if meta:
        hdr["__metadata__"] = meta
    h = json.dumps(hdr, separators=(",", ":")).encode() + pad
    return struct.pack("<Q", len(h)) + h + data

# safetensors
put("safetensors", "basic.safetensors", safetensors([("a", "F32", [2, 3]), ("b", "BF16", [4])], {"format": "pt"}))
put("safetensors", "dtypes.safetensors", safetensors([(f"t{i}", dt, [2]) for i, dt in enumerate(
    ["F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "I64", "I32", "I16", "I8", "U8", "BOOL"])]))
put("safetensors", "scalar_empty.safetensors", safetensors([("s", "F32", []), ("e", "F32", [0, 5]), ("r8", "U8", [1] * 8)], pad=b"   "))
put("safetensors", "fp8_block.safetensors", safetensors([
    ("model.layers.0.self_attn.q_a_proj.weight", "F8_E4M3", [4, 8]),
    ("model.layers.0.self_attn.q_a_proj.weight_scale_inv", "F32", [1, 1]),
    ("layers.0.ffn.experts.0.w1.weight", "I8", [2, 4]), ("layers.0.ffn.experts.0.w1.scale", "F8_E8M0", [2, 1])]))
put("safetensors", "empty.safetensors", safetensors([]))

# sharded index (fuzz_index.c provides shard-1/shard-2 and config.json)
put("index", "both.json", json.dumps({"metadata": {"total_size": 40}, "weight_map": {
    "model.embed_tokens.weight": "shard-1.safetensors", "model.layers.0.input_layernorm.weight": "shard-1.safetensors",
    "lm_head.weight": "shard-2.safetensors", "lm_head.weight_scale_inv": "shard-2.safetensors",
    "embed.weight": "shard-2.safetensors"}}, indent=1))
put("index", "one.json", json.dumps({"weight_map": {"model.embed_tokens.weight": "shard-1.safetensors"}}))
put("index", "bad_paths.json", json.dumps({"weight_map": {"a": "../shard-1.safetensors", "b": "./shard-2.safetensors", "c": "x//y"}}))
put("index", "missing.json", json.dumps({"weight_map": {"zzz": "shard-1.safetensors"}}))

# config.json
for src in ["tests/data/oracle/tiny/config.json", "tests/data/oracle/odd/config.json",
            "models/needle-v4/config.json", "models/needle-v4/hf_config.json"]:
    p = root / src
    if p.exists():
        put("config", src.replace("/", "_"), p.read_bytes())

# tokenizer.json
tok = root / "tests/data/needle/tokenizer.json"
put("tokenizer", "needle_tiny.json", tok.read_bytes())
t = json.loads(tok.read_text())
m = t.get("model", {})
if isinstance(m.get("merges"), list) and m["merges"] and isinstance(m["merges"][0], str):
    t2 = json.loads(json.dumps(t))
    t2["model"]["merges"] = [s.split(" ", 1) for s in m["merges"]]
    put("tokenizer", "merges_pairs.json", json.dumps(t2))
t3 = json.loads(json.dumps(t))
t3["added_tokens"] = (t3.get("added_tokens") or []) + [
    {"id": len(m.get("vocab", {})) + 50, "content": "<|x|>", "single_word": False, "lstrip": True,
     "rstrip": False, "normalized": True, "special": False}]
put("tokenizer", "added_normalized.json", json.dumps(t3))

# chat requests: the "request" of every tests/data/chat case, plus its API when given
for p in sorted((root / "tests/data/chat").glob("*.json")):
    case = json.loads(p.read_text())
    req = case.get("request")
    if req is not None:
        put("chat", p.name, json.dumps(req, ensure_ascii=False, indent=1))

# HTTP request heads (and bodies)
http = {
    "get.txt": "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
    "post_cl.txt": "POST /v1/chat/completions?x=1#f HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
                   "Authorization: Bearer sk-1\r\nContent-Length: 13\r\n\r\n{\"model\":\"x\"}",
    "chunked.txt": "POST /v1/messages HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n"
                   "5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\n",
    "pipelined.txt": "\r\nGET /a HTTP/1.1\r\nHost: x\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 2\r\n\r\nokGET /c HTTP/1.0\r\n"
                     "Connection: keep-alive\r\n\r\nGET /d HTTP/1.1\r\nConnection: close\r\n\r\n",
    "smuggle.txt": "POST / HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "lf_only.txt": "PUT /x HTTP/1.0\nHost: y\nContent-Length: 3\nContent-Length: 3\n\nabc",
    "big_head.txt": "GET /h HTTP/1.1\r\n" + "".join(f"X-Filler-{i}: {'v' * 20}\r\n" for i in range(45)) + "\r\n",
    "big_body.txt": "POST /b HTTP/1.1\r\nContent-Length: 5000\r\n\r\n" + "z" * 100,
}
for k, v in http.items():
    put("http", k, b"\x07" + v.encode())  # first byte: the chunking seed

# SSE streams
sse = {
    "openai.txt": "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n",
    "anthropic.txt": "event: message_start\r\ndata: {\"type\":\"message_start\"}\r\n\r\n: ping\r\n\r\nevent: content_block_delta\r\n"
                     "data: {\"delta\":{\"text\":\"a\"}}\r\n\r\nevent: message_stop\r\ndata: {}\r\n\r\n",
    "mixed.txt": "\ufeffid: 1\rretry: 10\rdata\rdata: two\r\rfield-only\n\ndata:x\r\n\r\ndata: unfinished",
    "multiline.txt": "data: a\ndata: b\ndata:\n\nevent: e\n\nevent:\ndata: \x00nul\n\n",
}
for k, v in sse.items():
    put("sse", k, b"\x05" + v.encode())

# text for fuzz_tokenize (first byte: encode flags; 2 = split special tokens, lossless check)
for i, line in enumerate((root / "tests/data/tokenizer/corpus.jsonl").read_text().splitlines()[:400:20]):
    put("tokenize", f"corpus_{i:02d}.txt", b"\x02" + json.loads(line)["text"].encode("utf-8", "surrogatepass"))
put("tokenize", "specials.txt", b"\x01<\xef\xbd\x9cbegin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>Hi<\xef\xbd\x9cUser\xef\xbd\x9c> 12345")
put("tokenize", "bad_utf8.txt", b"\x00abc\xc3\x28\xed\xa0\x80\xf4\x90\x80\x80")
