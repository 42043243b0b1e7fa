"""What the import fixture writers share (tools/make_ds4_fixtures.py, make_sglang_pass_fixtures.py):
an importer's mapping table, the tests' fixed prompts, and a run of sparsetrace's own engine with
every tap recorded, whose trace the writer then re-expresses in another engine's dump format."""
import json
import os
import subprocess


def read_map(path, with_alignment=True):
    """[(source name, tap suffix or @alignment input)] of a schemas/import/*.map table; without
    the @ rows when with_alignment is false."""
    rows = []
    for line in open(path):
        line = line.split("#", 1)[0].split()
        if len(line) >= 3 and (with_alignment or not line[1].startswith("@")):
            rows.append((line[0], line[1]))
    return rows


def prompt_ids(n, seed):
    """n token ids from a fixed linear congruential sequence (the tests' own prompts)."""
    s, out = seed, []
    for _ in range(n):
        s = (s * 1103515245 + 12345) % 2147483648
        out.append(s // 65536 % 256)
    return out


def record_run(sparsetrace, model, ids, max_new_tokens, settings, work):
    """Runs the engine on ids with every tap at every position into work/run.h5 (settings: K=V
    strings for --set); returns the trace's path."""
    prompt = os.path.join(work, "prompt.json")
    json.dump(ids, open(prompt, "w"))
    trace = os.path.join(work, "run.h5")
    cmd = [sparsetrace, "run", "--model", model, "--prompt-tokens", prompt, "--max-new-tokens",
           str(max_new_tokens), "--ignore-eos", "--tap", "layers.*", "--tap", "logits", "--positions", "all",
           "--trace", trace, "--store", os.path.join(work, "store")]
    for kv in settings:
        cmd += ["--set", kv]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return trace
