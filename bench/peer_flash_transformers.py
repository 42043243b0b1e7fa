#!/usr/bin/env python3
"""The GPU prefill benchmark's peer: transformers' DeepseekV4ForCausalLM (bf16, on the GPU) with
the shapes of a model directory made by tools/make_flash_layer.py --layers 2 (one CSA and one HCA
layer of DeepSeek-V4-Flash: hidden 4096, 64 heads of 512, indexer 64 x 128, top-k 512, 256
experts with 6 active). Its weights are drawn at random in bf16 on the device (the checkpoint's
FP8/FP4 tensors are not loaded: speed does not depend on the values, and transformers has no
FP4-expert path), so the peer runs the same arithmetic shape as `bench_prefill --backend cuda`
on the same directory. No cache, logits of the last position only; one warm-up at 64 tokens.

Usage: python3 bench/peer_flash_transformers.py MODEL_DIR TOKENS[,TOKENS...]
Prints one markdown row per length: tokens, seconds, tokens/s, peak GiB, or "out of memory".
"""
import argparse
import time

import torch
from transformers import AutoConfig, DeepseekV4ForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("tokens")
    args = ap.parse_args()
    config = AutoConfig.from_pretrained(args.model)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = DeepseekV4ForCausalLM(config).eval()
    print(f"transformers DeepseekV4ForCausalLM, bf16, {torch.cuda.get_device_name()}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f} G parameters")
    print("| tokens | seconds | tokens/s | peak GiB |")
    print("|---:|---:|---:|---:|")
    g = torch.Generator().manual_seed(99)
    with torch.no_grad():
        model(input_ids=torch.randint(0, 256, (1, 64), generator=g).cuda(), use_cache=False,
              logits_to_keep=1)
        torch.cuda.synchronize()
        for tok in args.tokens.split(","):
            n = int(tok[:-1]) * 1024 if tok.endswith("k") else int(tok)
            ids = torch.randint(0, 256, (1, n), generator=g).cuda()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            try:
                t0 = time.perf_counter()
                model(input_ids=ids, use_cache=False, logits_to_keep=1)
                torch.cuda.synchronize()
                dt = time.perf_counter() - t0
            except torch.cuda.OutOfMemoryError:
                print(f"| {n} | out of memory | - | {torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} (all) |", flush=True)
                continue
            peak = torch.cuda.max_memory_allocated() / 2**30
            print(f"| {n} | {dt:.3f} | {n / dt:.0f} | {peak:.1f} |", flush=True)


if __name__ == "__main__":
    main()
