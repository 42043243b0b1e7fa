#!/usr/bin/env python3
"""Train the bundled needle model: a small DeepSeek-V4 (transformers' DeepseekV4ForCausalLM) that
copies a line back out of a long agentic prompt, so that which compressed rows the lightning
indexer keeps decides the answer.

Runs on the GPU machine (PyTorch, transformers 5.17, tokenizers). Data: tools/needle_data.py.
Training goes in stages of at most ten minutes each; every stage resumes from the last one's
checkpoint and leaves weights, a log and an evaluation behind.

  tokenizer  a byte-level BPE with DeepSeek's pre-tokenizer (ENCODING-dsv4.md §2) trained on the
             training families, plus DeepSeek-V4's added tokens
  stage N    train stage N (see STAGES) for --budget seconds, then save and evaluate
  eval       the model card's table: recall on the held-out family and kind, at several lengths
             and needle positions, with top-k = all, the model's own index_topk, a q-only
             Hadamard rotation of the indexer (the fault the harness exists for) and small top-k
  release    the release (tools/convert_release.py) from DIR/weights, reloaded dequantised in
             transformers and evaluated next to the trained weights on the same cases
  smoke      a few steps of a miniature model through every code path, for a quick check
  parity     tools/needle_fast.py's forward (the path stage 5 trains and evaluates on) against
             transformers' eager forward on the same weights: logits, top-k sets, distillation
             loss, every fault both run, gradients (bench/needle-train-results.md)
  speed      training throughput of the eager path against the fast forward, side by side
  profile    where a fast-forward training step's time goes (torch.profiler), and torch.compile
             of its decoder layers against eager: throughput, and logits, losses, gradients
  card       rewrite a model card's tables from its training log and evaluations
  compare    two releases' card evaluations side by side (no GPU): all, per length, and the
             card's rows by kind, question family and decoys, with the change in points

Curriculum (why: a probe showed that a tiny V4 does not learn to copy across a small window
from scratch, learns in-window copying quickly, and that an untrained indexer then picks the
wrong rows):
  1  copy:    window 512, prompts of 512-1024 tokens, dense compressed attention (top-k = all);
              the indexer is distilled towards the attention mass the main attention gives each
              compressed row (KL), on detached inputs, as DeepSeek's sparse-attention training does
  2  narrow:  a window of 64, 128 or 256 tokens, drawn for each step (the copy learned in the
              window stays in use while the compressed rows must start to carry it), prompts of
              512-1536 tokens
  3  reach:   window 64 (the release's), prompts of 512-2048 tokens: most needles are reachable
              only through compressed rows; still dense, still distilling; from here the
              weights are trained quantisation-aware (QAT): FP8 e4m3 128x128-block linears and
              FP4 e2m1 experts in the forward pass, straight-through gradients, as released
  4  sparse:  top-k = index_topk: the main attention sees only the indexer's choice; the
              indexer keeps distilling over the rows it selected
  5  long:    stage 4 at 1k-32k tokens (log-uniform), 256k tokens per step in micro-batches,
              on the fast forward (tools/needle_fast.py), half of each batch from `needle make
              --batch` when --jsonl is given (tools/train_needle_gpu.sh makes it on the GPU machine)

Usage (DIR holds tokenizer.json, state.pt, weights/, log.jsonl; the committed tokenizer and the
release (models/needle-v4/, its training log in training/) seed a fresh DIR):
  python3 tools/train_needle.py tokenizer DIR
  python3 tools/train_needle.py stage 4 DIR --budget 520 [--init models/needle-v4] [--eval-seconds 75] \
      [--jsonl FILE]   # FILE: `sparsetrace needle make --batch` output, half of every batch
  python3 tools/train_needle.py eval DIR/weights --tokenizer DIR --out FILE.json [--seeds 8]
  python3 tools/train_needle.py stage 5 DIR --budget 520 --init models/needle-v5 --jsonl FILE [--compile] \
      [--peak 0.33] [--decay A:B] [--decoys SHARE:LO-HI] [--labelled SHARE] [--composed SHARE]
  python3 tools/train_needle.py release DIR models/needle-v4 --budget 420
  python3 tools/train_needle.py release DIR DEST --budget 480 --card v5   # CARD_EVALS_V5, to 32k
  python3 tools/train_needle.py card models/needle-v4/README.md --train models/needle-v4/training \
      --evals models/needle-v4/evals [--which v5]
  python3 tools/train_needle.py compare models/needle-v5/evals NEW/evals [--modes sparse,neox]
  python3 tools/train_needle.py parity|speed|profile DIR --init RELEASE --out FILE.json
  python3 tools/train_needle.py smoke DIR

On the device machine DIR must not be named in `carry`: a carried path replaces the folder
there, and with it the optimiser state of the warm machine. Between sessions the lineage
travels as the committed release (FP8/FP4, trained quantisation-aware, so its dequantised
weights are what the model computes with); state.pt stays on the machine between calls.
"""
import argparse
import json
import math
import multiprocessing as mp
import os
import random
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import needle_data as nd  # noqa: E402

# ---------------------------------------------------------------- the model

# SPEC-dsv4 §7 in spirit: every structural feature, small. Sliding layer first, then CSA and HCA
# alternating; hash MoE in layer 0; mHC with 4 streams; YaRN on the compressed rope; an indexer
# whose top-k (32) is far below the compressed rows at the trained lengths (128-512) and the
# evaluated ones (up to 2048 at 8k tokens); a 64-token window, so a needle further back is only
# reachable through compressed rows.
MODEL = dict(
    hidden_size=256, num_hidden_layers=6, compress_ratios=[0, 4, 128, 4, 128, 4, 0],
    num_nextn_predict_layers=1, num_attention_heads=8, num_key_value_heads=1, head_dim=128,
    qk_rope_head_dim=64, q_lora_rank=128, o_groups=2, o_lora_rank=128, sliding_window=64,
    index_n_heads=16, index_head_dim=128, index_topk=32, n_routed_experts=4,
    num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=256,
    scoring_func="sqrtsoftplus", norm_topk_prob=True, routed_scaling_factor=1.5, swiglu_limit=10.0,
    num_hash_layers=1, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
    rope_theta=10000.0, compress_rope_theta=160000.0,
    rope_scaling={"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                  "beta_fast": 32, "beta_slow": 1},
    max_position_embeddings=1048576, tie_word_embeddings=False, initializer_range=0.02)

SMOKE_MODEL = dict(MODEL, hidden_size=128, num_hidden_layers=3, compress_ratios=[0, 4, 128, 0],
                   num_attention_heads=2, index_n_heads=4, moe_intermediate_size=64)

STAGES = {
    1: dict(name="copy", window=512, lengths=(512, 1024), sparse=False, qat=False, lr=2e-3, warmup=30),
    2: dict(name="narrow", window=(64, 128, 256), lengths=(512, 1536), sparse=False, qat=False, lr=1.5e-3, warmup=30),
    3: dict(name="reach", window=64, lengths=(512, 2048), sparse=False, qat=True, lr=1.5e-3, warmup=30),
    4: dict(name="sparse", window=64, lengths=(512, 2048), sparse=True, qat=True, lr=6e-4, warmup=20),
    # needle-v5: the fast forward (tools/needle_fast.py), eight times the tokens per step, prompts
    # of 1k-32k tokens drawn log-uniformly (as many steps at 1-2k as at 16-32k), where the indexer
    # must find the needle's rows among up to 8k with index_topk 32
    5: dict(name="long", window=64, lengths=(1024, 32768), log_lengths=True, sparse=True, qat=True, lr=6e-4,
            warmup=20, fast=True, tokens=262144, splits=4, experts="grouped_mm"),
}
# Eager attention is S x S per head: memory grows with tokens x S (16384 tokens at S = 2048 took
# 30 GB; the batch is cut to this many tokens whatever the samples' lengths). Stages on the fast
# forward set their own ("tokens").
TOKENS_PER_STEP = 32768
LM_WEIGHT = 0.3      # ordinary language-model loss on the prompt, next to the answer loss
DISTILL_WEIGHT = 1.0  # KL(attention mass over compressed rows || indexer softmax)
BALANCE_RATE = 1e-3   # aux-loss-free balancing: router bias step per update
VOCAB = 4096
# transformers' routed-expert kernels: "eager" loops over experts (a host sync per expert and
# layer); "grouped_mm" is one grouped GEMM. The smoke test compares the two.
EXPERTS = os.environ.get("NEEDLE_EXPERTS", "eager")
DECAY_FLOOR = 0.1    # stage --decay A:B: the learning rate falls linearly to this share of the stage's
FOLLOWUPS = 3         # up to this many further questions per training prompt (more answer signal)
# The card's decoy evaluation: earlier lines of the needle's label, a ladder by seed (seed s gets
# CARD_DECOYS[s % 4]). A few fit in index_topk's 32 rows with the needle (about 4 rows a line), so
# the main attention picks the last; 12 and 24 do not, so the indexer must rank the last first,
# and only then can a position fault (index_rope, compress_rope_theta) take the needle away.
CARD_DECOYS = (1, 4, 12, 24)

# ---------------------------------------------------------------- tokenizer (ENCODING §2)

PRETOKENIZE = [r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+",
               r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|"
               r" ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"]


def _corpus_chunk(seed0):
    out = []
    for i in range(400):
        s = nd.make_sample(seed0 * 1000 + i, chars=random.Random(seed0 * 7 + i).randrange(1500, 9000))
        out.append(s.prompt.replace(nd.BOS, "") + s.answer)
    return out


def train_tokenizer(outdir):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    t0 = time.time()
    with mp.Pool(min(16, os.cpu_count() or 2)) as pool:
        texts = [t for chunk in pool.map(_corpus_chunk, range(40)) for t in chunk]
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.normalizer = normalizers.Sequence([])
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in PRETOKENIZE]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    specials = [nd.BOS, nd.EOS, nd.PAD]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(nd.ADDED_TOKENS), min_frequency=2,
                                  special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    # The markers are cut out before BPE training sees the text, as the tokenizer will at run time.
    strip = nd.ADDED_TOKENS + specials
    def clean(t):
        for m in strip:
            t = t.replace(m, "\n")
        return t
    tok.train_from_iterator((clean(t) for t in texts), trainer=trainer)
    # DeepSeek's flags: BOS/EOS/PAD special; the role, thinking and DSML markers not special.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in nd.ADDED_TOKENS])
    os.makedirs(outdir, exist_ok=True)
    tok.save(os.path.join(outdir, "tokenizer.json"))
    cfg = {"add_bos_token": False, "add_eos_token": False, "bos_token": nd.BOS, "eos_token": nd.EOS,
           "pad_token": nd.EOS, "clean_up_tokenization_spaces": False, "legacy": True,
           "model_max_length": 1048576, "tokenizer_class": "PreTrainedTokenizerFast"}
    with open(os.path.join(outdir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
    n_chars = sum(len(t) for t in texts[:2000])
    n_tok = sum(len(e.ids) for e in tok.encode_batch(texts[:2000], add_special_tokens=False))
    info = {"vocab": tok.get_vocab_size(), "corpus_texts": len(texts), "chars_per_token": n_chars / n_tok,
            "seconds": round(time.time() - t0, 1),
            "ids": {t: tok.token_to_id(t) for t in specials + nd.ADDED_TOKENS}}
    with open(os.path.join(outdir, "tokenizer_info.json"), "w") as f:
        json.dump(info, f, indent=1, ensure_ascii=False)
    print("tokenizer:", json.dumps(info, ensure_ascii=False), flush=True)
    return info


def load_tokenizer(d):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_info.json")) as f:
        info = json.load(f)
    return tok, info


# ---------------------------------------------------------------- batches


def encode_sample(tok, s):
    """(ids, spans, needle_token): the prompt, the answer and EOS, then any follow-up turns and
    their answers, as one sequence; spans are the [start, end) of every answer with its EOS (the
    first is the needle's)."""
    eos = tok.token_to_id(nd.EOS)
    if getattr(s, "ids", None) is not None:  # the C generator's example (nd.read_jsonl): ids as the engine made them
        ids = list(s.ids)
        a0 = len(ids)
        ids += list(s.answer_ids) + [eos]
        return ids, [(a0, len(ids))], s.needle_token
    enc = tok.encode(s.prompt, add_special_tokens=False)
    ids = list(enc.ids)
    spans = []
    for turn, answer in [(None, s.answer)] + list(getattr(s, "followups", []) or []):
        if turn is not None:
            ids += tok.encode(turn, add_special_tokens=False).ids
        a0 = len(ids)
        ids += tok.encode(answer, add_special_tokens=False).ids + [eos]
        spans.append((a0, len(ids)))
    needle_tok = next((i for i, (a, b) in enumerate(enc.offsets) if b > s.needle_char), len(enc.ids))
    return ids, spans, needle_tok


class Batches:
    """An endless stream of training batches for one stage, made in worker processes."""
    def __init__(self, tokdir, stage, seed, ratio, jsonl=None):
        self.tokdir, self.stage, self.seed, self.ratio = tokdir, stage, seed, ratio
        # (share, lo, hi): that share of needle_data's prompts get lo-hi decoys (make_sample)
        self.decoys = stage.get("decoys")
        # that share of needle_data's prompts are of the labelled kind (open labels: copying a label
        # no list holds), the rest drawn among the trained kinds as make_sample draws them
        self.labelled = stage.get("labelled")
        # the share of needle_data's questions composed from parts (None: make_sample's default)
        self.composed = stage.get("composed")
        # the C generator's examples (`sparsetrace needle make --batch`), half of each batch when given
        self.c_samples = nd.read_jsonl(jsonl) if jsonl else []

    def __call__(self, worker):
        import bisect
        import torch
        tok, _ = load_tokenizer(self.tokdir)
        r = random.Random(f"{self.seed}:{self.stage['name']}:{worker}")
        lo, hi = self.stage["lengths"]
        per_step = self.stage.get("tokens", TOKENS_PER_STEP)
        pad = tok.token_to_id(nd.PAD)
        by_size = sorted(((len(c.ids), i) for i, c in enumerate(self.c_samples)))
        sizes = [x[0] for x in by_size]
        n = 0
        while True:
            if self.stage.get("log_lengths"):
                length = int(math.exp(r.uniform(math.log(lo), math.log(hi))))
            else:
                length = r.randrange(lo, hi + 1)
            batch = max(1, per_step // length)
            seqs = []
            # the C generator's examples of 0.6-1x this batch's length (little padding)
            a, b = bisect.bisect_left(sizes, int(0.6 * length)), bisect.bisect_right(sizes, length)
            for _ in range(batch):
                if b > a and r.random() < 0.5:
                    seqs.append(encode_sample(tok, self.c_samples[by_size[r.randrange(a, b)][1]]))
                    continue
                decoys, kind = 0, None
                if self.decoys and r.random() < self.decoys[0]:  # no draw without decoys: the same stream
                    decoys = r.randrange(self.decoys[1], self.decoys[2] + 1)
                if self.labelled and r.random() < self.labelled:  # nor without --labelled
                    kind = "labelled"
                s = nd.make_sample(f"{self.seed}:{worker}:{n}", kind=kind,
                                   chars=int(length * self.ratio * r.uniform(0.7, 0.92)),
                                   followups=r.randrange(FOLLOWUPS + 1), decoys=decoys, composed=self.composed)
                n += 1
                seqs.append(encode_sample(tok, s))
            width = max(len(x[0]) for x in seqs)
            seqs = seqs[:max(1, per_step // width)]
            ids = torch.full((len(seqs), width), pad, dtype=torch.long)
            answer = torch.zeros((len(seqs), width), dtype=torch.bool)   # every answer
            needle = torch.zeros((len(seqs), width), dtype=torch.bool)   # the needle's answer
            valid = torch.zeros((len(seqs), width), dtype=torch.bool)
            dist = torch.zeros(len(seqs), dtype=torch.long)
            for i, (seq, spans, nt) in enumerate(seqs):
                ids[i, :len(seq)] = torch.tensor(seq)
                valid[i, :len(seq) - 1] = True           # positions whose next token is real
                for j, (a0, a1) in enumerate(spans):     # positions that predict an answer and EOS
                    answer[i, a0 - 1:a1 - 1] = True
                    if j == 0:
                        needle[i, a0 - 1:a1 - 1] = True
                dist[i] = spans[0][0] - nt
            yield ids, valid, answer, needle, dist


def _stream(args):
    gen, worker, q = args
    for b in gen(worker):
        q.put(b)


class Loader:
    def __init__(self, gen, workers=min(14, max(2, (os.cpu_count() or 4) - 2)), depth=24):
        ctx = mp.get_context("fork")
        self.q = ctx.Queue(depth)
        self.procs = [ctx.Process(target=_stream, args=((gen, w, self.q),), daemon=True) for w in range(workers)]
        for p in self.procs:
            p.start()

    def next(self):
        return self.q.get(timeout=300)  # a worker that died leaves the queue empty

    def close(self):
        for p in self.procs:
            p.terminate()


# ---------------------------------------------------------------- model, taps, losses


def _nf():
    """tools/needle_fast.py, imported when used: it needs torch, and this file's data and card
    commands run without it."""
    import needle_fast
    return needle_fast


def build_model(cfg_dict, vocab, ids, device):
    import torch
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
    cfg = DeepseekV4Config(vocab_size=vocab, bos_token_id=ids[nd.BOS], eos_token_id=ids[nd.EOS],
                           pad_token_id=ids[nd.PAD], **cfg_dict)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = EXPERTS
    torch.manual_seed(1234)
    model = DeepseekV4ForCausalLM(cfg)
    gen = torch.Generator().manual_seed(4321)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("tid2eid"):  # hash routing: a fixed random pair of experts per token
                v, k = b.shape
                b.copy_(torch.stack([torch.randperm(cfg.n_routed_experts, generator=gen)[:k] for _ in range(v)]))
    return model.to(device)


def _load_init(model, init):
    """The weights of a save_pretrained directory into model (fp32)."""
    import torch
    from transformers import DeepseekV4ForCausalLM
    loaded = DeepseekV4ForCausalLM.from_pretrained(init, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if missing or unexpected:
        raise SystemExit(f"{init}: state does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")


class Taps:
    """Forward hooks: each CSA layer's indexer scores (with gradient), its top-k, and the main
    attention's probabilities; detached indexer inputs; router choices for balancing; and the
    fault patches used by the evaluation (Hadamard on q or k only)."""
    def __init__(self, model):
        import torch
        self.scores, self.topk, self.attn, self.loads = {}, {}, {}, {}
        self.rotate = None  # None, "q", "k", "both"
        self.faults = {}    # the fast forward's faults (needle_fast.NO_FAULTS names), evaluation only
        self.hooks, self.csa = [], []
        for i, layer in enumerate(model.model.layers):
            comp = layer.self_attn.compressor
            if comp is not None and hasattr(comp, "indexer"):
                self.csa.append(i)
                idx = comp.indexer
                self.hooks.append(idx.register_forward_pre_hook(self._detach, with_kwargs=True))
                self.hooks.append(idx.scorer.register_forward_pre_hook(self._patch, with_kwargs=True))
                self.hooks.append(idx.scorer.register_forward_hook(lambda m, a, o, i=i: self.scores.__setitem__(i, o)))
                self.hooks.append(idx.register_forward_hook(lambda m, a, o, i=i: self.topk.__setitem__(i, o)))
                self.hooks.append(layer.self_attn.register_forward_hook(lambda m, a, o, i=i: self.attn.__setitem__(i, o[1])))
            gate = layer.mlp.gate
            if not layer.mlp.is_hash:
                self.hooks.append(gate.register_forward_hook(lambda m, a, o, i=i: self.loads.__setitem__(i, o[2].detach())))
        self.H = _nf().hadamard(model.config.index_head_dim, next(model.parameters()).device)
        self.torch = torch

    @staticmethod
    def _swap(args, kwargs, names, fn):
        """Apply fn to the first two inputs of a call, positional or keyword."""
        args, kwargs = list(args), dict(kwargs)
        for j, name in enumerate(names):
            if j < len(args):
                args[j] = fn(j, args[j])
            elif name in kwargs:
                kwargs[name] = fn(j, kwargs[name])
        return tuple(args), kwargs

    def _detach(self, module, args, kwargs):
        # The indexer trains on its own loss only: its inputs are cut from the main graph.
        return self._swap(args, kwargs, ("hidden_states", "q_residual"), lambda j, x: x.detach())

    def _patch(self, module, args, kwargs):
        if self.rotate is None:
            return None
        def rot(j, x):
            if (j == 0 and self.rotate in ("q", "both")) or (j == 1 and self.rotate in ("k", "both")):
                return (x.float() @ self.H).to(x.dtype)
            return x
        return self._swap(args, kwargs, ("q", "compressed_kv"), rot)

    def clear(self):
        self.scores.clear(), self.topk.clear(), self.attn.clear(), self.loads.clear()

    def distill_loss(self, seq_len, sparse):
        """Mean over CSA layers and queries of KL(p || q): p = the main attention's mass on each
        compressed row (summed over heads, normalised), q = softmax of the indexer's scores over
        the causally visible rows (in sparse mode: over the rows it selected)."""
        torch = self.torch
        total, n = 0.0, 0
        for i in self.csa:
            s = self.scores[i].float()                       # [B, S, R]
            w = self.attn[i].detach().float()                # [B, H, S, S + R]
            rows = s.shape[-1]
            if rows == 0:
                continue
            mass = w[..., w.shape[-1] - rows:].sum(1)        # [B, S, R]
            pos = torch.arange(s.shape[1], device=s.device)
            visible = torch.arange(rows, device=s.device)[None, :] < ((pos + 1) // 4)[:, None]  # [S, R]
            keep = visible.unsqueeze(0).expand_as(s)
            if sparse:
                t = self.topk[i]
                sel = torch.zeros(keep.shape[:-1] + (rows + 1,), dtype=torch.bool, device=s.device)
                sel.scatter_(-1, torch.where(t >= 0, t, rows), True)  # -1 (none) lands in a spare column
                keep = keep & sel[..., :rows]
            mass = mass.masked_fill(~keep, 0.0)
            tot = mass.sum(-1, keepdim=True)
            ok = (tot.squeeze(-1) > 1e-6) & keep.any(-1)
            p = mass / tot.clamp_min(1e-12)
            logq = torch.log_softmax(s.masked_fill(~keep, float("-inf")), dim=-1)
            kl = torch.where(p > 0, p * (torch.log(p.clamp_min(1e-30)) - logq.masked_fill(~keep, 0.0)), 0.0).sum(-1)
            total = total + (kl * ok).sum() / ok.sum().clamp_min(1)
            n += 1
        return total / max(n, 1)

    def balance(self, model):
        """DeepSeek's auxiliary-loss-free balancing: nudge each routed layer's bias towards the
        experts that got fewer tokens than the mean."""
        torch = self.torch
        with torch.no_grad():
            for i, idx in self.loads.items():
                if i in getattr(model, "_frozen_layers", ()):
                    continue
                gate = model.model.layers[i].mlp.gate
                load = torch.bincount(idx.reshape(-1), minlength=gate.num_experts).float()
                gate.e_score_correction_bias += BALANCE_RATE * torch.sign(load.mean() - load)


def set_mode(model, window=None, topk=None):
    if window is not None:
        model.config.sliding_window = window
        for layer in model.model.layers:
            layer.self_attn.sliding_window = window
    if topk is not None:
        for layer in model.model.layers:
            comp = layer.self_attn.compressor
            if comp is not None and hasattr(comp, "indexer"):
                comp.indexer.index_topk = topk


def train_step(model, taps, opt, ids, valid, answer, sparse):
    """One optimiser step on one batch: the losses, clipped gradients, the balancing update."""
    import torch
    logits, lm, ans, kl = forward_losses(model, taps, ids, valid, answer, sparse)
    loss = ans + LM_WEIGHT * lm + DISTILL_WEIGHT * kl
    opt.zero_grad(set_to_none=True)
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    taps.balance(model)
    return logits, lm, ans, kl, gn


def split_step(model, taps, opt, ids, valid, answer, needle, dist, window, sparse, fast, splits):
    """One optimiser step on one batch in `splits` micro-batches of rows (gradients accumulated,
    each micro-batch's loss weighted by its share of the rows): the fast forward's step at 256k
    tokens does not fit the GPU at once. Returns (answer metrics, lm, ans, kl, grad norm) over
    all rows; the figures reach the host in one copy at the end (a copy per figure would stall
    the GPU as often). The metrics are teacher-forced exact recall of the needle's answer (every
    answer token and EOS the argmax; greedy decoding reproduces the line exactly then), over
    all rows and over those whose needle lies beyond the window or within it."""
    import torch
    opt.zero_grad(set_to_none=True)
    B = ids.shape[0]
    bounds = [round(B * j / splits) for j in range(splits + 1)]
    exact, losses = [], []
    for a, b in zip(bounds, bounds[1:]):
        if b <= a:
            continue
        part = slice(a, b)
        logits, lm, ans, kl = forward_losses(model, taps, ids[part], valid[part], answer[part], sparse, fast)
        share = (b - a) / B
        ((ans + LM_WEIGHT * lm + DISTILL_WEIGHT * kl) * share).backward()
        pred = logits.detach().argmax(-1)
        exact.append(((pred[:, :-1] == ids[part, 1:]) | ~needle[part, :-1]).all(-1).float())
        losses.append(torch.stack([lm.detach(), ans.detach(), torch.as_tensor(kl, device=ids.device).detach()]) * share)
        del logits, lm, ans, kl, pred
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    taps.balance(model)
    exact = torch.cat(exact)
    far = dist > window
    host = torch.cat([torch.stack(losses).sum(0), gn.reshape(1).float(), exact, far.float()]).cpu()
    lm, ans, kl, gn = host[:4].tolist()
    exact, far = host[4:4 + B], host[4 + B:] > 0
    m = {"exact": exact.mean().item()}
    if far.any():
        m["exact_far"] = exact[far].mean().item()
    if (~far).any():
        m["exact_near"] = exact[~far].mean().item()
    return m, lm, ans, kl, gn


def adaptive_step(model, taps, opt, batch, window, sparse, fast, splits):
    """split_step, with the micro-batches halved until the step fits the GPU. Returns
    (result or None when even one row does not fit, splits used)."""
    import torch
    ids, valid, answer, needle, dist = batch
    while True:
        try:
            return split_step(model, taps, opt, ids, valid, answer, needle, dist, window, sparse, fast,
                              min(splits, ids.shape[0])), splits
        except torch.OutOfMemoryError:
            pass  # out of the handler first: its frame holds the failed step's tensors
        opt.zero_grad(set_to_none=True)
        taps.clear()
        torch.cuda.empty_cache()
        if splits >= ids.shape[0]:
            return None, splits
        splits *= 2


def forward_losses(model, taps, ids, valid, answer, sparse, fast=False, autocast=True):
    """Logits and the three losses of one batch; fast: through tools/needle_fast.py's forward
    (the same function, shown equal by `parity`), whose distillation skips padding. In bf16
    autocast, or fp32 throughout when autocast is False."""
    import torch
    import torch.nn.functional as F
    taps.clear()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        if fast:
            logits, distill = _nf().forward(model, ids, taps.faults)
        else:
            logits = model(input_ids=ids).logits
    logits = logits.float()
    tgt = ids[:, 1:]
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none").view_as(tgt)
    v, a = valid[:, :-1].float(), answer[:, :-1].float()
    lm = (ce * v).sum() / v.sum()
    ans = (ce * a).sum() / a.sum()
    kl = _nf().distill_loss(distill, valid) if fast else taps.distill_loss(ids.shape[1], sparse)
    return logits, lm, ans, kl


# ---------------------------------------------------------------- training stages


# ---------------------------------------------------------------- quantisation-aware training

# What the release stores in FP8 (128x128 blocks) and FP4 (32-element blocks along the input), in
# transformers' module names; tools/convert_release.py TENSOR_CLASSES is the same list in release
# names. Everything else is bf16 or fp32 there.
QAT_FP8 = ("self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.kv_proj", "self_attn.o_a_proj",
           "self_attn.o_b_proj", "compressor.indexer.q_b_proj", "shared_experts.gate_proj",
           "shared_experts.up_proj", "shared_experts.down_proj")
QAT_FP4 = ("mlp.experts",)


def fake_fp8(w):
    """w [out, in] through e4m3fn with one power-of-two scale per 128x128 block (SPEC §4.1)."""
    import torch
    o, i = w.shape
    po, pi = -o % 128, -i % 128
    x = torch.nn.functional.pad(w.float(), (0, pi, 0, po)).view((o + po) // 128, 128, (i + pi) // 128, 128)
    amax = x.abs().amax(dim=(1, 3), keepdim=True).clamp_min(1e-4)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 448.0)))
    q = (x / scale).to(torch.float8_e4m3fn).float() * scale
    return q.view(o + po, i + pi)[:o, :i].to(w.dtype)


FP4_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def fake_fp4(w):
    """w [..., in] through e2m1 with one power-of-two scale per 32 inputs (SPEC §4.2)."""
    import torch
    x = w.float().reshape(*w.shape[:-1], w.shape[-1] // 32, 32)
    amax = x.abs().amax(-1, keepdim=True).clamp_min(6 * 2.0 ** -126)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 6.0)))
    grid = torch.tensor(FP4_GRID, device=w.device)
    mids = (grid[1:] + grid[:-1]) / 2
    a = (x.abs() / scale)
    q = grid[torch.bucketize(a, mids)] * torch.sign(x) * scale
    return q.reshape(w.shape).to(w.dtype)


def _fake_quant_module(kind):
    import torch
    class FakeQuant(torch.nn.Module):
        def forward(self, w):
            with torch.no_grad():
                q = fake_fp8(w) if kind == "fp8" else fake_fp4(w)
            w = w + (q - w).detach()  # straight-through: the gradient skips the rounding
            # e2m1 values times a power of two are exact in bf16: under autocast the experts reach
            # transformers' grouped_mm in bf16, its grouped GEMM (fp32 weights take a per-expert
            # fallback); in fp32 they stay fp32, as the inputs are
            bf16 = kind == "fp4" and torch.is_autocast_enabled("cuda")
            return w.to(torch.bfloat16) if bf16 else w
    return FakeQuant()


def qat(model, on):
    """Put the release's quantisation into the forward pass of the FP8 / FP4 weights, or take it
    out again (the trained full-precision weights stay, as parametrisation originals)."""
    import torch.nn.utils.parametrize as P
    for name, mod in model.named_modules():
        if name.endswith(QAT_FP8):
            tensors, kind = ["weight"], "fp8"
        elif name.endswith(QAT_FP4):
            tensors, kind = ["gate_up_proj", "down_proj"], "fp4"
        else:
            continue
        for t in tensors:
            if on and not P.is_parametrized(mod, t):
                P.register_parametrization(mod, t, _fake_quant_module(kind), unsafe=True)
            elif not on and P.is_parametrized(mod, t):
                P.remove_parametrizations(mod, t, leave_parametrized=False)


def save(model, opt, step, stage_no, outdir, log, qat_on=False):
    import torch
    if qat_on:
        qat(model, False)  # save the full-precision weights under their own names
    model.save_pretrained(os.path.join(outdir, "weights"), max_shard_size="12MB")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "stage": stage_no},
               os.path.join(outdir, "state.pt"))
    if qat_on:
        qat(model, True)
    log({"event": "saved", "step": step, "stage": stage_no})


def _saved_steps(d):
    """The steps of the saves recorded in d/log.jsonl, in order (none if there is no log)."""
    path = os.path.join(d, "log.jsonl")
    if not os.path.exists(path):
        return []
    return [rec["step"] for rec in map(json.loads, open(path)) if rec.get("event") == "saved"]


LAYER_RATIO = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}


def model_config(outdir, init, save=False):
    """The shape of the model a stage trains: DIR/model.json when a stage ran in DIR before, else
    MODEL with INIT's layers (a release grown by tools/needle_grow.py has more, in its own order),
    else MODEL. Any other field of INIT's config that differs from MODEL is refused: the fast
    forward and the card are written for MODEL's widths. A stage saves it (save) as DIR/model.json:
    its state.pt holds that model, whatever --init a later call names."""
    path = os.path.join(outdir, "model.json")
    if os.path.exists(path):
        return json.load(open(path))
    cfg = dict(MODEL)
    src = os.path.join(init, "config.json") if init else None
    if src and os.path.exists(src):
        hf = json.load(open(src))
        types = hf.get("layer_types")
        if not isinstance(types, list) or any(t not in LAYER_RATIO for t in types):
            raise SystemExit(f"{src}: layer_types {types!r}: want a list of {sorted(LAYER_RATIO)}")
        cfg.update(num_hidden_layers=len(types),
                   compress_ratios=[LAYER_RATIO[t] for t in types] + [0] * hf.get("num_nextn_predict_layers", 1))
        for key in ("hidden_size", "num_attention_heads", "head_dim", "index_n_heads", "index_topk",
                    "n_routed_experts", "moe_intermediate_size", "hc_mult", "sliding_window", "num_hash_layers"):
            if key in hf and hf[key] != cfg[key]:
                raise SystemExit(f"{src}: {key} = {hf[key]}, the stage trains {key} = {cfg[key]} only")
    if save:
        with open(path, "w") as f:
            json.dump(cfg, f, indent=1)
    return cfg


def parse_layers(text):
    """stage --train-layers L[,L...] as a sorted list of layer numbers; a SystemExit otherwise."""
    try:
        layers = sorted({int(x) for x in text.split(",")})
    except ValueError:
        layers = []
    if not layers or layers[0] < 0:
        raise SystemExit(f"stage --train-layers: want layer numbers, comma-separated, not {text!r}")
    return layers


def freeze_except(model, layers):
    """Only the listed decoder layers train (block expansion: a grown release's new layers learn,
    the source's stay as they were): every other parameter stops requiring a gradient, and the
    balancing leaves the frozen layers' router biases alone. Returns the trainable count."""
    n = model.config.num_hidden_layers
    if layers[-1] >= n:
        raise SystemExit(f"stage --train-layers {','.join(map(str, layers))}: the model has layers 0..{n - 1}")
    keep = tuple(f"model.layers.{i}." for i in layers)
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith(keep))
    model._frozen_layers = set(range(n)) - set(layers)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def seed_dir(outdir, init):
    """A fresh DIR gets the committed tokenizer and its measured ratio, and the log so far.
    Returns the save_pretrained directory to start from: `init` itself, or, when `init` is a
    release (models/needle-v4: hf_config.json beside FP8/FP4 weights), its weights dequantised
    to float32 in DIR/init-weights, with the release's training log (training/log.jsonl)."""
    import shutil
    import subprocess
    os.makedirs(outdir, exist_ok=True)
    here = os.path.dirname(os.path.abspath(__file__))
    for name, src in (("tokenizer.json", "models/needle-v4"), ("tokenizer_config.json", "models/needle-v4"),
                      ("tokenizer_info.json", "models/needle-v4/training")):
        src = os.path.join(here, "..", src, name)
        if not os.path.exists(os.path.join(outdir, name)) and os.path.exists(src):
            shutil.copy(src, os.path.join(outdir, name))
    if not init:
        return None
    log = os.path.join(init, "log.jsonl")
    if os.path.exists(os.path.join(init, "hf_config.json")):
        log = os.path.join(init, "training", "log.jsonl")
        weights = os.path.join(outdir, "init-weights")
        if not os.path.exists(os.path.join(weights, "config.json")):
            subprocess.run([sys.executable, os.path.join(here, "convert_release.py"), "to-hf", init, weights,
                            "--dtype", "float32"], check=True)
        init = weights
    if not os.path.exists(os.path.join(outdir, "log.jsonl")) and os.path.exists(log):
        shutil.copy(log, os.path.join(outdir, "log.jsonl"))
    return init


def lr_scale(step, step0, warmup, decay=None, floor=DECAY_FLOOR):
    """The learning rate's multiplier at `step` (the steps done before this one), the optimiser
    started afresh at step0: a linear warmup over `warmup` steps (none when warmup is 0: a stage
    resumed with its optimiser's state), then constant, or with decay = (A, B) falling linearly
    from 1 at step A to `floor` at step B and staying there (a warmup-stable-decay schedule's
    cooldown). By steps, not seconds, so a stage resumed in another call goes on along the same
    line from its first step."""
    warm = min(1.0, (step - step0 + 1) / warmup) if warmup > 0 else 1.0
    if not decay:
        return warm
    a, b = decay
    frac = min(1.0, max(0.0, (step - a) / max(1, b - a)))
    return warm * (1.0 - (1.0 - floor) * frac)


def parse_decay(text):
    """stage --decay A:B as (A, B); a SystemExit naming the option otherwise."""
    try:
        decay = tuple(int(x) for x in text.split(":"))
    except ValueError:
        decay = ()
    if len(decay) != 2 or decay[1] <= decay[0]:
        raise SystemExit(f"stage --decay: want A:B, two step numbers with A < B, not {text!r}")
    return decay


def parse_lengths(text):
    """stage --lengths LO-HI as (LO, HI), prompt sizes in tokens within 128 to 32768; a SystemExit
    naming the option otherwise."""
    try:
        lo, hi = (int(x) for x in text.split("-"))
    except ValueError:
        lo, hi = 0, 0
    if not 128 <= lo <= hi <= 32768:
        raise SystemExit(f"stage --lengths: want LO-HI, prompt sizes with 128 <= LO <= HI <= 32768, not {text!r}")
    return lo, hi


def parse_decoys(text):
    """stage --decoys SHARE:LO-HI as (share, lo, hi); a SystemExit naming the option otherwise."""
    try:
        share, span = text.split(":")
        lo, hi = (int(x) for x in span.split("-"))
        share = float(share)
    except ValueError:
        share, lo, hi = -1.0, 0, 0
    if not (0 < share <= 1 and 1 <= lo <= hi):
        raise SystemExit(f"stage --decoys: want SHARE:LO-HI, a share in (0, 1] and 1 <= LO <= HI, not {text!r}")
    return share, lo, hi


def parse_share(option, text, zero=False):
    """stage --labelled SHARE (or --peak SCALE) as a float in (0, 1], or in [0, 1] with zero
    (--composed); a SystemExit naming the option otherwise."""
    try:
        share = float(text)
    except ValueError:
        share = -1.0
    above_floor = share >= 0 if zero else share > 0
    if not (above_floor and share <= 1):
        raise SystemExit(f"stage {option}: want a share in {'[0' if zero else '(0'}, 1], not {text!r}")
    return share


def stage_settings(stage_no, decoys=None, labelled=None, peak=None, composed=None, lengths=None):
    """STAGES[stage_no] with the stage command's options applied, as it logs them: --decoys, --labelled,
    --composed, --lengths (the prompt sizes drawn, the stage's way), and --peak's learning rate (a
    fine-tune of a cooled-down release: the whole schedule, warmup and decay, scaled down)."""
    st = dict(STAGES[stage_no])
    if lengths:
        st["lengths"] = tuple(lengths)
    if peak:
        st.update(lr=st["lr"] * peak, peak=peak)
    if decoys:
        st["decoys"] = list(decoys)
    if labelled:
        st["labelled"] = labelled
    if composed is not None:
        st["composed"] = composed
    return st


def run_stage(stage_no, outdir, budget, model_cfg=None, eval_seconds=75, init=None, jsonl=None, compile=False,
              splits=None, decay=None, decoys=None, labelled=None, peak=None, train_layers=None, composed=None,
              lengths=None):
    import torch
    t0 = time.time()
    st = stage_settings(stage_no, decoys, labelled, peak, composed, lengths)
    dev = "cuda"
    tok, info = load_tokenizer(outdir)
    logf = open(os.path.join(outdir, "log.jsonl"), "a")

    def log(rec):
        rec = dict(rec, t=round(time.time() - t0, 1))
        logf.write(json.dumps(rec) + "\n"), logf.flush()
        print(json.dumps(rec), flush=True)

    # Workers fork before CUDA starts in this process.
    saves = len(_saved_steps(outdir))
    loader = Loader(Batches(outdir, st, seed=1000 * stage_no + saves, ratio=info["chars_per_token"], jsonl=jsonl))
    model = build_model(model_cfg or model_config(outdir, init, save=True), tok.get_vocab_size(), info["ids"], dev)
    trainable = freeze_except(model, train_layers) if train_layers else None
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decayed = [p for n, p in named if p.ndim >= 2 and "hc" not in n]
    rest = [p for n, p in named if not (p.ndim >= 2 and "hc" not in n)]
    opt = torch.optim.AdamW([{"params": decayed, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=st["lr"], betas=(0.9, 0.95), eps=1e-8)
    step = 0
    warmup = st["warmup"]  # the optimiser's moments start from nothing; none when they are restored
    state_path = os.path.join(outdir, "state.pt")
    if os.path.exists(state_path):
        ck = torch.load(state_path, map_location=dev)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step = ck["step"]
        if ck["stage"] == stage_no:
            warmup = 0  # the same stage goes on: its learning rate is where it was, with its moments
        log({"event": "resumed", "from_stage": ck["stage"], "from_step": ck["step"], "warmup": warmup})
    elif init:
        # A committed checkpoint: weights only, the optimiser starts afresh (warmup).
        _load_init(model, init)
        step = (_saved_steps(outdir) or [0])[-1]  # seed_dir copied the lineage's log
        log({"event": "resumed from weights", "init": init, "from_step": step})
    for g in opt.param_groups:
        g["lr"] = st["lr"]
    n_params = sum(p.numel() for p in model.parameters())
    windows = st["window"] if isinstance(st["window"], tuple) else (st["window"],)
    pick = random.Random(f"window:{stage_no}:{step}")
    set_mode(model, window=windows[-1], topk=(model.config.index_topk if st["sparse"] else 1 << 30))
    if st["qat"]:
        qat(model, True)
    taps = Taps(model)
    model.train()
    per_step = st.get("tokens", TOKENS_PER_STEP)
    log({"event": "stage", "stage": stage_no, **st, "params": n_params, "tokens_per_step": per_step,
         "layers": model.config.num_hidden_layers,
         **({"train_layers": train_layers, "trainable": trainable} if train_layers else {}),
         **({"decay": list(decay), "decay_floor": DECAY_FLOOR} if decay else {})})
    stop_at = t0 + budget - max(eval_seconds, 30)
    step0, tokens, agg = step, 0, {}
    last, flops, waited, agg_tokens = time.time(), 0.0, 0.0, 0
    splits = splits or st.get("splits", 1)  # micro-batches per step; doubled when a step does not fit
    if "experts" in st and "NEEDLE_EXPERTS" not in os.environ:
        model.config._experts_implementation = st["experts"]
    cache = os.environ.get("NEEDLE_COMPILE_CACHE")
    if compile:
        _nf().use_compile(compile)  # the fast forward's decoder layers (or their mHC) through torch.compile,
        model.config._experts_implementation = "grouped_mm"  # experts without a host sync each
        log({"event": "compile", "scope": "layers" if compile is True else compile, "splits": splits,
             "cache_loaded": _nf().load_compile_cache(cache)})
    try:
        while time.time() < stop_at:
            tw = time.time()
            batch = loader.next()
            waited += time.time() - tw  # the GPU idle for data: should stay near 0
            real = int(batch[1].sum()) + batch[1].shape[0]  # tokens that are not padding
            ids, valid, answer, needle, dist = (x.to(dev, non_blocking=True) for x in batch)
            window = pick.choice(windows)
            set_mode(model, window=window)
            lr = st["lr"] * lr_scale(step, step0, warmup, decay)
            for g in opt.param_groups:
                g["lr"] = lr
            res, splits = adaptive_step(model, taps, opt, (ids, valid, answer, needle, dist), window, st["sparse"],
                                        st.get("fast", False), splits)
            if res is None:
                log({"event": "out of memory", "step": step, "batch": list(ids.shape)})
                continue
            m, lm, ans, kl, gn = res
            step += 1
            tokens += real
            flops += _nf().model_flops(model, ids.numel(), ids.shape[1], window,
                                       model.config.index_topk if st["sparse"] else 1 << 30)
            agg_tokens += real
            agg.setdefault("splits", []).append(splits)
            for k, v in dict(m, lm=lm, ans=ans, kl=kl, gnorm=gn).items():
                agg.setdefault(k, []).append(v)
            if step % 50 == 0 or step - step0 == 5:
                torch.cuda.synchronize()
                now = time.time()
                n_agg = len(agg["splits"])
                log({"step": step, "lr": lr, **{k: round(sum(v) / len(v), 4) for k, v in agg.items()},
                     "len": ids.shape[1], "window": window, "s_per_step": round((now - last) / n_agg, 3),
                     "tok_per_s": round(agg_tokens / (now - last)), "tflops": round(flops / (now - last) / 1e12, 2),
                     "data_wait_s": round(waited, 2), "mem_gb": round(torch.cuda.max_memory_allocated() / 2**30, 1)})
                agg, last, flops, waited, agg_tokens = {}, now, 0.0, 0.0, 0
    finally:
        loader.close()
        if compile:
            _nf().use_compile(False)  # evaluation runs eagerly, in fp32
            if cache:
                log({"event": "compile cache saved", "bytes": _nf().save_compile_cache(cache)})
    set_mode(model, window=min(windows))  # saved and evaluated with the narrowest window
    log({"event": "stage done", "stage": stage_no, "steps": step - step0, "tokens": tokens,
         "seconds": round(time.time() - t0, 1)})
    save(model, opt, step, stage_no, outdir, log, qat_on=st["qat"])
    if eval_seconds > 0:
        model.eval()
        res = evaluate(model, taps, tok, info, lengths=[1024, 2048], positions=[0.25, 0.55, 0.8, 0.97],
                       seeds=4, modes=["all", "sparse", "q-rot"], deadline=t0 + budget - 5)
        log({"event": "quick eval", **res["summary"]})
    logf.close()


# ---------------------------------------------------------------- evaluation

MODES = {
    "all": dict(topk=1 << 30, rotate=None),       # every compressed row reaches the attention
    "sparse": dict(topk=None, rotate=None),       # the model's own index_topk
    "both-rot": dict(topk=None, rotate="both"),   # control: H on q and k leaves q.k unchanged
    "q-rot": dict(topk=None, rotate="q"),         # fault F1: Hadamard on the indexer q only
    "k-rot": dict(topk=None, rotate="k"),         # its mirror
    "topk-4": dict(topk=4, rotate=None),          # too small a top-k
    "no-rows": dict(topk=0, rotate=None),         # CSA rows cut off: window and HCA only
    # the fast forward only (tools/needle_fast.py faults; the harness's settings of the same names)
    "fnuz-k": dict(topk=None, rotate=None, faults={"index_k": "fp8_e4m3fn_as_fnuz"}),  # F2
    "neox": dict(topk=None, rotate=None, faults={"index_rope": "neox"}),               # index_rope=neox
    "theta-40k": dict(topk=None, rotate=None, faults={"compress_rope_theta": 40000.0}),
    "topk-1": dict(topk=1, rotate=None),
}
FAST_ONLY_MODES = [m for m, spec in MODES.items() if "faults" in spec]
DENSE_EVAL_ELEMS = 1 << 31  # evaluate: fp32 attention scores per batch in a dense mode (8 GiB)


def eval_cases(tok, info, lengths, positions, seeds, family, kind, decoys=0):
    """needle_data's prompts aimed at each length's tokens. decoys: a count for every case, or a
    ladder of counts taken by seed (seed s gets decoys[s % len(decoys)])."""
    cases = []
    for L in lengths:
        for p in positions:
            for sd in range(seeds):
                chars = int(L * info["chars_per_token"])
                d = decoys[sd % len(decoys)] if isinstance(decoys, (list, tuple)) else decoys
                for _ in range(3):  # aim at L tokens: rescale by the measured size
                    s = nd.make_sample(f"eval:{sd}", family, kind, chars, p, False, train=False, decoys=d)
                    seq, spans, nt = encode_sample(tok, s)
                    a0 = spans[0][0]
                    if abs(a0 - L) < 0.03 * L:
                        break
                    chars = int(chars * L / a0)
                cases.append(dict(L=L, position=p, seed=sd, seq=seq, a0=a0, needle_tok=nt,
                                  needle=s.needle, kind=s.kind, family=s.family, decoys=s.decoys))
    return cases


def jsonl_cases(path, split, eos):
    """Evaluation cases from `sparsetrace needle make --batch` output (needle_data.read_jsonl):
    the harness's own prompts, with the engine's ids, each answer followed by EOS (id eos). L is
    the requested size, position the needle's fraction."""
    cases = []
    for i, s in enumerate(nd.read_jsonl(path, split)):
        seq = list(s.ids) + list(s.answer_ids) + [eos]
        # positions drawn uniformly: binned by quarter (0.25 holds (0, 0.25], ...)
        cases.append(dict(L=s.size, position=max(0.25, math.ceil(s.position * 4) / 4), seed=i, seq=seq, a0=len(s.ids),
                          needle_tok=s.needle_token, needle=s.needle, kind=s.kind, family=s.family,
                          format=s.format, shape=s.shape, decoys=s.decoys))
    return cases


def evaluate(model, taps, tok, info, lengths, positions, seeds, modes, family=nd.HELDOUT_FAMILY,
             kind=nd.HELDOUT_KIND, deadline=None, fast=False, cases=None, decoys=0):
    """Exact recall of every case under every mode. fast: through tools/needle_fast.py (every
    mode, up to 32k tokens); otherwise transformers' eager forward with hooks (not the modes of
    FAST_ONLY_MODES). cases: prepared ones (jsonl_cases) instead of needle_data's."""
    import torch
    dev = next(model.parameters()).device
    if cases is None:
        cases = eval_cases(tok, info, lengths, positions, seeds, family, kind, decoys)
    else:
        lengths = sorted({c["L"] for c in cases})
    own_topk = model.config.index_topk
    # Batches of cases of one length, right-padded (causal: padding after a prompt changes
    # nothing before it). A mode that keeps every compressed row ("all") runs the fast forward's
    # dense attention, [B, heads, S, S/4] fp32 scores: its batches hold at most DENSE_EVAL_ELEMS
    # of them (one prompt at 32k), the other modes' as many tokens as training's.
    def batches_of(L, dense):
        group = [c for c in cases if c["L"] == L]
        bs = max(1, (131072 if fast else 16384) // (L + 64))
        if fast and dense:
            bs = max(1, min(bs, DENSE_EVAL_ELEMS // (model.config.num_attention_heads * (L + 64) * (L // 4 + 1))))
        out = []
        for j in range(0, len(group), bs):
            part = group[j:j + bs]
            width = max(len(c["seq"]) for c in part)
            ids = torch.full((len(part), width), tok.token_to_id(nd.PAD), dtype=torch.long)
            for i, c in enumerate(part):
                ids[i, :len(c["seq"])] = torch.tensor(c["seq"])
            out.append((part, ids.to(dev)))
        return out
    for mode in modes:
        if not fast and mode in FAST_ONLY_MODES:
            raise SystemExit(f"evaluate: mode {mode} runs on the fast forward only")
    # Length by length, every mode at each: a deadline leaves the longest lengths out, never a mode.
    late = False
    for L in lengths:
        made = {}  # this length's batches, made once for the dense modes and once for the others
        for mode in modes:
            spec = MODES[mode]
            set_mode(model, topk=own_topk if spec["topk"] is None else spec["topk"])
            taps.rotate = spec["rotate"]
            taps.faults = dict(spec.get("faults", {}), rotate=spec["rotate"])
            dense = spec["topk"] is not None and spec["topk"] >= 1 << 20
            if dense not in made:
                made[dense] = batches_of(L, dense)
            for part, ids in made[dense]:
                late = late or bool(deadline and time.time() > deadline)
                if late:
                    break
                taps.clear()
                # fast: fp32, as the engine computes; transformers' path in bf16 autocast, as before
                with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=not fast):
                    if fast:
                        pred = _nf().forward(model, ids, taps.faults)[0].argmax(-1)
                    else:
                        pred = model(input_ids=ids).logits.argmax(-1)
                for i, c in enumerate(part):
                    a0, n = c["a0"], len(c["seq"])
                    ok = (pred[i, a0 - 1:n - 1] == ids[i, a0:n]).float()
                    c.setdefault("exact", {})[mode] = bool(ok.all())
                    c.setdefault("token_acc", {})[mode] = ok.mean().item()
            taps.rotate, taps.faults = None, {}
    set_mode(model, topk=own_topk)
    summary = summarise(cases, modes)
    table = {}
    for c in cases:
        for mode, e in c.get("exact", {}).items():
            table.setdefault(mode, {}).setdefault(str(c["L"]), {}).setdefault(str(c["position"]), []).append(e)
    for mode in table:
        for L in table[mode]:
            for p in table[mode][L]:
                v = table[mode][L][p]
                table[mode][L][p] = round(100 * sum(v) / len(v), 1)
    actual = {str(L): round(sum(c["a0"] for c in cases if c["L"] == L) / max(1, sum(1 for c in cases if c["L"] == L)))
              for L in lengths}
    complete = [L for L in lengths if all(m in c.get("exact", {}) for c in cases if c["L"] == L for m in modes)]
    return {"family": family, "kind": kind, "seeds": seeds, "index_topk": own_topk,
            "window": model.config.sliding_window, "mean_prompt_tokens": actual,
            "summary": summary, "table": table, "lengths_complete": complete,
            "fast": fast,
            "cases": [{k: c[k] for k in ("L", "position", "seed", "a0", "needle_tok", "needle", "kind", "family",
                                         "format", "shape", "decoys", "exact", "token_acc")
                       if k in c} for c in cases]}


def summarise(cases, modes):
    """Each mode's exact recall over the cases measured in it, in %; None where no case was (a
    budget spent before the evaluation's first length), not a 0.0 that reads as every case lost."""
    summary = {}
    for mode in modes:
        done = [c["exact"][mode] for c in cases if mode in c.get("exact", {})]
        summary[mode] = round(100 * sum(done) / len(done), 1) if done else None
    return summary


def load_trained(weights):
    """A save_pretrained directory on the GPU, fp32, eager attention, in evaluation mode."""
    import torch
    from transformers import DeepseekV4ForCausalLM
    model = DeepseekV4ForCausalLM.from_pretrained(weights, dtype=torch.float32).to("cuda").eval()
    model.config._attn_implementation = "eager"
    return model


def run_eval(weights, tokdir, out, seeds, lengths, modes, family, kind, budget, qat_on=False, fast=False,
             jsonl=None, decoys=0):
    """evaluate() of the weights, written to out. jsonl: (path, split) of `needle make --batch`
    output, whose examples are the cases (jsonl_cases) instead of needle_data's."""
    import torch
    t0 = time.time()
    tok, info = load_tokenizer(tokdir)
    model = load_trained(weights)
    if qat_on:
        qat(model, True)
    taps = Taps(model)
    cases = jsonl_cases(jsonl[0], jsonl[1], tok.token_to_id(nd.EOS)) if jsonl else None
    res = evaluate(model, taps, tok, info, lengths, [0.25, 0.55, 0.8, 0.97], seeds, modes, family, kind,
                   deadline=t0 + budget, fast=fast, cases=cases, decoys=decoys)
    res["weights"], res["qat"], res["seconds"] = weights, qat_on, round(time.time() - t0, 1)
    res["decoys"] = list(decoys) if isinstance(decoys, (list, tuple)) else decoys
    if jsonl:
        res["jsonl"] = os.path.basename(jsonl[0])
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: res[k] for k in ("family", "kind", "summary", "mean_prompt_tokens", "seconds")}), flush=True)
    for mode, t in res["table"].items():
        print(mode, json.dumps(t), flush=True)
    del model
    torch.cuda.empty_cache()
    return res


# The model card's evaluations, all of the release reloaded in transformers except the last:
# (file in DIR/evals, title, weights, family, kind, modes). "release" is the release's weights
# dequantised; "trained" is the trained weights with QAT's fake quantisation on, which is the
# function training optimised and, code for code, the release's arithmetic: the two must agree.
ALL_MODES = list(MODES)
CARD_EVALS = [
    ("heldout_family.json", "Held-out template family, every needle kind", "release",
     nd.HELDOUT_FAMILY, None, ALL_MODES),
    ("any.json", "Every template family and needle kind", "release", None, None, ALL_MODES),
    ("heldout_family_and_kind.json", "Held-out template family and held-out needle kind", "release",
     nd.HELDOUT_FAMILY, nd.HELDOUT_KIND, ALL_MODES),
    ("trained_heldout_family.json", "The trained weights under QAT (before release), held-out family", "trained",
     nd.HELDOUT_FAMILY, None, ["all", "sparse", "q-rot"]),
]


# needle-v5's card (release --card v5): the fast forward in fp32, every mode it has, prompts to
# 32k tokens. (file, title, weights, cases, modes); cases: ("python", family, kind) for
# needle_data's generator, or ("jsonl", NAME, split) for DIR/evals-NAME.jsonl, written by
# `needle make --batch` with evaluation seeds (tools/train_needle_gpu.sh evaldata).
V5_LENGTHS = [1024, 2048, 4096, 8192, 16384, 32768]
CARD_EVALS_V5 = [
    ("heldout_family.json", "Held-out template families, every needle kind (the held-out one among them)", "release",
     ("python", nd.HELDOUT_FAMILY, None), ALL_MODES),
    ("heldout_kind.json", "Held-out needle kind", "release", ("python", None, nd.HELDOUT_KIND), ["sparse", "q-rot"]),
    ("needle_make.json", "needle make's prompts: trained kinds, every format, both shapes, thinking on and off",
     "release", ("jsonl", "make-train", "train"), ["all", "sparse", "both-rot", "q-rot"]),
    ("needle_make_heldout.json", "needle make's held-out kinds (email, env) and question families (q5, q6)",
     "release", ("jsonl", "make-heldout", "heldout"), ["sparse", "q-rot"]),
    ("bug_report.json", "Bug-report shape (toollist), held-out kinds and wording", "release",
     ("jsonl", "toollist-heldout", "heldout"), ["sparse", "q-rot"]),
    ("decoys.json", f"Held-out family, {'/'.join(map(str, CARD_DECOYS))} earlier lines of the needle's label by seed, "
     "the last one asked for (held-out wording): where a line sits is all that tells it", "release",
     ("python", nd.HELDOUT_FAMILY, None, CARD_DECOYS), ["all", "sparse", "q-rot", "neox", "theta-40k", "topk-4"]),
    ("needle_make_decoys.json", "needle make's prompts with 1-24 decoys (--decoys 1-24; trained kinds): the last "
     "line of the label asked for", "release", ("jsonl", "make-decoys", "train"), ["sparse", "q-rot", "neox", "theta-40k"]),
    ("trained_heldout_family.json", "The trained weights under QAT (before release), held-out family", "trained",
     ("python", nd.HELDOUT_FAMILY, None), ["all", "sparse", "q-rot"]),
]


def eval_share(left, evals, n):
    """The seconds card evaluation evals[n] gets of the `left` still unspent: shared by mode among
    it and those after it (each entry's modes are its last field), so one of 11 modes gets 11 shares
    to another's 2, and what an evaluation leaves unused goes to those after it. An even split gave
    heldout_family's 11 modes the time of bug_report's 2, which finishes in a tenth of it."""
    return left * len(evals[n][-1]) / sum(len(e[-1]) for e in evals[n:])


def reach(res):
    """How far a card evaluation got: the lengths it completed, then its cases measured."""
    return len(res["lengths_complete"]), sum("exact" in c for c in res["cases"])


def unfinished(evals, results, lengths):
    """The entries of evals whose result (results, by file name) stopped before the last of
    lengths, in evals' order: release's second pass measures them again with the time left."""
    return [e for e in evals if e[0] in results and len(results[e[0]]["lengths_complete"]) < len(lengths)]


def release(outdir, dest, seeds, lengths, budget, card="v4", only=None, source=None):
    """Write the release (FP8 / FP4, reference names) from DIR/weights, reload its dequantised
    weights in transformers and measure the model card's evaluations (CARD_EVALS) into
    DEST/evals; the training log and tokenizer figures go to DEST/training. source: an existing
    release (a committed model directory) copied to DEST and measured as it is, for a machine
    that did not train it (its "trained" evaluations are left out: there are no weights under
    QAT to measure)."""
    import shutil
    import subprocess
    t0 = time.time()
    here = os.path.dirname(os.path.abspath(__file__))
    weights = os.path.join(outdir, "weights")
    conv = [sys.executable, os.path.join(here, "convert_release.py")]
    if source:
        if os.path.abspath(source) != os.path.abspath(dest):  # DEST/evals: an earlier call's, kept (--only)
            shutil.copytree(source, dest, ignore=shutil.ignore_patterns("evals"), dirs_exist_ok=True)
    else:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(outdir, name), os.path.join(weights, name))
        subprocess.run(conv + ["to-release", weights, dest], check=True)
    deq = os.path.join(outdir, "release-dequantised")
    shutil.rmtree(deq, ignore_errors=True)
    subprocess.run(conv + ["to-hf", dest, deq, "--dtype", "float32"], check=True)
    os.makedirs(os.path.join(dest, "training"), exist_ok=True)
    os.makedirs(os.path.join(dest, "evals"), exist_ok=True)
    if not source:
        for name in ("log.jsonl", "tokenizer_info.json"):
            shutil.copy(os.path.join(outdir, name), os.path.join(dest, "training", name))
    if budget <= 0:  # the release alone: it carries the lineage to the next session's --init
        print(f"release: {dest} written, no evaluation", flush=True)
        return
    results = {}
    evals = CARD_EVALS if card == "v4" else CARD_EVALS_V5
    if only:
        unknown = set(only) - {e[0] for e in evals}
        if unknown:
            raise SystemExit(f"release --only: no card evaluation named {', '.join(sorted(unknown))}")
        evals = [e for e in evals if e[0] in only]
    if source:
        evals = [e for e in evals if e[2] != "trained"]
    def measure(entry, share, out):
        """run_eval of one CARD_EVALS(_V5) entry for `share` seconds into out; None when its
        `needle make` examples are missing."""
        if card == "v4":
            name, _, which, family, kind, modes = entry
            jsonl, decoys = None, 0
        else:
            name, _, which, cases, modes = entry
            family, kind = (cases[1], cases[2]) if cases[0] == "python" else (None, None)
            decoys = cases[3] if cases[0] == "python" and len(cases) > 3 else 0
            jsonl = (os.path.join(outdir, f"evals-{cases[1]}.jsonl"), cases[2]) if cases[0] == "jsonl" else None
            if jsonl and not os.path.exists(jsonl[0]):
                print(f"release: {jsonl[0]} missing: {name} not evaluated", flush=True)
                return None
        return run_eval(deq if which == "release" else weights, outdir, out, seeds, lengths, modes, family, kind,
                        share, qat_on=which == "trained", fast=card != "v4", jsonl=jsonl, decoys=decoys)

    for n, entry in enumerate(evals):
        res = measure(entry, eval_share(budget - (time.time() - t0), evals, n), os.path.join(dest, "evals", entry[0]))
        if res is not None:
            results[entry[0]] = res
    # the time the evaluations left unspent, to those that ran out before their last length: each
    # measured again from the start (the same cases, deterministic) and the run that reached
    # further kept
    short = unfinished(evals, results, lengths)
    for n, entry in enumerate(short):
        share = eval_share(budget - (time.time() - t0), short, n)
        if share <= results[entry[0]]["seconds"]:
            continue  # no further than the first run got
        out = os.path.join(dest, "evals", entry[0])
        print(f"release: {entry[0]} stopped before {lengths[-1]} tokens: measured again for {share:.0f} s", flush=True)
        again = measure(entry, share, out + ".again")
        if reach(again) > reach(results[entry[0]]):
            os.replace(out + ".again", out)
            results[entry[0]] = again
        else:
            os.remove(out + ".again")
    if "heldout_family.json" not in results or "trained_heldout_family.json" not in results:
        return
    rel, tr = results["heldout_family.json"], results["trained_heldout_family.json"]
    same = [a["exact"][m] == b["exact"][m] for a, b in zip(rel["cases"], tr["cases"])
            for m in tr["summary"] if m in a.get("exact", {}) and m in b.get("exact", {})]
    print(f"release vs trained under QAT: {sum(same)} of {len(same)} case verdicts agree; "
          + json.dumps({m: (rel["summary"].get(m), tr["summary"][m]) for m in tr["summary"]}), flush=True)


def smoke(outdir):
    """Every code path on a miniature model, in well under a minute."""
    global TOKENS_PER_STEP
    import torch
    seed_dir(outdir, None)
    if not os.path.exists(os.path.join(outdir, "tokenizer.json")):
        train_tokenizer(outdir)
    tok, info = load_tokenizer(outdir)
    model = build_model(SMOKE_MODEL, tok.get_vocab_size(), info["ids"], "cuda")
    taps = Taps(model)
    assert taps.csa, "no CSA layer found"
    TOKENS_PER_STEP = 4096
    gen = Batches(outdir, STAGES[1], 0, info["chars_per_token"])(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for sparse in (False, True):
        set_mode(model, window=64, topk=8 if sparse else 1 << 30)
        for _ in range(2):
            ids, valid, answer, needle, dist = (x.cuda() for x in next(gen))
            logits, lm, ans, kl, gn = train_step(model, taps, opt, ids, valid, answer, sparse)
            print(f"smoke sparse={sparse} len={ids.shape[1]} lm={lm.item():.3f} ans={ans.item():.3f} kl={float(kl):.4f} "
                  f"scores={[tuple(taps.scores[i].shape) for i in taps.csa]} attn={[tuple(taps.attn[i].shape) for i in taps.csa]}",
                  flush=True)
            assert math.isfinite(float(kl)) and float(kl) >= 0
    # The grouped-GEMM experts against the eager loop: same losses, and which is faster.
    ids, valid, answer, needle, dist = (x.cuda() for x in next(gen))
    got = {}
    for impl in ("eager", "grouped_mm"):
        try:
            model.config._experts_implementation = impl
            for _ in range(2):
                torch.cuda.synchronize()
                t1 = time.time()
                logits, lm, ans, kl = forward_losses(model, taps, ids, valid, answer, False)
                (ans + lm + kl).backward()
                opt.zero_grad()
                torch.cuda.synchronize()
            got[impl] = (lm.item(), time.time() - t1)
        except Exception as e:  # noqa: BLE001 - report and go on with eager
            got[impl] = repr(e)[:200]
    model.config._experts_implementation = EXPERTS
    print(f"smoke experts: {got}", flush=True)
    # QAT's fake quantisation equals the release converter's, code for code.
    import numpy as np
    import convert_release as cr
    w = torch.randn(200, 300) * 0.05
    q8 = fake_fp8(w).double().numpy()
    codes, k = cr.quantize_fp8_blocks(w.double().numpy())
    d8 = cr.dequantize_fp8_blocks(codes, np.ldexp(1.0, k))
    w4 = torch.randn(64, 256) * 0.05
    packed, k4 = cr.quantize_fp4_rows(w4.double().numpy())
    d4 = cr.dequantize_fp4_rows(packed, np.ldexp(1.0, k4))
    q4 = fake_fp4(w4).double().numpy()
    print(f"smoke qat: fp8 equal {np.mean(q8 == d8):.6f}, fp4 equal {np.mean(q4 == d4):.6f}", flush=True)
    assert np.mean(q8 == d8) > 0.999 and np.mean(q4 == d4) > 0.999
    qat(model, True)
    ids, valid, answer, needle, dist = (x.cuda() for x in next(gen))
    logits, lm, ans, kl, gn = train_step(model, taps, opt, ids, valid, answer, True)
    print(f"smoke qat step: lm={lm.item():.3f} ans={ans.item():.3f}", flush=True)
    model.eval()
    res = evaluate(model, taps, tok, info, [512], [0.5], 2, list(MODES))
    print("smoke eval", res["summary"], flush=True)
    qat(model, False)
    model.save_pretrained(os.path.join(outdir, "smoke-weights"))
    names = cr.open_checkpoint(os.path.join(outdir, "smoke-weights"))  # one file or shards
    assert names and not any("parametrizations" in n for n in names), "QAT names leaked into the save"
    print("smoke ok", flush=True)


TIE_TOLERANCE = 1e-5  # of the row's largest |score|: what fp32 reordering upstream can move a score


def _topk_compare(ref_sel, got_sel, ref_scores):
    """Per query, are the two top-k sets equal? Where not, is every row in one set only a
    boundary tie: its score within TIE_TOLERANCE of the smallest score kept? (The fast forward
    sums its softmax over fewer terms, so hidden states differ in the last bits and rows tied
    to that precision may swap.) Returns (queries, equal, ties, largest gap of a non-tie)."""
    import torch
    a = torch.sort(ref_sel, -1).values
    b = torch.sort(got_sel, -1).values
    differ = (a != b).any(-1)
    ties, worst = 0, 0.0
    for bi, si in differ.nonzero().tolist():
        sa, sb = set(a[bi, si].tolist()) - {-1}, set(b[bi, si].tolist()) - {-1}
        row = ref_scores[bi, si].float()
        scale = max(row[[j for j in sa | sb]].abs().max().item(), 1e-30) if sa | sb else 1.0
        edge = min(row[j].item() for j in sa) if sa else 0.0
        gap = max((abs(row[j].item() - edge) / scale for j in sa ^ sb), default=0.0)
        if gap <= TIE_TOLERANCE:
            ties += 1
        else:
            worst = max(worst, gap)
    n = differ.numel()
    return n, n - int(differ.sum()), ties, worst


def parity(outdir, init, out):
    """The fast forward (tools/needle_fast.py) against transformers' eager forward on the same
    weights: a random model and the release (--init), prompts of 1-5k tokens and a right-padded
    batch, every evaluation mode that both run. fp32 without TF32: logits (max difference over
    the largest logit), argmax, top-k sets (ties at the boundary counted apart) and the
    distillation loss; bf16 autocast: logits and argmax; and the gradients of the training loss.
    Writes the figures to OUT (JSON); exits 1 when a check fails."""
    import torch
    import torch.nn.functional as F
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tok, info = load_tokenizer(outdir)
    pad = tok.token_to_id(nd.PAD)
    nfm = _nf()
    seqs = []
    for i, L in enumerate((1000, 2600, 5200)):
        sm = nd.make_sample(f"parity:{i}", chars=int(L * info["chars_per_token"]), train=False)
        seqs.append(encode_sample(tok, sm)[0])
    batches = [torch.tensor([q], device="cuda") for q in seqs]
    width = max(len(seqs[0]), len(seqs[1]))
    padded = torch.full((2, width), pad, dtype=torch.long)
    for i in range(2):
        padded[i, :len(seqs[i])] = torch.tensor(seqs[i])
    batches.append(padded.cuda())
    report, failed = {}, []
    for which in ("random", "release") if init else ("random",):
        model = build_model(model_config(outdir, init), tok.get_vocab_size(), info["ids"], "cuda")
        if which == "release":
            _load_init(model, init)
        model.eval()
        taps = Taps(model)
        own = model.config.index_topk
        rep = report.setdefault(which, {})
        for mode in [m for m in MODES if m not in FAST_ONLY_MODES]:
            spec = MODES[mode]
            set_mode(model, topk=own if spec["topk"] is None else spec["topk"])
            worst, agree, n_pos, tk, gap, moved, after_tie = 0.0, 0, 0, [0, 0, 0], 0.0, False, 0
            kl_ref, kl_got = [], []
            for ids in batches:
                taps.clear()
                taps.rotate = spec["rotate"]
                with torch.no_grad():
                    ref = model(input_ids=ids).logits
                    ref_topk = {i: taps.topk[i].clone() for i in taps.csa}
                    ref_scores = {i: taps.scores[i].clone() for i in taps.csa}
                    kl_ref.append(float(taps.distill_loss(ids.shape[1], spec["topk"] != 1 << 30)))
                    taps.rotate = None
                    got, distill = nfm.forward(model, ids, {"rotate": spec["rotate"]})
                    kl_got.append(float(nfm.distill_loss(distill)))
                this = ((got - ref).abs().max() / ref.abs().max()).item()
                same = int((got.argmax(-1) == ref.argmax(-1)).sum())
                swapped = False
                for (scores, mass, sel), i in zip(distill, taps.csa):
                    if swapped:  # a tie swapped a row in an earlier layer: this one's inputs differ
                        after_tie += ref_topk[i].shape[0] * ref_topk[i].shape[1]
                        continue
                    if sel.shape[-1] == ref_topk[i].shape[-1]:
                        n, eq, ties, g = _topk_compare(ref_topk[i], sel, ref_scores[i])
                    else:
                        n, eq, ties, g = ref_topk[i].shape[0] * ref_topk[i].shape[1], 0, 0, float("inf")
                    tk = [tk[0] + n, tk[1] + eq, tk[2] + ties]
                    gap, swapped = max(gap, g), swapped or eq < n
                # logits and argmax are held to fp32 only where no tie swapped a row: a swapped
                # row is another (equally right) attention input from there on
                if not swapped:
                    worst = max(worst, this)
                    if same < ids.numel():
                        moved = True
                agree += same
                n_pos += ids.numel()
            rep[mode] = dict(logits_rel_max=worst, argmax_agree=f"{agree}/{n_pos}",
                             topk_equal=f"{tk[1]}/{tk[0]}", topk_ties=tk[2], non_tie_gap=gap,
                             queries_after_a_tie=after_tie,
                             kl_ref=[round(x, 6) for x in kl_ref], kl_fast=[round(x, 6) for x in kl_got])
            print(which, mode, json.dumps(rep[mode]), flush=True)
            if worst > 1e-4 or moved or tk[0] - tk[1] - tk[2] > 0 \
                    or any(abs(a - b) > 1e-3 * max(1e-3, abs(a)) for a, b in zip(kl_ref, kl_got)):
                failed.append(f"{which}/{mode}")
        set_mode(model, topk=own)
        # bf16 autocast, as training runs, in context: transformers' own bf16 against its fp32
        worst, agree, n_pos, own_worst, own_agree = 0.0, 0, 0, 0.0, 0
        for ids in batches:
            with torch.no_grad():
                exact = model(input_ids=ids).logits.float()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    ref = model(input_ids=ids).logits.float()
                    got = nfm.forward(model, ids)[0].float()
            worst = max(worst, ((got - ref).abs().max() / ref.abs().max()).item())
            agree += int((got.argmax(-1) == ref.argmax(-1)).sum())
            own_worst = max(own_worst, ((ref - exact).abs().max() / exact.abs().max()).item())
            own_agree += int((ref.argmax(-1) == exact.argmax(-1)).sum())
            n_pos += ids.numel()
        rep["bf16"] = dict(logits_rel_max=worst, argmax_agree=f"{agree}/{n_pos}",
                           transformers_bf16_vs_fp32=dict(logits_rel_max=own_worst, argmax_agree=f"{own_agree}/{n_pos}"))
        print(which, "bf16", json.dumps(rep["bf16"]), flush=True)
        # gradients of the training loss (answer + LM + distillation), fp32, sparse
        model.train()
        ids = batches[1]
        valid = torch.ones_like(ids, dtype=torch.bool)
        answer = torch.zeros_like(ids, dtype=torch.bool)
        answer[:, -20:] = True
        grads = {}
        for fast in (False, True):
            model.zero_grad(set_to_none=True)
            taps.clear()
            if fast:
                logits, distill = nfm.forward(model, ids)
                kl = nfm.distill_loss(distill)
            else:
                logits = model(input_ids=ids).logits
                kl = taps.distill_loss(ids.shape[1], True)
            ce = F.cross_entropy(logits[0, :-1].float(), ids[0, 1:])
            (ce + kl).backward()
            grads[fast] = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        names = sorted(set(grads[False]) | set(grads[True]))
        missing = [n for n in names if n not in grads[False] or n not in grads[True]]
        rel = max(((grads[True][n] - grads[False][n]).abs().max() / grads[False][n].abs().max().clamp_min(1e-30)).item()
                  for n in names if n not in missing)
        rep["grad"] = dict(params=len(names), missing=missing[:5], rel_max=rel)
        print(which, "grad", json.dumps(rep["grad"]), flush=True)
        if missing or rel > 1e-3:
            failed.append(f"{which}/grad")
        model.eval()
        del model
        torch.cuda.empty_cache()
    report["failed"] = failed
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    print("parity:", "ok" if not failed else "FAILED " + ", ".join(failed), flush=True)
    return 0 if not failed else 1


def _head_sum_elementwise(s, w, scale):
    """The indexer's head sum as needle_fast had it until 2026-12-05, for speed's side-by-side row:
    relu, a multiply by w and a sum over heads, elementwise ([..., Hi, R] written and read three
    times more than needle_fast._head_sum's product)."""
    import torch.nn.functional as F
    return (F.relu(s) * scale * w.unsqueeze(-1)).sum(dim=-2)


def speed(outdir, init, out, steps=8, only=None):
    """Training throughput, side by side in one process: the path needle-v4 trained on
    (transformers' eager forward, 32k tokens per step) against the fast forward (256k tokens
    per step), on the same prompt lengths, then the fast forward at 8k, 16k and 32k tokens, and
    at 16k with the indexer's head sum as it was (_head_sum_elementwise). Tokens per second, model
    TFLOP/s (needle_fast.model_flops) and the share of the bf16 peak measured on this H200
    (bench/gpu-results.md). Batches are made before the clock starts. only: the configs whose
    names contain one of these strings (the v4 path, the peer of every ratio, always runs)."""
    import torch
    tok, info = load_tokenizer(outdir)
    # (name, prompt lengths, tokens per step, fast forward, experts, micro-batches): fewer
    # micro-batches mean fewer kernel launches per token (a step launched 14,000), more memory
    configs = [("v4 path: transformers eager, eager experts", (512, 2048), 32768, False, "eager", 1),
               ("fast forward, eager experts", (512, 2048), 262144, True, "eager", 4),
               ("fast forward, grouped_mm experts", (512, 2048), 262144, True, "grouped_mm", 4),
               ("fast forward, grouped_mm, 2 micro-batches", (512, 2048), 262144, True, "grouped_mm", 2),
               ("fast forward, grouped_mm, 1 micro-batch", (512, 2048), 262144, True, "grouped_mm", 1),
               ("fast forward, grouped_mm, 8k prompts", (8192, 8192), 262144, True, "grouped_mm", 4),
               ("fast forward, grouped_mm, 16k prompts", (16384, 16384), 262144, True, "grouped_mm", 4),
               ("fast forward, grouped_mm, 16k prompts, the elementwise head sum", (16384, 16384), 262144, True,
                "grouped_mm", 4),
               ("fast forward, grouped_mm, 32k prompts", (32768, 32768), 262144, True, "grouped_mm", 4)]
    if only:
        configs = configs[:1] + [c for c in configs[1:] if any(o in c[0] for o in only)]
    prepared = []  # the workers fork before CUDA starts in this process
    for name, lengths, per_step, fast, experts, _ in configs:
        st = dict(STAGES[4], lengths=lengths, tokens=per_step)
        loader = Loader(Batches(outdir, st, seed=77, ratio=info["chars_per_token"]))
        t0 = time.time()
        prepared.append([loader.next() for _ in range(steps + 2)])
        print(f"speed: {name}: {steps + 2} batches made in {time.time() - t0:.1f} s", flush=True)
        loader.close()
    model = build_model(model_config(outdir, init), tok.get_vocab_size(), info["ids"], "cuda")
    if init:
        _load_init(model, init)
    qat(model, True)
    taps = Taps(model)
    model.train()
    nfm = _nf()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    rows = []
    head_sum = nfm._head_sum
    for (name, lengths, per_step, fast, experts, splits), data in zip(configs, prepared):
        model.config._experts_implementation = experts
        nfm._head_sum = _head_sum_elementwise if "elementwise head sum" in name else head_sum
        set_mode(model, window=64, topk=model.config.index_topk)
        torch.cuda.reset_peak_memory_stats()
        try:
            for j, batch in enumerate(data):
                if j == 2:
                    torch.cuda.synchronize()
                    t0, toks, flops = time.time(), 0, 0.0
                ids, valid, answer, needle, dist = cuda = tuple(x.cuda(non_blocking=True) for x in batch)
                res, splits = adaptive_step(model, taps, opt, cuda, 64, True, fast, splits)
                if res is None:
                    raise torch.OutOfMemoryError("one row does not fit")
                if j >= 2:
                    toks += int(batch[1].sum()) + ids.shape[0]
                    flops += nfm.model_flops(model, ids.numel(), ids.shape[1], 64, model.config.index_topk)
            torch.cuda.synchronize()
            dt = time.time() - t0
            row = dict(config=name, tokens_per_step=per_step, lengths=list(lengths), steps=steps,
                       s_per_step=round(dt / steps, 3), tokens_per_s=round(toks / dt),
                       model_tflops=round(flops / dt / 1e12, 2), of_bf16_peak=round(flops / dt / 787e12, 4),
                       micro_batches=splits,
                       mem_gb=round(torch.cuda.max_memory_allocated() / 2**30, 1))
        except torch.OutOfMemoryError as e:
            row = dict(config=name, error=f"out of memory: {str(e)[:120]}")
        torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps(row), flush=True)
    nfm._head_sum = head_sum
    base = rows[0].get("tokens_per_s")
    for row in rows[1:]:
        if base and "tokens_per_s" in row:
            row["vs_v4_path"] = round(row["tokens_per_s"] / base, 2)
    with open(out, "w") as f:
        json.dump({"rows": rows, "bf16_peak_tflops": 787, "gpu": torch.cuda.get_device_name()}, f, indent=1)
    for row in rows:
        print(json.dumps(row), flush=True)


def _device_us(e, inclusive=False):
    """A profiler event's GPU microseconds, under the names torch has used for them."""
    names = ("device_time_total", "cuda_time_total") if inclusive else ("self_device_time_total", "self_cuda_time_total")
    for n in names:
        v = getattr(e, n, None)
        if v is not None:
            return v
    return 0


# The ATen ops that move memory without arithmetic: what the 16k profile's largest kernel
# (direct_copy, 57% of the GPU time on 2026-12-03) is launched by.
COPY_OPS = ("aten::copy_", "aten::_to_copy", "aten::to", "aten::contiguous", "aten::clone", "aten::cat",
            "aten::reshape", "aten::index", "aten::index_put_", "aten::_index_put_impl_", "aten::constant_pad_nd",
            "aten::masked_fill", "aten::expand", "aten::repeat")


def copies_by_source(prof, limit=30):
    """The profiled copies (COPY_OPS) grouped by the lines of the training code that made them, by
    the GPU time of the kernels each op launched itself (a reshape's copy kernel is its
    aten::copy_'s, listed under the reshape's line: no kernel is counted twice). Needs a profile
    with with_stack=True. The autograd engine's backward ops carry no Python stack and are left
    out (their forward op's line is where the copy was asked for)."""
    rows = []
    for e in prof.key_averages(group_by_stack_n=8):
        if e.key not in COPY_OPS:
            continue
        # frames read "needle_fast.py(245): attention" (a full path in some torch versions)
        ours = [os.path.basename(f) for f in (e.stack or [])
                if os.path.basename(f.split("(")[0]) in ("needle_fast.py", "train_needle.py")]
        if not ours:
            continue
        if _device_us(e) > 0:
            rows.append(dict(op=e.key, calls=e.count, gpu_ms=round(_device_us(e) / 1e3, 1), where=ours[:3]))
    return sorted(rows, key=lambda r: r["gpu_ms"], reverse=True)[:limit]


def profile(outdir, init, out, steps=4, scope="layers"):
    """Where a training step's time goes on the fast forward, and what torch.compile of its
    decoder layers (needle_fast.use_compile) buys. Per prompt length (2k and 16k tokens, 64k
    tokens in one micro-batch, QAT on, sparse, window 64): two eager steps under torch.profiler
    (the kernels by GPU time, the ATen ops by CPU time, the share of the wall time the GPU is
    busy), then eager and compiled steps side by side (tokens/s; the first compiled step's
    seconds, compilation included). On one batch of two 2k prompts, the compiled and eager
    layers' logits, losses and gradients in fp32. Then two more eager steps profiled with Python
    stacks, for the copies by the line that asked for them (copies_by_source; a separate pass, the
    stacks' host overhead kept out of the first one's busy share). Writes `out` after every
    measurement."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    nfm = _nf()
    tok, info = load_tokenizer(outdir)
    per_step = 65536
    configs = [("2k prompts", (512, 2048)), ("16k prompts", (16384, 16384))]
    prepared = []  # the workers fork before CUDA starts in this process
    for name, lengths in configs:
        st = dict(STAGES[5], lengths=lengths, tokens=per_step, log_lengths=False)
        loader = Loader(Batches(outdir, st, seed=78, ratio=info["chars_per_token"]))
        prepared.append([loader.next() for _ in range(2 * steps + 8)])
        loader.close()
    model = build_model(model_config(outdir, init), tok.get_vocab_size(), info["ids"], "cuda")
    if init:
        _load_init(model, init)
    model.config._experts_implementation = EXPERTS
    qat(model, True)
    taps = Taps(model)
    model.train()
    set_mode(model, window=64, topk=model.config.index_topk)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "experts": EXPERTS,
              "tokens_per_step": per_step, "bf16_peak_tflops": 787, "configs": []}

    def save():
        with open(out, "w") as f:
            json.dump(report, f, indent=1)

    def run(batches):
        torch.cuda.synchronize()
        t0, toks, flops = time.time(), 0, 0.0
        for batch in batches:
            cuda = tuple(x.cuda(non_blocking=True) for x in batch)
            res, _ = adaptive_step(model, taps, opt, cuda, 64, True, True, 1)
            if res is None:
                raise torch.OutOfMemoryError("one row does not fit")
            toks += int(batch[1].sum()) + batch[1].shape[0]
            flops += nfm.model_flops(model, batch[0].numel(), batch[0].shape[1], 64, model.config.index_topk)
        torch.cuda.synchronize()
        dt = time.time() - t0
        return dict(seconds=round(dt, 3), s_per_step=round(dt / len(batches), 3), tokens_per_s=round(toks / dt),
                    model_tflops=round(flops / dt / 1e12, 2), of_bf16_peak=round(flops / dt / 787e12, 4))

    def fp32_pass(batch):
        ids, valid, answer = (x[:2].cuda() for x in batch[:3])
        model.zero_grad(set_to_none=True)
        logits, lm, ans, kl = forward_losses(model, taps, ids, valid, answer, True, fast=True, autocast=False)
        (ans + LM_WEIGHT * lm + DISTILL_WEIGHT * kl).backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        return logits.detach(), [lm.item(), ans.item(), float(kl)], grads

    for (name, lengths), data in zip(configs, prepared):
        row = {"config": name, "lengths": list(lengths), "batch": list(data[0][0].shape)}
        row["compile_scope"] = scope
        report["configs"].append(row)
        nfm.use_compile(False)
        try:
            run(data[:2])
            torch.cuda.reset_peak_memory_stats()
            row["eager"] = run(data[2:2 + steps])
            row["eager"]["mem_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
            with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                wall = run(data[2 + steps:4 + steps])["seconds"]
            ev = prof.key_averages()
            kernels = [e for e in ev if getattr(e, "device_type", None) == DeviceType.CUDA]
            busy = sum(_device_us(e) for e in kernels) / 1e6
            ops = [e for e in ev if getattr(e, "device_type", None) != DeviceType.CUDA]
            row["profile"] = {
                "wall_s": wall, "gpu_busy_s": round(busy, 3), "gpu_busy_share": round(busy / wall, 3),
                "launches": sum(e.count for e in kernels),
                "kernels_by_gpu_time": [dict(name=e.key[:100], calls=e.count, gpu_ms=round(_device_us(e) / 1e3, 1))
                                        for e in sorted(kernels, key=_device_us, reverse=True)[:25]],
                "ops_by_gpu_time": [dict(name=e.key[:100], calls=e.count,
                                         gpu_ms=round(_device_us(e, True) / 1e3, 1),
                                         cpu_ms=round(e.cpu_time_total / 1e3, 1))
                                    for e in sorted(ops, key=lambda e: _device_us(e, True), reverse=True)[:40]],
                "ops_by_self_cpu_time": [dict(name=e.key[:100], calls=e.count, self_cpu_ms=round(e.self_cpu_time_total / 1e3, 1))
                                         for e in sorted(ops, key=lambda e: e.self_cpu_time_total, reverse=True)[:25]]}
            del prof
            save()
            with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                                        with_stack=True) as prof:
                run(data[4 + steps:6 + steps])
            row["profile"]["copies_by_source"] = copies_by_source(prof)
            del prof
        except Exception as e:  # noqa: BLE001 -- reported, and the next measurement runs
            row["eager_error"] = f"{type(e).__name__}: {str(e)[:400]}"
        save()
        print(json.dumps({k: v for k, v in row.items() if k != "profile"}), flush=True)
        try:
            # transformers' eager experts sync with the host per expert (a graph break each)
            model.config._experts_implementation = row["compiled_experts"] = "grouped_mm"
            nfm.use_compile(scope)
            row["compiled_first_step"] = run(data[:1])
            if name == configs[0][0]:
                nfm.use_compile(False)
                ref = fp32_pass(data[0])
                nfm.use_compile(scope)
                got = fp32_pass(data[0])
                scale = ref[0].abs().max().item()
                gscale = max(g.abs().max().item() for g in ref[2].values())
                row["compiled_vs_eager_fp32"] = {
                    "logits_max_diff_over_max": (got[0] - ref[0]).abs().max().item() / scale,
                    "argmax_equal": (got[0].argmax(-1) == ref[0].argmax(-1)).float().mean().item(),
                    "losses_eager": ref[1], "losses_compiled": got[1],
                    "grads_max_diff_over_max": max((got[2][n] - ref[2][n]).abs().max().item() for n in ref[2]) / gscale,
                    "same_parameters": sorted(ref[2]) == sorted(got[2])}
                save()
            run(data[1:2])
            torch.cuda.reset_peak_memory_stats()
            row["compiled"] = run(data[2:2 + steps])
            row["compiled"]["mem_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
            if "eager" in row:
                row["compiled_vs_eager"] = round(row["compiled"]["tokens_per_s"] / row["eager"]["tokens_per_s"], 2)
        except Exception as e:  # noqa: BLE001
            row["compiled_error"] = f"{type(e).__name__}: {str(e)[:2000]}"
        nfm.use_compile(False)
        model.config._experts_implementation = EXPERTS
        torch.cuda.empty_cache()
        save()
        print(json.dumps({k: v for k, v in row.items() if k != "profile"}), flush=True)
    return 0


def oracle_fixture(weights, tokdir, out, count, new_tokens, lengths=(1024, 2048), jsonl=None):
    """transformers' own greedy continuations of needle prompts under the release's weights, in
    fp32 without autocast and without a cache (each step a full forward): what the engine must
    reproduce token for token on the release (tests/test_needle_model.sh). count prompts from
    needle_data's held-out wording, their sizes cycling through lengths; then, with jsonl (the
    output of `sparsetrace needle make --batch`), every example in it: the harness's own prompts,
    ids as the engine rendered them."""
    import torch
    tok, info = load_tokenizer(tokdir)
    model = load_trained(weights)
    eos = tok.token_to_id(nd.EOS)
    fams = list(nd.FAMILIES)
    kinds = nd.EVAL_KINDS
    cases = []  # (family, kind, needle, prompt ids, the text that counts as recalled)
    for i in range(count):
        L = lengths[i % len(lengths)]
        s = nd.make_sample(f"oracle:{i}", fams[i % len(fams)], kinds[i % len(kinds)],
                           int(L * info["chars_per_token"]), (0.3, 0.6, 0.85, 0.97)[i % 4], False, train=False)
        cases.append((s.family, s.kind, s.needle, tok.encode(s.prompt, add_special_tokens=False).ids, s.needle))
    for s in (nd.read_jsonl(jsonl, split="heldout") if jsonl else []):
        cases.append((s.family, s.kind, s.needle, list(s.ids), s.answer))
    with open(out, "w") as f:
        for i, (family, kind, needle, ids, answer) in enumerate(cases):
            gen = []
            with torch.no_grad():
                for _ in range(new_tokens):
                    x = torch.tensor([ids + gen], device="cuda")
                    nxt = int(model(input_ids=x).logits[0, -1].argmax())
                    gen.append(nxt)
                    if nxt == eos:
                        break
            text = tok.decode(gen, skip_special_tokens=False)
            f.write(json.dumps({"family": family, "kind": kind, "needle": needle, "prompt_ids": ids,
                                "generated": gen, "text": text, "recalled": text.startswith(answer)},
                               ensure_ascii=False) + "\n")
            print(f"oracle {i}: {len(ids)} tokens, {family}/{kind}: {text[:80]!r}", flush=True)


def tokenizer_fixture(tokdir, out, count):
    """Prompts from every family and kind with the ids HF tokenizers gives them: the engine's C
    tokenizer must give the same (tests/test_needle_tokenizer.sh)."""
    tok, _ = load_tokenizer(tokdir)
    with open(out, "w", encoding="utf-8") as f:
        for i in range(count):
            s = nd.make_sample(f"tokfix:{i}", chars=600 + 400 * (i % 7), train=False, thinking=bool(i % 3 == 0),
                               followups=i % 3)
            text = s.prompt + s.answer + "".join(t + a for t, a in s.followups)
            f.write(json.dumps({"text": text, "ids": tok.encode(text, add_special_tokens=False).ids},
                               ensure_ascii=False) + "\n")
    print(f"tokenizer fixture: {count} texts -> {out}", flush=True)


# ---------------------------------------------------------------- the model card's tables

CARD_BEGIN, CARD_END = "<!-- tables: tools/train_needle.py card -->", "<!-- end of tables -->"


def decoy_bin(n):
    """The card's row for a case with n decoys placed: 0, 1, then powers of two (2-3, 4-7, ...),
    padded so the rows sort by count."""
    if n < 2:
        return f"{n:2d}"
    lo = 1 << (n.bit_length() - 1)
    return f"{lo:2d}-{2 * lo - 1}"


# The card's rows under each table: (case field, what the rows are by).
GROUPINGS = (("kind", "needle kind"), ("format", "request format"), ("shape", "request shape"),
             ("family", "question family, trained kinds"), ("decoys", "decoys placed"))


def case_groups(res, key):
    """One evaluation's cases grouped by `key` (GROUPINGS) as {row: {mode: [passed, ...]}}, rows
    in the card's order and named as it shows them: held-out kinds and question families marked
    "(held out)", decoys binned (decoy_bin); rows by family count the trained kinds' cases alone
    (a held-out kind fails in any wording). By kind, when the table mixes trained and held-out
    kinds, two subtotal rows follow, "**trained kinds**" and "**held-out kinds**", from the same
    cases: the aims are set apart for the two. The card's tables and `compare` both read this."""
    # evaluations from before cases carried their kind: the named kinds' labels tell
    label_kind = {label: k for k in nd.EVAL_KINDS for label in nd.NEEDLE_KINDS[k][0]}
    held_out = {nd.HELDOUT_KIND} | set(nd.C_HELDOUT_KINDS)
    held_families = {nd.HELDOUT_FAMILY} | {"c/" + f for f in nd.C_HELDOUT_FAMILIES}
    kind_of = lambda c: c.get("kind") or label_kind.get(c["needle"].split(": ")[0])  # noqa: E731
    groups = {}
    for c in res["cases"]:
        if key == "decoys":
            value = decoy_bin(c.get("decoys", 0))
        elif key == "family":
            value = c.get("family") if kind_of(c) not in held_out else None
        elif key == "kind":
            value = kind_of(c)
        else:
            value = c.get(key)
        if value is None:
            continue
        for mode, ok in c.get("exact", {}).items():
            groups.setdefault(value, {}).setdefault(mode, []).append(ok)
    rows = {}
    for value in sorted(groups):
        held = (key == "kind" and value in held_out) or (key == "family" and value in held_families)
        rows[f"{value} (held out)" if held else value] = groups[value]
    kinds = set(groups)
    if key == "kind" and kinds & held_out and kinds - held_out:
        for label, part in (("trained kinds", kinds - held_out), ("held-out kinds", kinds & held_out)):
            merged = {}
            for value in sorted(part):
                for m, oks in groups[value].items():
                    merged.setdefault(m, []).extend(oks)
            rows[f"**{label}**"] = merged
    return rows


def card_tables(train_dir, eval_dir, card="v4"):
    """Markdown: training time per stage (from log.jsonl) and the recall tables (CARD_EVALS, or
    CARD_EVALS_V5 for card v5), with each table's cases by needle kind, request format, shape,
    question family (trained kinds only) and decoys placed, where they differ."""
    out = ["### Training, as logged", "",
           "| stage | window | prompt tokens | sparse | QAT | steps | tokens | GPU seconds | needle recall, last 50 steps |",
           "|---|---:|---|---|---|---:|---:|---:|---:|"]
    cur, last, total = None, None, 0.0
    for line in open(os.path.join(train_dir, "log.jsonl")):
        rec = json.loads(line)
        if rec.get("event") == "stage":
            cur, last = rec, None
        elif "step" in rec and "exact" in rec:
            last = rec
        elif rec.get("event") == "stage done" and cur:
            total += rec["seconds"]
            window = "/".join(map(str, cur["window"])) if isinstance(cur["window"], list) else cur["window"]
            out.append(f"| {cur['stage']} {cur['name']} | {window} | {cur['lengths'][0]}-{cur['lengths'][1]} | "
                       f"{'yes' if cur['sparse'] else 'no'} | {'yes' if cur.get('qat') else 'no'} | {rec['steps']} | "
                       f"{rec['tokens'] / 1e6:.1f}M | {rec['seconds']:.0f} | "
                       + (f"{100 * last['exact']:.0f}% ({100 * last.get('exact_far', 0):.0f}% beyond the window) |"
                          if last else "(none logged) |"))
    out += ["", f"Total: {total / 60:.1f} GPU minutes of training (H200) in this lineage. Recall here is "
            "teacher-forced exact recall on the training batches, with the step's window.", ""]
    for entry in CARD_EVALS if card == "v4" else CARD_EVALS_V5:
        name, title = entry[0], entry[1]
        path = os.path.join(eval_dir, name)
        if not os.path.exists(path):
            continue
        res = json.load(open(path))
        out += [f"### {title} (`evals/{name}`)", "",
                f"Family `{res['family'] or 'any'}`, needle kind `{res['kind'] or 'any'}`, "
                + (f"{res['decoys'] if isinstance(res['decoys'], int) else '/'.join(map(str, res['decoys']))} "
                   "decoys, " if res.get("decoys") else "") + f"{res['seeds']} seeds per cell, "
                f"window {res['window']}, index_topk {res['index_topk']}; mean prompt tokens "
                + ", ".join(f"{k}: {v}" for k, v in res["mean_prompt_tokens"].items())
                + ". Exact recall of the whole line (teacher-forced argmax = greedy), %.", ""]
        lengths = sorted({k for t in res["table"].values() for k in t}, key=int)
        positions = sorted({p for t in res["table"].values() for L in t.values() for p in L}, key=float)
        out.append("| mode | " + " | ".join(f"{int(L) // 1024}k @ {p}" for L in lengths for p in positions) + " | all |")
        out.append("|---|" + "---:|" * (len(lengths) * len(positions) + 1))
        for mode, t in res["table"].items():
            cells = [t.get(L, {}).get(p) for L in lengths for p in positions]
            out.append(f"| {mode} | " + " | ".join("" if c is None else f"{c:.0f}" for c in cells)
                       + f" | {res['summary'][mode]:.1f} |")
        for key, what in GROUPINGS:
            groups = case_groups(res, key)
            if len(groups) < 2:
                continue
            modes = list(res["table"])
            out += ["", f"By {what} (cases in brackets):", "",
                    f"| {key} | " + " | ".join(modes) + " |", "|---|" + "---:|" * len(modes)]
            for value, v in groups.items():
                n = len(next(iter(v.values())))
                out.append(f"| {value} ({n}) | " + " | ".join(
                    f"{100 * sum(v[m]) / len(v[m]):.1f}" if v.get(m) else "" for m in modes) + " |")
        out.append("")
    return "\n".join(out)


def compare_cards(old_dir, new_dir, which="v5", modes=("sparse",)):
    """Markdown: two releases' card evaluations (their evals/ directories) side by side, per
    evaluation present in both and per mode: all cases, each prompt length, and the rows the
    card shows by needle kind (with the trained / held-out subtotals), question family and
    decoys placed (case_groups), as "passed/cases (%)" and the change in points, then the cases
    paired by prompt and their sign test (paired), and at the end the adoption rule on those
    (card_verdict). What a release is adopted on (bench/needle-train-results.md) read off one table."""
    def cell(oks):
        return f"{sum(oks)}/{len(oks)} ({100 * sum(oks) / len(oks):.1f}%)" if oks else ""

    def points(a, b):
        return f"{100 * (sum(b) / len(b) - sum(a) / len(a)):+.1f}" if a and b else ""

    out, verdict_rows = [], {}
    for entry in CARD_EVALS if which == "v4" else CARD_EVALS_V5:
        name, title = entry[0], entry[1]
        paths = [os.path.join(d, name) for d in (old_dir, new_dir)]
        if not all(os.path.exists(x) for x in paths):
            continue
        old, new = (json.load(open(x)) for x in paths)
        # rows as (label, old cases, new cases), each {mode: [passed, ...]}, whatever the mode
        rows = []
        for label, pick in [("all", lambda c: True)] + [
                (f"{L // 1024}k tokens", lambda c, L=L: c["L"] == L)
                for L in sorted({c["L"] for r in (old, new) for c in r["cases"]})]:
            rows.append((label, *({m: [c["exact"][m] for c in r["cases"] if pick(c) and m in c.get("exact", {})]
                                   for m in modes} for r in (old, new))))
        for key, what in GROUPINGS:
            a, b = case_groups(old, key), case_groups(new, key)
            if len(a) >= 2 or len(b) >= 2:
                rows += [(f"{key} {value}", a.get(value, {}), b.get(value, {}))
                         for value in list(a) + [v for v in b if v not in a]]
        for mode in modes:
            if mode not in old["summary"] or mode not in new["summary"]:
                continue
            out += [f"### {title} (`{name}`), {mode}", "", "| cases | old | new | points |", "|---|---:|---:|---:|"]
            out += [f"| {label} | {cell(a.get(mode, []))} | {cell(b.get(mode, []))} | "
                    f"{points(a.get(mode, []), b.get(mode, []))} |" for label, a, b in rows]
            row = paired(old, new, mode)
            if row["examples"]:
                verdict_rows[f"{name} {mode}"] = row
            out += ["", f"Paired (the same prompt in both): {row['examples']} cases, {row['gains']} gains, "
                    f"{row['losses']} losses; p(worse) {row['p_worse']:.2g}, p(better) {row['p_better']:.2g} "
                    "(one-sided sign test, tools/needle_adopt.py).", ""]
    word, reason = card_verdict(verdict_rows)
    out.append(f"card verdict: {word}: {reason}")
    return "\n".join(out)


def paired(old, new, mode):
    """needle_adopt.compare of the cases both evaluations measured in mode, paired by prompt
    (length, position, seed and needle): what a change of points is worth."""
    import needle_adopt as na
    key = lambda c: (c["L"], c["position"], c["seed"], c["needle"])
    a = {key(c): c["exact"][mode] for c in old["cases"] if mode in c.get("exact", {})}
    b = {key(c): c["exact"][mode] for c in new["cases"] if mode in c.get("exact", {})}
    both = [k for k in a if k in b]
    return na.compare([a[k] for k in both], [b[k] for k in both])


def card_verdict(rows):
    """The adoption rule (needle_adopt.verdict: better on some, worse on none, Bonferroni over the
    rows) on the card's paired rows, {"evaluation mode": paired(...)}: a release replaces the one
    before when the engine's adoption sets and its card both adopt it."""
    import needle_adopt as na
    if not rows:
        return "keep", "no evaluation measured in both"
    return na.verdict(rows)


def write_card(card, train_dir, eval_dir, which="v4"):
    text = open(card, encoding="utf-8").read()
    a, b = text.index(CARD_BEGIN) + len(CARD_BEGIN), text.index(CARD_END)
    text = text[:a] + "\n" + card_tables(train_dir, eval_dir, which) + "\n" + text[b:]
    open(card, "w", encoding="utf-8").write(text)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("tokenizer")
    a.add_argument("dir")
    b = sub.add_parser("stage")
    b.add_argument("n", type=int, choices=sorted(STAGES)), b.add_argument("dir")
    b.add_argument("--budget", type=float, default=540, help="seconds for the whole stage, evaluation included")
    b.add_argument("--jsonl", help="`sparsetrace needle make --batch ... --split train` output: half of every batch "
                                   "comes from it (needle_data.read_jsonl)")
    b.add_argument("--init", help="start from these weights when DIR has no state.pt: a save_pretrained directory, "
                                  "or the release (models/needle-v4), dequantised")
    b.add_argument("--eval-seconds", type=float, default=75,
                   help="seconds kept for the quick held-out evaluation at the stage's end (0: none)")
    b.add_argument("--compile", nargs="?", const="layers", default=False, choices=("layers", "hc"),
                   help="torch.compile in the fast forward (stages with fast=True): its decoder layers "
                        "(layers, the default) or only their mHC (hc)")
    b.add_argument("--splits", type=int, help="micro-batches per step to start from (default: the stage's)")
    b.add_argument("--decay", help="A:B: the learning rate falls linearly from the stage's at step A to "
                                   "DECAY_FLOOR of it at step B (steps counted over the lineage, as logged)")
    b.add_argument("--decoys", help="SHARE:LO-HI: that share of needle_data's prompts get LO to HI earlier lines "
                                    "of the needle's label, and the question asks for the last (needle_data.make_sample)")
    b.add_argument("--labelled", help="SHARE: that share of needle_data's prompts are of the labelled kind (labels "
                                      "and values in no list), the rest drawn among the trained kinds as before")
    b.add_argument("--composed", help="SHARE in [0, 1]: that share of needle_data's questions are composed from "
                                      "parts (default needle_data.COMPOSED_SHARE; 0: the families' own wordings)")
    b.add_argument("--train-layers", help="L[,L...]: only these decoder layers train, the rest frozen (a release "
                   "grown by tools/needle_grow.py: its new layers); give it to every call of the stage")
    b.add_argument("--lengths", help="LO-HI: the prompt sizes drawn instead of the stage's (drawn as the stage draws "
                                     "them: stage 5 log-uniformly); a step holds as many tokens, so short prompts "
                                     "give more answers a step")
    b.add_argument("--peak", help="SCALE in (0, 1]: the stage's learning rate times SCALE, warmup and decay "
                                  "included (a fine-tune from a release whose rate was cooled down); give it "
                                  "again when the stage resumes in a later call")
    c = sub.add_parser("eval")
    c.add_argument("weights"), c.add_argument("--tokenizer", required=True), c.add_argument("--out", required=True)
    c.add_argument("--seeds", type=int, default=8), c.add_argument("--budget", type=float, default=300)
    c.add_argument("--lengths", default="1024,2048,4096,8192"), c.add_argument("--modes", default=",".join(MODES))
    c.add_argument("--family", default=nd.HELDOUT_FAMILY), c.add_argument("--kind", default=nd.HELDOUT_KIND)
    c.add_argument("--qat", action="store_true", help="with QAT's fake quantisation on (trained weights as released)")
    d = sub.add_parser("smoke")
    d.add_argument("dir")
    f = sub.add_parser("card", help="rewrite the model card's tables from a training log and evaluations")
    f.add_argument("card"), f.add_argument("--train", required=True), f.add_argument("--evals", required=True)
    f.add_argument("--which", choices=("v4", "v5"), default="v4", help="the evaluations' list: CARD_EVALS or CARD_EVALS_V5")
    cp = sub.add_parser("compare", help="two releases' card evaluations side by side (compare_cards)")
    cp.add_argument("old"), cp.add_argument("new")
    cp.add_argument("--which", choices=("v4", "v5"), default="v5")
    cp.add_argument("--modes", default="sparse", help="modes compared, comma-separated (default sparse)")
    g = sub.add_parser("tokenizer-fixture", help="texts and their HF ids, for the C tokenizer's test")
    g.add_argument("dir"), g.add_argument("out"), g.add_argument("--count", type=int, default=60)
    h = sub.add_parser("oracle-fixture", help="transformers' greedy continuations, for the engine's test")
    h.add_argument("weights"), h.add_argument("dir"), h.add_argument("out")
    h.add_argument("--count", type=int, default=8), h.add_argument("--new-tokens", type=int, default=40)
    h.add_argument("--lengths", default="1024,2048", help="the held-out wording's prompt sizes, cycled")
    h.add_argument("--jsonl", help="`sparsetrace needle make --batch` output: its examples too")
    pa = sub.add_parser("parity", help="the fast forward against transformers' on the same weights")
    pa.add_argument("dir"), pa.add_argument("--init"), pa.add_argument("--out", required=True)
    sp = sub.add_parser("speed", help="training throughput: the v4 path against the fast forward")
    sp.add_argument("dir"), sp.add_argument("--init"), sp.add_argument("--out", required=True)
    sp.add_argument("--steps", type=int, default=8)
    sp.add_argument("--only", help="comma-separated: the configs whose names contain one of these (and the v4 path)")
    pr = sub.add_parser("profile", help="where a fast-forward training step's time goes; torch.compile against eager")
    pr.add_argument("dir"), pr.add_argument("--init"), pr.add_argument("--out", required=True)
    pr.add_argument("--steps", type=int, default=4)
    pr.add_argument("--compile", default="layers", choices=("layers", "hc"),
                    help="what the compiled steps compile (needle_fast.use_compile)")
    e = sub.add_parser("release")
    e.add_argument("dir"), e.add_argument("dest"), e.add_argument("--seeds", type=int, default=8)
    e.add_argument("--budget", type=float, default=420), e.add_argument("--lengths", default=None,
                                                                       help="default 1k-8k (v4), 1k-32k (v5)")
    e.add_argument("--card", choices=("v4", "v5"), default="v4",
                   help="v4: CARD_EVALS on transformers' forward; v5: CARD_EVALS_V5 on the fast forward, to 32k")
    e.add_argument("--from", dest="source", default=None,
                   help="measure this existing release (copied to DEST) instead of writing one from DIR/weights")
    e.add_argument("--only", default=None,
                   help="these of the card's evaluations (file names, comma-separated), the budget theirs alone; "
                        "DEST/evals keeps the others' files from earlier calls")
    args = ap.parse_args(argv)
    if args.cmd == "tokenizer":
        train_tokenizer(args.dir)
    elif args.cmd == "stage":
        decay = parse_decay(args.decay) if args.decay else None
        decoys = parse_decoys(args.decoys) if args.decoys else None
        labelled = parse_share("--labelled", args.labelled) if args.labelled else None
        peak = parse_share("--peak", args.peak) if args.peak else None
        composed = parse_share("--composed", args.composed, zero=True) if args.composed is not None else None
        train_layers = parse_layers(args.train_layers) if args.train_layers else None
        lengths = parse_lengths(args.lengths) if args.lengths else None
        init = seed_dir(args.dir, args.init)
        if not os.path.exists(os.path.join(args.dir, "tokenizer.json")):
            train_tokenizer(args.dir)
        run_stage(args.n, args.dir, args.budget, eval_seconds=args.eval_seconds, init=init, jsonl=args.jsonl,
                  compile=args.compile, splits=args.splits, decay=decay, decoys=decoys,
                  labelled=labelled, peak=peak, train_layers=train_layers, composed=composed, lengths=lengths)
    elif args.cmd == "eval":
        run_eval(args.weights, args.tokenizer, args.out, args.seeds, [int(x) for x in args.lengths.split(",")],
                 args.modes.split(","), args.family if args.family != "any" else None,
                 args.kind if args.kind != "any" else None, args.budget, qat_on=args.qat)
    elif args.cmd == "tokenizer-fixture":
        seed_dir(args.dir, None)
        tokenizer_fixture(args.dir, args.out, args.count)
    elif args.cmd == "oracle-fixture":
        args.weights = seed_dir(args.dir, args.weights)  # a release: dequantised into DIR/init-weights
        oracle_fixture(args.weights, args.dir, args.out, args.count, args.new_tokens,
                       [int(x) for x in args.lengths.split(",")], args.jsonl)
    elif args.cmd == "card":
        write_card(args.card, args.train, args.evals, args.which)
    elif args.cmd == "compare":
        print(compare_cards(args.old, args.new, args.which, args.modes.split(",")))
    elif args.cmd == "parity":
        init = seed_dir(args.dir, args.init)
        return parity(args.dir, init, args.out)
    elif args.cmd == "speed":
        init = seed_dir(args.dir, args.init)
        speed(args.dir, init, args.out, args.steps, args.only.split(",") if args.only else None)
    elif args.cmd == "profile":
        init = seed_dir(args.dir, args.init)
        return profile(args.dir, init, args.out, args.steps, args.compile)
    elif args.cmd == "release":
        lengths = ([int(x) for x in args.lengths.split(",")] if args.lengths
                   else V5_LENGTHS if args.card == "v5" else [1024, 2048, 4096, 8192])
        if args.source:
            seed_dir(args.dir, None)  # the tokenizer and its ratio, on a machine that did not train
        release(args.dir, args.dest, args.seeds, lengths, args.budget, card=args.card,
                only=args.only.split(",") if args.only else None, source=args.source)
    else:
        smoke(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
