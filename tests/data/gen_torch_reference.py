#!/usr/bin/python3
"""Writes torch_reference.txt: random multi-head and scaled dot-product attention problems
solved by an independent implementation of docs/semantics.md §3-§6 in PyTorch (float64, autograd).

Regenerate with Debian's interpreter, which has python3-torch:
    /usr/bin/python3 tests/data/gen_torch_reference.py
CI only reads the committed file; it never needs PyTorch.

Format, one tensor per line:
    case <kind> <heads> <causal> <offset>
    <name> <dtype> <rank> <dims...> <values...>
    end
"""
import math
import pathlib

import torch

torch.set_default_dtype(torch.float64)
OUT = pathlib.Path(__file__).with_name("torch_reference.txt")


def masked_softmax(scores, allowed):
    # True masked maximum; exp only of allowed entries; empty rows stay zero.
    neg = torch.full_like(scores, -math.inf)
    m = torch.where(allowed, scores, neg).amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.where(allowed, torch.exp(torch.where(allowed, scores - m, torch.zeros_like(scores))), torch.zeros_like(scores))
    z = e.sum(dim=-1, keepdim=True)
    return torch.where(z > 0, e / torch.where(z > 0, z, torch.ones_like(z)), torch.zeros_like(e))


def mha(t, heads, causal, offset):
    query, context = t["query"], t["context"]
    B, Q, _ = query.shape
    K = context.shape[1]
    def proj(x, w, b):
        y = x @ t[w]
        return y + t[b] if b in t else y
    q, k, v = proj(query, "w_q", "b_q"), proj(context, "w_k", "b_k"), proj(context, "w_v", "b_v")
    D, Dv = q.shape[-1] // heads, v.shape[-1] // heads
    q = q.reshape(B, Q, heads, D).transpose(1, 2)
    k = k.reshape(B, K, heads, D).transpose(1, 2)
    v = v.reshape(B, K, heads, Dv).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    if "bias" in t:
        scores = scores + t["bias"]
    allowed = torch.ones(B, heads, Q, K, dtype=torch.bool)
    if "key_mask" in t:
        allowed = allowed & t["key_mask"][:, None, None, :]
    if "query_mask" in t:
        allowed = allowed & t["query_mask"][:, None, :, None]
    if "attention_mask" in t:
        allowed = allowed & t["attention_mask"]
    if causal:
        i = torch.arange(Q)[:, None]
        j = torch.arange(K)[None, :]
        allowed = allowed & (j <= i + offset)
    attn = masked_softmax(scores, allowed)
    merged = (attn @ v).transpose(1, 2).reshape(B, Q, heads * Dv)
    out = merged @ t["w_o"]
    if "b_o" in t:
        out = out + t["b_o"]
    active = allowed.any(dim=3).any(dim=1)  # [B, Q]
    out = torch.where(active[..., None], out, torch.zeros_like(out))
    return out, attn


def sdpa(t, mask):
    q, k, v = t["q"], t["k"], t["v"]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    allowed = torch.ones(scores.shape, dtype=torch.bool)
    if mask is not None:
        allowed = allowed & mask
    w = masked_softmax(scores, allowed)
    return w @ v, w


def fmt(name, x):
    dtype = "bool" if x.dtype == torch.bool else "f64"
    vals = " ".join(("1" if b else "0") for b in x.flatten().tolist()) if dtype == "bool" else " ".join(
        repr(float(v)) for v in x.flatten().tolist())
    return f"{name} {dtype} {x.dim()} {' '.join(str(d) for d in x.shape)} {vals}".replace("  ", " ")


def write_case(lines, kind, heads, causal, offset, inputs, masks, outputs, upstream, grads):
    lines.append(f"case {kind} {heads} {int(causal)} {offset}")
    for name, x in list(inputs.items()) + list(masks.items()) + list(upstream.items()) + list(outputs.items()):
        lines.append(fmt(name, x))
    for name, g in grads.items():
        lines.append(fmt("d_" + name, g))
    lines.append("end")


def mha_case(gen, lines, index):
    r = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=gen))
    B, Q, K, H, D, Dv = r(1, 3), r(1, 6), r(1, 6), r(1, 4), r(1, 3), r(1, 3)
    Cq, Cctx, Cout = r(1, 4), r(1, 4), r(1, 4)
    causal, offset = bool(r(0, 1)), r(-3, 4)
    randn = lambda *s: torch.randn(*s, generator=gen)
    t = {"query": randn(B, Q, Cq), "context": randn(B, K, Cctx)}
    bias_kind = index % 4
    if bias_kind == 1:
        t["bias"] = randn(B, H, Q, K)
    elif bias_kind == 2:
        t["bias"] = randn(1, H, 1, K)
    elif bias_kind == 3:
        t["bias"] = randn(Q, K)
    t.update({"w_q": randn(Cq, H * D), "w_k": randn(Cctx, H * D), "w_v": randn(Cctx, H * Dv), "w_o": randn(H * Dv, Cout)})
    if index % 3 != 0:
        t.update({"b_q": randn(H * D), "b_k": randn(H * D), "b_v": randn(H * Dv), "b_o": randn(Cout)})
    masks = {}
    if index % 5 != 0:
        masks["key_mask"] = torch.rand(B, K, generator=gen) < 0.8
        masks["query_mask"] = torch.rand(B, Q, generator=gen) < 0.85
        masks["attention_mask"] = torch.rand(B, H, Q, K, generator=gen) < 0.8
        if index % 5 == 2:
            masks["attention_mask"][0, 0, 0, :] = False  # an empty row in one head
        if index % 5 == 3:
            masks["key_mask"][0, :] = False  # a whole batch item sees nothing
    leaves = {n: x.clone().requires_grad_(True) for n, x in t.items()}
    out, attn = mha({**leaves, **masks}, H, causal, offset)
    upstream = {"grad_output": randn(*out.shape), "grad_attention": randn(*attn.shape)}
    torch.autograd.backward([out, attn], [upstream["grad_output"], upstream["grad_attention"]])
    grads = {n: (x.grad if x.grad is not None else torch.zeros_like(x)) for n, x in leaves.items()}
    write_case(lines, "mha", H, causal, offset, t, masks, {"output": out.detach(), "attention": attn.detach()}, upstream, grads)


def sdpa_case(gen, lines, index):
    r = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=gen))
    Q, K, D, Dv = r(1, 6), r(1, 6), r(1, 4), r(1, 4)
    lead_q = [r(1, 2), r(1, 3)][: index % 3]
    lead_k = [1 if i % 2 else d for i, d in enumerate(lead_q)]  # broadcast some leading dims
    randn = lambda *s: torch.randn(*s, generator=gen)
    t = {"q": randn(*lead_q, Q, D), "k": randn(*lead_k, K, D), "v": randn(*lead_k, K, Dv)}
    masks = {}
    if index % 2:
        masks["mask"] = torch.rand(Q, K, generator=gen) < 0.7
    leaves = {n: x.clone().requires_grad_(True) for n, x in t.items()}
    out, w = sdpa(leaves, masks.get("mask"))
    upstream = {"grad_output": randn(*out.shape), "grad_attention": randn(*w.shape)}
    torch.autograd.backward([out, w], [upstream["grad_output"], upstream["grad_attention"]])
    grads = {n: x.grad for n, x in leaves.items()}
    write_case(lines, "sdpa", 0, False, 0, t, masks, {"output": out.detach(), "attention": w.detach()}, upstream, grads)


def main():
    gen = torch.Generator().manual_seed(20261130)
    lines = [f"# generated by gen_torch_reference.py with torch {torch.__version__}; do not edit"]
    for i in range(200):
        mha_case(gen, lines, i)
    for i in range(60):
        sdpa_case(gen, lines, i)
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT} ({len(lines)} lines)")


if __name__ == "__main__":
    main()
