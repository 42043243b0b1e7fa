#!/usr/bin/env python3
"""Prefill time of transformers' DeepseekV4ForCausalLM on the same checkpoint and prompt lengths
as bench_prefill — the peer the CPU engine is measured against (run on the GPU machine, where
transformers is installed). fp32, no cache, logits of the last position only.

Usage: python3 bench/peer_transformers.py MODEL_DIR TOKENS[,TOKENS...] [--device cpu|cuda] [--threads N]
Prints one markdown row per length: tokens, seconds, tokens/s, peak memory (MiB).
"""
import argparse
import resource
import time

import torch
from transformers import DeepseekV4ForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("tokens")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = DeepseekV4ForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval().to(args.device)
    print(f"transformers DeepseekV4ForCausalLM, fp32, {args.device}, {torch.get_num_threads()} CPU threads")
    print("| tokens | seconds | tokens/s | peak MiB |")
    print("|---:|---:|---:|---:|")
    for tok in args.tokens.split(","):
        n = int(tok[:-1]) * 1024 if tok.endswith("k") else int(tok)
        g = torch.Generator().manual_seed(99)
        ids = torch.randint(0, 256, (1, n), generator=g).to(args.device)
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        with torch.no_grad():
            model(input_ids=ids[:, :64], use_cache=False, logits_to_keep=1)  # warm-up
            if args.device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
            if args.device == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
        peak = (torch.cuda.max_memory_allocated() / 2**20 if args.device == "cuda"
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        print(f"| {n} | {dt:.2f} | {n / dt:.0f} | {peak:.0f} |", flush=True)


if __name__ == "__main__":
    main()
