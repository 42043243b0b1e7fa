"""tools/needle_fast.py's attention against brute force: every key and compressed row scored
and masked explicitly ([S, S + R], as transformers' eager attention does), with the indexer's
selection scattered into the mask, on a small stand-in for a V4 attention layer. Sliding, CSA
and HCA layers; windows 4 and 8; 3-64 tokens (partial windows and blocks); top-k none, 0, 2 and
all rows; the q-only Hadamard fault; outputs, top-k sets and every parameter's gradient.

transformers is not needed: the module needle_fast imports from it is replaced by a stand-in
holding the interleaved RoPE and the two compressor classes (needle_fast only tests isinstance).
Run by tests/test_needle_fast.sh (exit 77 without torch). Exit 1 on any difference.
"""
import os, sys, types, math
try:
    import torch, torch.nn as nn, torch.nn.functional as F
except ImportError:
    print("SKIP: no torch"); sys.exit(77)
torch.manual_seed(0)
# stand-in for transformers' module: rope and the two compressor classes
def rotate_half(x):
    x1 = x[..., 0::2]; x2 = x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)
def apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=1):
    cos = cos.repeat_interleave(2, dim=-1).unsqueeze(unsqueeze_dim); sin = sin.repeat_interleave(2, dim=-1).unsqueeze(unsqueeze_dim)
    rd = cos.shape[-1]; nope, r = x[..., :-rd], x[..., -rd:]
    return torch.cat([nope, (r.float()*cos + rotate_half(r).float()*sin).to(x.dtype)], -1)
class RMS(nn.Module):
    def __init__(s, n): super().__init__(); s.weight = nn.Parameter(1 + 0.1*torch.randn(n))
    def forward(s, x): return s.weight * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)
class URMS(nn.Module):
    def forward(s, x): return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + 1e-6).to(x.dtype)
class Rot(nn.Module):
    def forward(s, x, position_ids, layer_type):
        inv = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16)) if layer_type == "main" else 1.0 / (160000 ** (torch.arange(0, 16, 2).float() / 16))
        f = position_ids[..., None].float() * inv
        return f.cos().to(x.dtype), f.sin().to(x.dtype)
class CSA(nn.Module): pass
class HCA(nn.Module): pass
mod = types.ModuleType("m"); mod.apply_rotary_pos_emb = apply_rotary_pos_emb
mod.DeepseekV4CSACompressor = CSA; mod.DeepseekV4HCACompressor = HCA
for n in ["transformers", "transformers.models", "transformers.models.deepseek_v4"]:
    sys.modules[n] = types.ModuleType(n)
sys.modules["transformers.models.deepseek_v4"].modeling_deepseek_v4 = mod
sys.modules["transformers.models.deepseek_v4.modeling_deepseek_v4"] = mod
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import needle_fast as nf
D, H, d, Hi, Di, qr = 32, 4, 24, 16, 16, 20
def lin(i, o): l = nn.Linear(i, o, bias=False); nn.init.normal_(l.weight, std=0.3); return l
def comp(cls, rate, hd, overlap):
    c = cls(); c.compress_rate = rate; c.head_dim = hd
    c.kv_proj = lin(D, hd * (2 if overlap else 1)); c.gate_proj = lin(D, hd * (2 if overlap else 1))
    c.position_bias = nn.Parameter(torch.randn(rate, hd * (2 if overlap else 1)) * 0.3); c.kv_norm = RMS(hd)
    return c
class Grouped(nn.Linear):
    def __init__(s, i, o, g): super().__init__(i, o, bias=False); s.n_groups = g; nn.init.normal_(s.weight, std=0.3)
    def forward(s, x):
        w = s.weight.view(s.n_groups, -1, x.shape[-1]).transpose(1, 2)
        y = torch.bmm(x.reshape(-1, s.n_groups, x.shape[-1]).transpose(0, 1), w).transpose(0, 1)
        return y.reshape(*x.shape[:-2], s.n_groups, -1)
def attn_mod(kind, W):
    a = nn.Module(); a.head_dim = d; a.num_heads = H; a.scaling = d ** -0.5; a.sliding_window = W
    a.rope_layer_type = "main" if kind == "sliding" else "compress"
    a.q_a_proj = lin(D, qr); a.q_a_norm = RMS(qr); a.q_b_proj = lin(qr, H * d); a.q_b_norm = URMS()
    a.kv_proj = lin(D, d); a.kv_norm = RMS(d); a.sinks = nn.Parameter(torch.randn(H))
    a.config = types.SimpleNamespace(o_groups=2); a.o_a_proj = Grouped(H * d // 2, 2 * 16, 2); a.o_b_proj = lin(32, D)
    a.compressor = None
    if kind == "csa":
        c = comp(CSA, 4, d, True); ix = comp(nn.Module, 4, Di, True)
        ix.num_heads = Hi; ix.index_topk = 5; ix.q_b_proj = lin(qr, Hi * Di)
        sc = nn.Module(); sc.softmax_scale = Di ** -0.5; sc.weights_scaling = Hi ** -0.5; sc.weights_proj = lin(D, Hi)
        ix.scorer = sc; c.indexer = ix; a.compressor = c
    if kind == "hca":
        a.compressor = comp(HCA, 8, d, False)
    return a
rot = Rot()
def ref_pool(c, h, overlap):
    """compressed rows one by one: row r softmax-pools its window's tokens (and, overlapping, the
    previous window's first series), RMS-normed, roped at position r * rate"""
    B, S, _ = h.shape; rate, hd = c.compress_rate, c.head_dim
    kv, gate = c.kv_proj(h), c.gate_proj(h)
    out = []
    for r in range(S // rate):
        own = slice(r * rate, (r + 1) * rate)
        if overlap:
            k_own, g_own = kv[:, own, hd:], gate[:, own, hd:] + c.position_bias[:, hd:]
            if r > 0:
                prev = slice((r - 1) * rate, r * rate)
                k_own = torch.cat([kv[:, prev, :hd], k_own], 1)
                g_own = torch.cat([gate[:, prev, :hd] + c.position_bias[:, :hd], g_own], 1)
        else:
            k_own, g_own = kv[:, own], gate[:, own] + c.position_bias
        row = c.kv_norm((k_own * g_own.softmax(1)).sum(1))
        cr, sr = rot(h, torch.tensor([[r * rate]]), "compress")
        out.append(apply_rotary_pos_emb(row.unsqueeze(1).unsqueeze(1), cr, sr)[:, 0, 0])
    return torch.stack(out, 1) if out else h.new_zeros((B, 0, hd))
def reference(a, h, pos, faults):
    """dense eager semantics: keys = all S tokens + R rows, masks"""
    B, S, _ = h.shape
    cos, sin = rot(h, pos, a.rope_layer_type)
    q_res = a.q_a_norm(a.q_a_proj(h)); q = apply_rotary_pos_emb(a.q_b_norm(a.q_b_proj(q_res).view(B, S, -1, d).transpose(1, 2)), cos, sin)
    kv = apply_rotary_pos_emb(a.kv_norm(a.kv_proj(h)).view(B, S, 1, d).transpose(1, 2), cos, sin)
    i = torch.arange(S)[:, None]; j = torch.arange(S)[None]
    mask = torch.where((j <= i) & (j > i - a.sliding_window), 0.0, float("-inf"))[None, None].expand(B, 1, S, S)
    c = a.compressor; sel = None
    if c is not None:
        ck = ref_pool(c, h, isinstance(c, CSA))
        R = ck.shape[1]
        if isinstance(c, CSA):
            ix = c.indexer
            k = ref_pool(ix, h, True)
            cq, sq = rot(h, pos, "compress")
            qi = apply_rotary_pos_emb(ix.q_b_proj(q_res).view(B, S, -1, Di).transpose(1, 2), cq, sq).transpose(1, 2)
            if faults.get("rotate") == "q":
                n = Di; Hm = torch.ones(1, 1)
                while Hm.shape[0] < n:
                    Hm = torch.cat([torch.cat([Hm, Hm], 1), torch.cat([Hm, -Hm], 1)], 0)
                qi = qi @ (Hm / math.sqrt(n))
            sc = ix.scorer
            s = (F.relu(torch.matmul(qi.float(), k.transpose(-1, -2).unsqueeze(1))) * sc.softmax_scale * (sc.weights_proj(h) * sc.weights_scaling).unsqueeze(-1)).sum(2)
            thr = (pos[0] + 1) // 4
            s = s.masked_fill(torch.arange(R)[None, None] >= thr[None, :, None], float("-inf"))
            kk = faults.get("topk") if faults.get("topk") is not None else ix.index_topk
            top = s.topk(min(kk, R), dim=-1).indices
            top = torch.where(top >= thr[None, :, None], -1, top)
            bb = torch.full((B, 1, S, R + 1), float("-inf")); bb.scatter_(-1, torch.where(top >= 0, top, R).unsqueeze(1), 0.0)
            bb = bb[..., :R]; sel = top
        else:
            thr = (pos[0] + 1) // c.compress_rate
            bb = torch.where(torch.arange(R)[None] >= thr[:, None], float("-inf"), 0.0)[None, None].expand(B, 1, S, R)
        kv = torch.cat([kv, ck.unsqueeze(1)], 2); mask = torch.cat([mask, bb], -1)
    w = torch.matmul(q, kv.transpose(2, 3)) * a.scaling + mask
    comb = torch.cat([w, a.sinks.reshape(1, -1, 1, 1).expand(B, -1, S, 1)], -1)
    comb = comb - comb.max(-1, keepdim=True).values
    p = F.softmax(comb, -1)[..., :-1]
    o = torch.matmul(p, kv).transpose(1, 2)
    o = apply_rotary_pos_emb(o.transpose(1, 2), cos, -sin).transpose(1, 2)
    return a.o_b_proj(a.o_a_proj(o.reshape(B, S, 2, -1)).flatten(2)), sel
bad = 0
for kind in ["sliding", "csa", "hca"]:
    for W in [4, 8]:
        for S in [3, 16, 37, 64]:
            for topk, rotate in [(None, None), (0, None), (2, None), (1000, None), (None, "q")]:
                torch.manual_seed(S * 7 + W)
                a = attn_mod(kind, W)
                h = torch.randn(2, S, D)
                pos = torch.arange(S)[None]
                f = dict(nf.NO_FAULTS, topk=topk, rotate=rotate)
                pe = {"main": rot(h, pos, "main"), "compress": rot(h, pos, "compress")}
                got, d1 = nf.attention(a, h, pe, pos, f)
                dist = [d1] if d1 is not None else []
                want, sel = reference(a, h, pos, f)
                err = (got - want).abs().max().item()
                if err > 1e-4: bad += 1; print("DIFF", kind, W, S, topk, err)
                if dist:
                    gs = dist[0][2]
                    same = (torch.sort(gs, -1).values == torch.sort(sel, -1).values).all().item() if gs.shape == sel.shape else "shape %s %s" % (gs.shape, sel.shape)
                    if same is not True: bad += 1; print("SEL", kind, W, S, topk, same)
                    l = nf.distill_loss(dist); l.backward() if torch.is_tensor(l) and l.requires_grad else None
print(f"forward: {bad} differences")
# evaluation (no gradient) scores the dense indexer in chunks of queries: a chunk of 1-5 queries
# must give brute force's output and the dense path's own scores
saved = nf.SCORE_CHUNK_ELEMS
for S, elems in [(37, 2 * Hi * 9), (64, 5 * 2 * Hi * 16), (64, 1)]:
    torch.manual_seed(S)
    a = attn_mod("csa", 8); h = torch.randn(2, S, D); pos = torch.arange(S)[None]
    f = dict(nf.NO_FAULTS, topk=1000)
    pe = {"main": rot(h, pos, "main"), "compress": rot(h, pos, "compress")}
    whole = nf.attention(a, h, pe, pos, f)
    nf.SCORE_CHUNK_ELEMS = elems
    matmul, largest = torch.matmul, [0]
    broadcast = []
    def counted(x, y):  # the indexer's q . k products ([B, c, heads, R]) are needle_fast's only matmuls here
        if x.dim() > 2 and y.dim() > 2 and x.shape[:-2] != y.shape[:-2]:
            broadcast.append((tuple(x.shape), tuple(y.shape)))  # torch.matmul copies the broadcast operand
        r = matmul(x, y); largest[0] = max(largest[0], r.numel()); return r
    torch.matmul = counted
    with torch.no_grad():
        got, d1 = nf.attention(a, h, pe, pos, f)
    torch.matmul, nf.SCORE_CHUNK_ELEMS = matmul, saved
    R = S // 4
    if broadcast:
        bad += 1; print(f"no-grad dense, S={S}: a score product broadcasts its batch dimensions {broadcast[0]} (a copy per query)")
    if largest[0] == 0 or largest[0] > max(elems, 2 * Hi * R):
        bad += 1; print(f"no-grad dense, S={S}: a score product of {largest[0]} elements, over {max(elems, 2 * Hi * R)}")
    want, _ = reference(a, h, pos, f)
    err = (got - want).abs().max().item()
    serr = (d1[0] - whole[1][0]).abs().max().item()
    print(f"no-grad dense, S={S}, chunk elems {elems}: output {err:.2e} from brute force, scores {serr:.2e} from one chunk")
    if err > 1e-4 or serr > 1e-5: bad += 1
# gradients
for kind in ["csa", "hca", "sliding"]:
    torch.manual_seed(5); a = attn_mod(kind, 8); h = torch.randn(2, 45, D); pos = torch.arange(45)[None]
    f = dict(nf.NO_FAULTS); pe = {"main": rot(h, pos, "main"), "compress": rot(h, pos, "compress")}
    g = torch.randn(2, 45, D)
    (nf.attention(a, h, pe, pos, f)[0] * g).sum().backward()
    g1 = {n: p.grad.clone() for n, p in a.named_parameters() if p.grad is not None}
    a.zero_grad()
    (reference(a, h, pos, f)[0] * g).sum().backward()
    g2 = {n: p.grad.clone() for n, p in a.named_parameters() if p.grad is not None}
    worst = max((g1[n] - g2[n]).abs().max().item() for n in g1)
    print(f"{kind}: gradients of {len(g1)} parameters, max difference {worst:.2e}")
    if set(g1) != set(g2) or worst > 1e-4:
        bad += 1
# the mHC as functions (hc_weights, hc_mix; use_compile("hc")) against SPEC-dsv4 §2.2 step by
# step in float64, token by token, and their gradients against the float64 reference's
def hc_reference(hs, fn, base, scale, eps, iters, norm_eps):
    B, S, N, Dm = hs.shape
    posts, combs, cols = [], [], []
    for b in range(B):
        for t in range(S):
            x = hs[b, t].double().reshape(-1)
            mix = (fn.double() @ x) * torch.rsqrt((x * x).mean() + norm_eps)
            pre = torch.sigmoid(mix[:N] * scale[0] + base[:N]) + eps
            post = 2 * torch.sigmoid(mix[N:2 * N] * scale[1] + base[N:2 * N])
            c0 = (mix[2 * N:] * scale[2] + base[2 * N:]).reshape(N, N)
            c = torch.exp(c0 - c0.max(1, keepdim=True).values)
            c = c / c.sum(1, keepdim=True) + eps
            c = c / (c.sum(0, keepdim=True) + eps)
            for _ in range(iters - 1):
                c = c / (c.sum(1, keepdim=True) + eps)
                c = c / (c.sum(0, keepdim=True) + eps)
            posts.append(post); combs.append(c); cols.append((pre[:, None] * hs[b, t].double()).sum(0))
    return (torch.stack(posts).view(B, S, N), torch.stack(combs).view(B, S, N, N), torch.stack(cols).view(B, S, Dm))
torch.manual_seed(11)
N, Dm = 4, 24
hs = torch.randn(2, 7, N, Dm, requires_grad=True)
fn = (0.2 * torch.randn((2 + N) * N, N * Dm)).requires_grad_()
base, scale = (0.5 * torch.randn((2 + N) * N)).requires_grad_(), torch.tensor([0.7, 1.1, 0.9], requires_grad=True)
got = nf.hc_weights(hs, fn, base, scale, 1e-6, 20, 1e-6)
want = hc_reference(hs, fn, base, scale, 1e-6, 20, 1e-6)
errs = [(g.double() - w).abs().max().item() for g, w in zip(got, want)]
sums = (got[1].sum(-2) - 1).abs().max().item()
print(f"hc_weights: post {errs[0]:.2e}, comb {errs[1]:.2e}, collapsed {errs[2]:.2e} from float64; comb columns sum to 1 within {sums:.1e}")
if max(errs) > 1e-5 or sums > 1e-4: bad += 1
wts = [torch.randn_like(t) for t in got]
g1 = torch.autograd.grad(sum((g * w).sum() for g, w in zip(got, wts)), [hs, fn, base, scale])
g2 = torch.autograd.grad(sum((g * w.double()).sum() for g, w in zip(want, wts)), [hs, fn, base, scale])
gerr = max(((a.double() - b).abs().max() / b.abs().max()).item() for a, b in zip(g1, g2))
print(f"hc_weights: gradients of the streams, fn, base and scale within {gerr:.2e} of float64 (relative)")
if gerr > 1e-4: bad += 1
out = torch.randn(2, 7, Dm)
mixed, ref = nf.hc_mix(got[0], got[1], out, hs), nf._hc_matmul(got[0], got[1], out, hs)
wmix = got[0].double().unsqueeze(-1) * out.double().unsqueeze(-2) + torch.einsum("bsij,bsid->bsjd", got[1].double(), hs.double())
merr, rerr = (mixed.double() - wmix).abs().max().item(), (ref.double() - wmix).abs().max().item()
print(f"hc_mix: {merr:.2e} from float64 (transformers' matmul form: {rerr:.2e})")
if merr > 1e-5: bad += 1
if bad:
    print(f"FAIL: {bad} differences")
    sys.exit(1)
print("ok: the fast attention equals brute force")
