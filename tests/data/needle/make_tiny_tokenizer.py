#!/usr/bin/env python3
"""Writes tokenizer.json and tokenizer_config.json for the bundled tiny engine model
(tests/data/oracle/tiny, vocab_size 264): a byte-level vocabulary with no merges (ids 0-255, one
token per byte, GPT-2's byte-to-unicode spelling), BOS 256 and EOS 257 as the model's config.json
says, and the DeepSeek-V4 markers the chat encoding emits in ids 258-263 (ENCODING-dsv4.md
section 1.2): <｜User｜>, <｜Assistant｜>, <think>, </think>, ｜DSML｜, <｜latest_reminder｜>.
The task tokens (<｜action｜>, ...) do not fit; requests that use them cannot be rendered for this
model. Usage: python3 make_tiny_tokenizer.py OUTDIR (default: this file's directory)."""
import json
import os
import sys


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


SPECIAL = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
           "<think>", "</think>", "｜DSML｜", "<｜latest_reminder｜>"]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    added = [{"id": 256 + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": i < 2 or s in ("<｜User｜>", "<｜Assistant｜>")}
             for i, s in enumerate(SPECIAL)]
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": []},
    }
    cfg = {"add_bos_token": False, "add_eos_token": False, "bos_token": SPECIAL[0], "eos_token": SPECIAL[1],
           "model_max_length": 1048576, "tokenizer_class": "PreTrainedTokenizerFast"}
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
