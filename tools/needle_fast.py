"""The needle model's fast forward: transformers' DeepseekV4ForCausalLM, the same weights and the
same arithmetic, without the [tokens, tokens] matrices of its eager attention.

transformers' eager path concatenates the compressed rows onto every token's keys and masks a
[B, H, S, S + R] score matrix (S tokens, R compressed rows); its indexer scores a
[B, S, heads, R] tensor. At 2k tokens that already caps a training batch at 32k tokens, and at
32k tokens one sequence does not fit. Here each query meets only what it can see:

  window   keys in blocks of W (the sliding window): query block b scores blocks b-1 and b,
           [B, H, S/W, W, 2W], masked to the W keys (q - W, q]
  CSA rows the indexer's top-k rows gathered per query, [B, H, S, k] (or every causally visible
           row when top-k covers them all: [B, H, S, R])
  HCA rows every causally visible 128-token row, [B, H, S, S/128]
  sink     the per-head sink logit, one more column of the softmax, as in eager

and the indexer scores in query chunks without gradient to pick its top-k, then again with
gradient at the picked rows only (its distillation loss needs no more). The decoder layers' mHC,
norms, routers and experts are transformers' own modules, called as transformers calls them;
use_compile("hc") swaps the mHC for hc_weights / hc_mix (the same arithmetic as functions of
tensors) through torch.compile.

`forward(model, ids, faults)` returns the logits and, for each CSA layer, what the indexer's
distillation loss needs. `tools/train_needle.py parity` holds this path to transformers' forward
on the same weights: logits, top-k sets (ties at the boundary counted as ties), the distillation
loss, every fault, and the gradients.

Faults (the harness's settings of the same names, for the evaluation; docs/design.md §settings):
  rotate       None | "q" | "k" | "both": a normalised Hadamard on the indexer's q, keys or both
  index_k      None | "fp8_e4m3fn_as_fnuz": the indexer keys through e4m3fn with a per-row
               amax/448 scale, their bytes decoded as e4m3fnuz (kernels/lowp.h
               st_fp8_fn_as_fnuz_blocks)
  index_rope   "interleaved" | "neox": the indexer's RoPE layout (q and keys)
  compress_rope_theta  None | theta: the compressed layers' RoPE base (main attention, pooled
               rows and indexer alike), YaRN kept
  topk         None (the model's index_topk) | N (0: no CSA row at all)
"""
import copy
import math
import os

import torch
import torch.nn.functional as F

NO_FAULTS = dict(rotate=None, index_k=None, index_rope="interleaved", compress_rope_theta=None, topk=None)
SCORE_CHUNK_ELEMS = 1 << 28  # indexer selection: queries per chunk such that [B, c, heads, R] stays this small


def _tf():
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m
    return m


# ---------------------------------------------------------------- RoPE


def rope(x, cos, sin, neox=False, unsqueeze_dim=1):
    """RoPE on the trailing slice of x (cos/sin one entry per pair): transformers' interleaved
    layout, or the neox layout (pairs i, i + rd/2) that the index_rope=neox fault applies."""
    if not neox:
        return _tf().apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=unsqueeze_dim)
    cos = torch.cat([cos, cos], -1).unsqueeze(unsqueeze_dim)
    sin = torch.cat([sin, sin], -1).unsqueeze(unsqueeze_dim)
    rd = cos.shape[-1]
    nope, r = x[..., :-rd], x[..., -rd:]
    turned = torch.cat([-r[..., rd // 2:], r[..., :rd // 2]], -1)
    return torch.cat([nope, ((r.float() * cos) + (turned.float() * sin)).to(x.dtype)], -1)


def rope_tables(model, like, positions, compress_theta=None):
    """{"main": (cos, sin), "compress": (cos, sin)} at positions [1, S], from the model's own
    rotary embedding, or for "compress" one whose base is another theta (the
    compress_rope_theta fault), YaRN kept. In like's dtype (fp32 for the embeddings' output)."""
    emb = model.model.rotary_emb
    comp = emb
    if compress_theta is not None:
        cfg = copy.deepcopy(model.config)
        cfg.rope_parameters["compress"]["rope_theta"] = float(compress_theta)
        comp = type(emb)(cfg).to(like.device)
    return {"main": emb(like, position_ids=positions, layer_type="main"),
            "compress": comp(like, position_ids=positions, layer_type="compress")}


# ---------------------------------------------------------------- compressor pooling


def pool(m, h, overlap, cs, neox=False):
    """The compressed rows of compressor or indexer module m over hidden states h [B, S, D]:
    softmax-gated sums over windows of m.compress_rate tokens (CSA: overlapping, each row
    pooling the previous window's first series with its own second), RMS-normed, roped at
    position row * rate (cs: the "compress" cos/sin of every position 0..S-1, fp32; the rotary
    embedding's entry at position p depends on p alone, so row r takes entry r * rate).
    [B, R, head_dim]; R = S // rate (the incomplete tail is not pooled)."""
    rate, d = m.compress_rate, m.head_dim
    kv, gate = m.kv_proj(h), m.gate_proj(h)
    B, S = kv.shape[:2]
    n = S // rate
    if n == 0:
        return kv.new_zeros((B, 0, d))
    kv = kv[:, :n * rate].view(B, n, rate, -1)
    gate = gate[:, :n * rate].view(B, n, rate, -1) + m.position_bias
    if overlap:
        prev_kv = torch.cat([kv.new_zeros((B, 1, rate, d)), kv[:, :-1, :, :d]], 1)
        prev_gate = torch.cat([gate.new_full((B, 1, rate, d), float("-inf")), gate[:, :-1, :, :d]], 1)
        kv = torch.cat([prev_kv, kv[..., d:]], 2)
        gate = torch.cat([prev_gate, gate[..., d:]], 2)
    pooled = m.kv_norm((kv * gate.softmax(dim=2, dtype=torch.float32).to(kv.dtype)).sum(dim=2))
    cos, sin = (t[:, :n * rate:rate].to(pooled.dtype) for t in cs)
    return rope(pooled.unsqueeze(1), cos, sin, neox=neox).squeeze(1)


# ---------------------------------------------------------------- the lightning indexer


def hadamard(n, device):
    """The normalised Sylvester Hadamard matrix of order n (a power of two) on device."""
    h = torch.ones(1, 1, device=device)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


def fp8_fn_as_fnuz(x):
    """Each row of x through e4m3fn with scale max(amax, 1e-4)/448, its bytes read as e4m3fnuz."""
    xf = x.float()
    scale = xf.abs().amax(-1, keepdim=True).clamp_min(1e-4) / 448.0
    codes = (xf / scale).to(torch.float8_e4m3fn).view(torch.uint8).view(torch.float8_e4m3fnuz)
    return (codes.float() * scale).to(x.dtype)


def _no_compile(fn):
    """fn left out of torch.compile's graphs (a loop whose trip count follows the length)."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    return disable(fn) if disable else fn


def _query_chunk(q, k):
    """Queries per chunk such that a [B, chunk, heads, R] score product stays within
    SCORE_CHUNK_ELEMS (at least one)."""
    return max(1, SCORE_CHUNK_ELEMS // max(1, q.shape[0] * q.shape[2] * k.shape[1]))


def _scores(q, k, w, scale):
    """sum_h w[b, s, h] * relu(q[b, s, h] . k[b, r]) * scale as transformers' scorer computes it:
    q [B, c, Hi, Di], k [B, R, Di], w [B, c, Hi] -> [B, c, R], fp32. Without gradient (evaluation),
    in chunks of queries within SCORE_CHUNK_ELEMS: [B, S, heads, R] at 32k tokens is 17 GiB a
    prompt, and each score is computed alike in either case."""
    c = _query_chunk(q, k)
    if not torch.is_grad_enabled() and c < q.shape[1]:
        return torch.cat([_scores(q[:, c0:c0 + c], k, w[:, c0:c0 + c], scale) for c0 in range(0, q.shape[1], c)], 1)
    B, c, Hi, Di = q.shape
    # one [c * Hi, Di] x [Di, R] product per sequence. Broadcasting k over the queries instead
    # ([B, 1, Di, R] against [B, c, Hi, Di]) makes torch.matmul copy k once per query before its
    # bmm: [B, c, Di, R], eight times the size of the scores themselves.
    s = torch.matmul(q.float().reshape(B, c * Hi, Di), k.float().transpose(-1, -2))
    return _head_sum(s.view(B, c, Hi, k.shape[1]), w, scale)


def _head_sum(s, w, scale):
    """sum_h w[..., h] * relu(s[..., h, r]) * scale: s [..., Hi, R], w [..., Hi] -> [..., R], fp32.
    One [1, Hi] x [Hi, R] product per query, so the per-head scores are read once: multiplying by
    w and summing over heads elementwise wrote and read them three times more (the largest kernel
    of a 16k training step, bench/needle-train-results.md, 2026-12-04). Without gradient the ReLU
    is taken in place."""
    lead, (Hi, R) = s.shape[:-2], s.shape[-2:]
    n = math.prod(lead)
    s = F.relu(s) if torch.is_grad_enabled() else s.relu_()
    return torch.bmm((w.float() * scale).reshape(n, 1, Hi), s.reshape(n, Hi, R)).view(*lead, R)


@_no_compile
def _select(q, k, w, scale, visible, topk):
    """The top-k rows of every query, without gradient, scored in chunks of queries such that
    [B, chunk, heads, R] stays within SCORE_CHUNK_ELEMS: [B, S, topk], -1 past the visible rows."""
    B, S, R = q.shape[0], q.shape[1], k.shape[1]
    rows = torch.arange(R, device=q.device)
    chunk = _query_chunk(q, k)
    picks = []
    with torch.no_grad():
        for c0 in range(0, S, chunk):
            s = _scores(q[:, c0:c0 + chunk], k, w[:, c0:c0 + chunk], scale)
            future = rows[None, :] >= visible[c0:c0 + chunk, None]
            top = s.masked_fill(future.unsqueeze(0), float("-inf")).topk(topk, dim=-1).indices
            picks.append(torch.where(top >= visible[None, c0:c0 + chunk, None], -1, top))
    return torch.cat(picks, 1)


def indexer(idx, h, q_res, positions, cs, faults, topk):
    """The indexer of one CSA layer on detached inputs (it trains on its own loss only, as in
    DeepSeek's sparse-attention training). Returns (selected [B, S, k] with -1 where a query has
    fewer visible rows, scores [B, S, k] with gradient at the selected rows, rows R); with
    topk >= R every visible row is selected and the scores are [B, S, R]."""
    h, q_res = h.detach(), q_res.detach()
    neox = faults["index_rope"] == "neox"
    k = pool(idx, h, True, cs, neox=neox)
    B, S = h.shape[:2]
    R = k.shape[1]
    cos, sin = (t.to(h.dtype) for t in cs)
    q = idx.q_b_proj(q_res).view(B, S, -1, idx.head_dim).transpose(1, 2)
    q = rope(q, cos, sin, neox=neox).transpose(1, 2)                   # [B, S, Hi, Di]
    if faults["rotate"] is not None:
        H = hadamard(idx.head_dim, h.device)
        if faults["rotate"] in ("q", "both"):
            q = (q.float() @ H).to(q.dtype)
        if faults["rotate"] in ("k", "both"):
            k = (k.float() @ H).to(k.dtype)
    if faults["index_k"] == "fp8_e4m3fn_as_fnuz":
        k = fp8_fn_as_fnuz(k)
    sc = idx.scorer
    w = sc.weights_proj(h).float() * sc.weights_scaling                 # [B, S, Hi]
    visible = (positions[0] + 1) // idx.compress_rate                    # rows query s may see
    if R == 0 or topk <= 0:
        empty = torch.full((B, S, 0), -1, dtype=torch.long, device=h.device)
        return empty, w.new_zeros((B, S, 0)), R
    rows = torch.arange(R, device=h.device)
    if topk >= R:  # every visible row: dense
        s = _scores(q, k, w, sc.softmax_scale)
        sel = rows.view(1, 1, R).expand(B, S, R)
        return torch.where(rows[None, :] < visible[:, None], sel, -1), s, R
    sel = _select(q, k, w, sc.softmax_scale, visible, topk)              # [B, S, k]
    ks = k[torch.arange(B, device=h.device)[:, None, None], sel.clamp_min(0)]   # [B, S, k, Di]
    s = _head_sum(torch.einsum("bshd,bskd->bshk", q.float(), ks.float()), w, sc.softmax_scale)
    return sel, s, R


# ---------------------------------------------------------------- attention


def _window_scores(q, kv, W, scaling):
    """q [B, H, S, d], kv [B, S, d] -> scores [B, H, S, 2W] against key blocks b-1 and b of query
    block b, -inf outside (q - W, q]; and the key blocks [B, S/W, 2W, d] for the values."""
    B, H, S, d = q.shape
    Sp = -(-S // W) * W
    if Sp != S:
        q = F.pad(q, (0, 0, 0, Sp - S))
        kv = F.pad(kv, (0, 0, 0, Sp - S))
    nb = Sp // W
    blocks = kv.view(B, nb, W, d)
    keys = torch.cat([torch.cat([blocks.new_zeros((B, 1, W, d)), blocks[:, :-1]], 1), blocks], 2)  # [B, nb, 2W, d]
    s = torch.einsum("bhnqd,bnkd->bhnqk", q.view(B, H, nb, W, d), keys) * scaling
    r = torch.arange(W, device=q.device)[:, None]
    m = torch.arange(2 * W, device=q.device)[None, :]
    see = (m > r) & (m <= W + r)                                           # q - W < key <= q
    first = torch.arange(nb, device=q.device)[:, None, None] > 0
    see = see[None] & (first | (m >= W)[None])                             # block 0 has no block before it
    s = s.float().masked_fill(~see[None, None], float("-inf"))
    return s.reshape(B, H, Sp, 2 * W)[:, :, :S], keys


def attention(attn, h, pe, positions, faults):
    """DeepseekV4Attention.forward without the [S, S + R] matrices (module docstring); pe from
    rope_tables. Returns (output, distill): for a CSA layer distill is (indexer scores,
    attention mass per selected row summed over heads, selected), else None."""
    tf = _tf()
    B, S, _ = h.shape
    d = attn.head_dim
    cos, sin = pe[attn.rope_layer_type]
    q_res = attn.q_a_norm(attn.q_a_proj(h))
    q = attn.q_b_proj(q_res).view(B, S, -1, d).transpose(1, 2)
    q = rope(attn.q_b_norm(q), cos, sin)                                  # [B, H, S, d]
    kv = rope(attn.kv_norm(attn.kv_proj(h)).view(B, S, 1, d).transpose(1, 2), cos, sin)[:, 0]  # [B, S, d]
    W = attn.sliding_window
    wscores, kblocks = _window_scores(q, kv, W, attn.scaling)
    parts, rows, sel, iscores, distill = [wscores], None, None, None, None
    comp = attn.compressor
    if isinstance(comp, tf.DeepseekV4CSACompressor):
        ck = pool(comp, h, True, pe["compress"])                           # [B, R, d]
        topk = comp.indexer.index_topk if faults["topk"] is None else faults["topk"]
        sel, iscores, R = indexer(comp.indexer, h, q_res, positions, pe["compress"], faults, topk)
        if R > 0 and topk >= R:                                            # dense: every visible row
            s = torch.einsum("bhsd,brd->bhsr", q, ck) * attn.scaling
            rows = ("dense", ck)
        else:
            gathered = ck[torch.arange(B, device=h.device)[:, None, None], sel.clamp_min(0)]  # [B, S, k, d]
            s = torch.einsum("bhsd,bskd->bhsk", q, gathered) * attn.scaling
            rows = ("sparse", gathered)
        parts.append(s.float().masked_fill((sel < 0).unsqueeze(1), float("-inf")))
    elif isinstance(comp, tf.DeepseekV4HCACompressor):
        ck = pool(comp, h, False, pe["compress"])
        R = ck.shape[1]
        s = torch.einsum("bhsd,brd->bhsr", q, ck) * attn.scaling
        future = torch.arange(R, device=h.device)[None, :] >= ((positions[0] + 1) // comp.compress_rate)[:, None]
        parts.append(s.float().masked_fill(future[None, None], float("-inf")))
        rows = ("dense", ck)
    sinks = attn.sinks.reshape(1, -1, 1, 1).expand(B, -1, S, 1).float()
    logits = torch.cat(parts + [sinks], -1)
    logits = logits - logits.max(dim=-1, keepdim=True).values
    probs = F.softmax(logits, dim=-1, dtype=logits.dtype)
    nw = wscores.shape[-1]
    pw = probs[..., :nw]
    Sp = kblocks.shape[1] * W
    if Sp != S:
        pw = F.pad(pw, (0, 0, 0, Sp - S))
    Hh = q.shape[1]
    out = torch.einsum("bhnqk,bnkd->bhnqd", pw.reshape(B, Hh, Sp // W, W, 2 * W).to(kblocks.dtype), kblocks)
    out = out.reshape(B, Hh, Sp, d)[:, :, :S]
    if rows is not None:
        pr = probs[..., nw:nw + parts[1].shape[-1]]
        vals = rows[1]
        if rows[0] == "dense":
            out = out + torch.einsum("bhsr,brd->bhsd", pr.to(vals.dtype), vals)
        else:
            out = out + torch.einsum("bhsk,bskd->bhsd", pr.to(vals.dtype), vals)
        if sel is not None:
            distill = (iscores, pr.detach().sum(1), sel)
    out = rope(out, cos, -sin)                                            # undo the values' rope, per query
    grouped = out.transpose(1, 2).reshape(B, S, attn.config.o_groups, -1)
    return attn.o_b_proj(attn.o_a_proj(grouped).flatten(2)), distill


# ---------------------------------------------------------------- the model


def hc_weights(hs, fn, base, scale, hc_eps, iters, norm_eps):
    """DeepseekV4HyperConnection.forward as a function of tensors alone (SPEC-dsv4 §2.2 steps
    2-4), so that one compiled graph serves every layer's two mHC: the streams hs
    [B, S, N, D] RMS-normed as one flat vector, mixed by fn [(2 + N) N, N D] into the collapse
    weights (pre), the expansion weights (post, [B, S, N]) and the stream mix (comb, [B, S, N, N],
    made doubly stochastic by iters Sinkhorn steps). Returns (post, comb, the collapsed input
    [B, S, D] in hs's dtype), in transformers' order of operations."""
    B, S, N, D = hs.shape
    flat = hs.reshape(B, S, N * D).float()
    flat = flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + norm_eps)
    pre_w, post_w, comb_w = F.linear(flat, fn.float()).split([N, N, N * N], dim=-1)
    pre_b, post_b, comb_b = base.split([N, N, N * N])
    pre = torch.sigmoid(pre_w * scale[0] + pre_b) + hc_eps
    post = 2 * torch.sigmoid(post_w * scale[1] + post_b)
    comb = torch.softmax(comb_w.view(B, S, N, N) * scale[2] + comb_b.view(N, N), dim=-1) + hc_eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + hc_eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_eps)
    return post, comb, (pre.unsqueeze(-1) * hs).sum(dim=2).to(hs.dtype)


def hc_mix(post, comb, out, hs):
    """The decoder layer's new streams after a block: post_j * out + sum_i comb[i, j] * hs_i,
    [B, S, N, D]. Written as N multiply-adds rather than transformers' batched 4 x 4 matmul
    (comb^T @ hs), which a compiled graph fuses into one pass over the streams; the same sums
    up to fp32 rounding."""
    dtype = hs.dtype
    c = comb.to(dtype)
    mixed = c[..., 0, :].unsqueeze(-1) * hs[..., 0:1, :]
    for i in range(1, hs.shape[-2]):
        mixed = mixed + c[..., i, :].unsqueeze(-1) * hs[..., i:i + 1, :]
    return post.to(dtype).unsqueeze(-1) * out.unsqueeze(-2) + mixed


def _hc_module(hc, hs):
    return hc(hs)


def _hc_matmul(post, comb, out, hs):
    dtype = hs.dtype
    return post.to(dtype).unsqueeze(-1) * out.unsqueeze(-2) + torch.matmul(comb.to(dtype).transpose(-1, -2), hs)


# How layer_forward runs the mHC: transformers' modules and its matmul (eager), or the two
# functions above through torch.compile (use_compile("hc")).
_hc_pre, _hc_post = _hc_module, _hc_matmul


def layer_forward(layer, hs, ids, pe, positions, faults):
    """DeepseekV4DecoderLayer.forward on the hidden streams hs [B, S, hc_mult, D], the attention
    through attention() above. Returns (hs, the CSA layer's distillation entry or None)."""
    post, comb, collapsed = _hc_pre(layer.attn_hc, hs)
    a, distill = attention(layer.self_attn, layer.input_layernorm(collapsed), pe, positions, faults)
    hs = _hc_post(post, comb, a, hs)
    post, comb, collapsed = _hc_pre(layer.ffn_hc, hs)
    mo = layer.mlp(layer.post_attention_layernorm(collapsed), input_ids=ids)
    return _hc_post(post, comb, mo, hs), distill


# layer_forward as forward() calls it: itself, or torch.compile'd by use_compile
_layer = layer_forward

COMPILE_SCOPES = ("layers", "hc")


def use_compile(on):
    """torch.compile in forward() (dynamic shapes: one graph serves every length), or eager again
    (on False). on True or "layers": the whole decoder layers (the indexer's chunked selection
    stays eager; the experts break the graph). "hc": only the mHC (hc_weights, hc_mix): small
    graphs with no break, which fuse the Sinkhorn steps and stream mixes (about 4,000 kernels
    of a 64k-token step's 14,000). Compiled and eager compute the same numbers up to fp32
    rounding (`train_needle.py profile` compares the losses and gradients of the two in fp32)."""
    global _layer, _hc_pre, _hc_post
    _layer, _hc_pre, _hc_post = layer_forward, _hc_module, _hc_matmul
    if not on:
        return
    scope = "layers" if on is True else on
    if scope not in COMPILE_SCOPES:
        raise ValueError(f"use_compile: scope {scope!r}, expected one of {COMPILE_SCOPES}")
    import torch._dynamo
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    if scope == "layers":
        _layer = torch.compile(layer_forward, dynamic=True)
        return
    weights, mix = torch.compile(hc_weights, dynamic=True), torch.compile(hc_mix, dynamic=True)
    _hc_pre = lambda hc, hs: weights(hs, hc.fn, hc.base, hc.scale, hc.hc_eps, hc.hc_sinkhorn_iters,  # noqa: E731
                                     hc.input_norm.eps)
    _hc_post = mix


def load_compile_cache(path):
    """torch.compile's artifacts from an earlier process or machine (save_compile_cache), so that
    compiling becomes a lookup. False when path does not exist."""
    if not path or not os.path.exists(path):
        return False
    with open(path, "rb") as f:
        torch.compiler.load_cache_artifacts(f.read())
    return True


def save_compile_cache(path):
    """What torch.compile has compiled in this process, for load_compile_cache. Returns bytes written."""
    art = torch.compiler.save_cache_artifacts()
    if not art:
        return 0
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(art[0])
    return len(art[0])


def forward(model, ids, faults=None):
    """DeepseekV4ForCausalLM's forward on ids [B, S] (no cache, no padding mask: right padding
    changes nothing before it). Returns (logits [B, S, V], distill): distill holds, per CSA
    layer, (indexer scores with gradient [B, S, k], attention mass [B, S, k], selected [B, S, k])."""
    faults = dict(NO_FAULTS, **(faults or {}))
    m = model.model
    x = m.embed_tokens(ids)
    positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
    pe = rope_tables(model, x, positions, faults["compress_rope_theta"])
    hs = x.unsqueeze(2).expand(-1, -1, model.config.hc_mult, -1).contiguous()
    distill = []
    for layer in m.layers:
        hs, d = _layer(layer, hs, ids, pe, positions, faults)
        if d is not None:
            distill.append(d)
    return model.lm_head(m.norm(m.hc_head(hs))), distill


def distill_loss(distill, valid=None):
    """Mean over CSA layers of the mean over queries of KL(p || q): p = the main attention's mass
    on each row the query saw (summed over heads, normalised), q = softmax of the indexer's
    scores over the same rows. Queries with no row, or no mass on any, are left out; so are
    positions where valid [B, S] is False (padding)."""
    total, n = 0.0, 0
    for scores, mass, sel in distill:
        if scores.shape[-1] == 0:
            continue
        keep = sel >= 0
        mass = mass.masked_fill(~keep, 0.0)
        tot = mass.sum(-1, keepdim=True)
        ok = (tot.squeeze(-1) > 1e-6) & keep.any(-1)
        if valid is not None:
            ok = ok & valid
        p = mass / tot.clamp_min(1e-12)
        logq = torch.log_softmax(scores.float().masked_fill(~keep, float("-inf")), dim=-1)
        kl = torch.where(p > 0, p * (torch.log(p.clamp_min(1e-30)) - logq.masked_fill(~keep, 0.0)), 0.0).sum(-1)
        total = total + (kl * ok).sum() / ok.sum().clamp_min(1)
        n += 1
    return total / max(n, 1)


def model_flops(model, tokens, seq_len, window, topk, train=True):
    """FLOPs of one pass over `tokens` tokens in sequences of seq_len: 2 per multiply-add of every
    weight a token uses (routed experts: num_experts_per_tok of n_routed_experts), of its
    attention over the keys it can see (window, top-k or visible rows, mean over positions) and
    of the indexer's scoring of every visible row; x3 for training (backward twice the forward),
    except the indexer's selection, which has no backward."""
    cfg = model.config
    tf = _tf()
    rates = []
    for layer in model.model.layers:
        comp = layer.self_attn.compressor
        rates.append(0 if comp is None else 4 if isinstance(comp, tf.DeepseekV4CSACompressor) else comp.compress_rate)
    routed, other = 0, 0
    for name, p in model.named_parameters():
        if p.ndim < 2 or "embed_tokens" in name or "position_bias" in name:
            continue  # a lookup, or a bias added per window
        if ".mlp.experts." in name:
            routed += p.numel()
        else:
            other += p.numel()
    per_tok = 2 * (other + routed * cfg.num_experts_per_tok / cfg.n_routed_experts)
    H, d = cfg.num_attention_heads, cfg.head_dim
    Hi, Di = cfg.index_n_heads, cfg.index_head_dim
    select = 0.0
    for rate in rates:
        keys = min(window, seq_len / 2)
        if rate == 4:
            visible = seq_len / 8  # mean visible rows over positions
            keys += min(topk, visible)
            select += 2 * Hi * Di * visible
            per_tok += 2 * Hi * Di * min(topk, visible)  # the scores with gradient, at the picked rows
        elif rate:
            keys += seq_len / (2 * rate)
        per_tok += 4 * H * d * keys
    return tokens * (per_tok * (3 if train else 1) + select)
