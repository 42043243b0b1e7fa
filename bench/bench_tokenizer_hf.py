#!/usr/bin/env python3
"""bench_tokenizer_hf.py — HF `tokenizers` on the same prompt bench_tokenizer.c times.

    build-tok/bench/bench_tokenizer --model DIR --dump /tmp/prompt.txt     # writes the prompt
    python3 bench/bench_tokenizer_hf.py DIR/tokenizer.json /tmp/prompt.txt [REPEAT]

Prints the load time, the first encode and the median of REPEAT (default 20) later encodes,
with add_special_tokens=False, and the token count (which must equal bench_tokenizer's).
Needs `tokenizers` (not installed on the CPU machine; the GPU machine has it).
"""
import statistics
import sys
import time


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    import tokenizers

    path, prompt = sys.argv[1], open(sys.argv[2], encoding="utf-8").read()
    repeat = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    t0 = time.perf_counter()
    tok = tokenizers.Tokenizer.from_file(path)
    t1 = time.perf_counter()
    ids = tok.encode(prompt, add_special_tokens=False).ids
    t2 = time.perf_counter()
    warm = []
    for _ in range(repeat):
        s = time.perf_counter()
        tok.encode(prompt, add_special_tokens=False)
        warm.append(time.perf_counter() - s)
    n = len(prompt.encode("utf-8"))
    print(f"tokenizers {tokenizers.__version__}: prompt {n} bytes, {len(ids)} tokens")
    print(f"load: {(t1 - t0) * 1e3:.1f} ms; first encode: {(t2 - t1) * 1e3:.2f} ms; "
          f"median of {repeat}: {statistics.median(warm) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
