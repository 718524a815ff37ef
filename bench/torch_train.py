#!/usr/bin/python3
"""The PyTorch twin of tapegrad_bench's train section: train_sort's default model, step for step,
in PyTorch eager (another process and language, so ./dev bench runs it after tapegrad_bench).

Same architecture as tapegrad's Decoder (token embedding + learned positions, 2 pre-LayerNorm
blocks of causal multi-head attention with biases and an erf-GELU feed-forward of width 4 * 64,
final LayerNorm, linear head), same batch (64 sequences of 16 tokens over 11 symbols, targets on
the second half, -100 elsewhere), same step (cross-entropy, backward, clip to norm 1, AdamW lr
3e-3). Prints the step, forward, backward and update times that section prints: median of 30
steps after 10 of warm-up.

    /usr/bin/python3 bench/torch_train.py [--threads N] [--json FILE]

Debian's python3-torch installs for /usr/bin/python3 only; CI never runs this.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, bias=True, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x, causal):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=causal, need_weights=False)
        x = x + a
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class Decoder(nn.Module):
    def __init__(self, vocab, max_len, dim, heads, layers):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        t = ids.shape[1]
        # True = may NOT attend, PyTorch's convention for a bool attn_mask.
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        x = self.tok(ids) + self.pos(torch.arange(t))
        for b in self.blocks:
            x = b(x, causal)
        return self.head(self.ln_f(x))


def run(dtype, batch=64, digits=8):
    t = 2 * digits
    torch.manual_seed(1)
    model = Decoder(11, t + 1, 64, 4, 2).to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    fwd, bwd, upd, total = [], [], [], []
    for step in range(40):
        ids = torch.randint(0, 11, (batch, t))
        targets = torch.randint(0, 10, (batch, t))
        targets[:, :digits] = -100
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(ids).reshape(-1, 11), targets.reshape(-1), ignore_index=-100)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        t3 = time.perf_counter()
        if step >= 10:
            fwd.append(t1 - t0), bwd.append(t2 - t1), upd.append(t3 - t2), total.append(t3 - t0)
    ms = statistics.median(total) * 1e3
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "tokens_per_s": batch * t / (ms / 1e3),
        "step_ms": ms,
        "forward_ms": statistics.median(fwd) * 1e3,
        "backward_ms": statistics.median(bwd) * 1e3,
        "update_ms": statistics.median(upd) * 1e3,
        "step_min_ms": min(total) * 1e3,
        "step_max_ms": max(total) * 1e3,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"PyTorch {torch.__version__}, train_sort's model, {args.threads} thread(s); milliseconds per step (median of 30)")
    print(f"{'dtype':<8} {'tokens/s':>9} {'step':>9} {'forward':>9} {'backward':>9} {'update':>9} {'step min-max':>13}")
    rows = []
    for dtype in (torch.float32, torch.float64):
        r = run(dtype)
        rows.append(r)
        print(f"{r['dtype']:<8} {r['tokens_per_s']:>9.0f} {r['step_ms']:>9.2f} {r['forward_ms']:>9.2f} {r['backward_ms']:>9.2f} "
              f"{r['update_ms']:>9.2f} {r['step_min_ms']:>7.2f}-{r['step_max_ms']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "threads": args.threads, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
