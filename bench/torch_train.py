#!/usr/bin/python3
"""The PyTorch twin of tapegrad_bench's train and gpt2 sections, step for step, in PyTorch eager
(another process and language: ./dev bench runs it for train_sort's model after tapegrad_bench,
and the gpt2 section runs it with --json between blocks of its own steps).

Same architecture as tapegrad's Decoder (token embedding + learned positions, pre-LayerNorm
blocks of causal multi-head attention with biases and an erf-GELU feed-forward of width 4 * dim,
final LayerNorm, untied linear head), same step (cross-entropy, backward, clip to norm 1, AdamW).
--model sort: train_sort's model (2 blocks of width 64, 4 heads), 64 sequences of 16 tokens over
11 symbols, targets on the second half (-100 elsewhere), AdamW lr 3e-3; float32 and float64,
median of 30 steps after 10 of warm-up. --model gpt2: the GPT-2 shape (12 blocks of width 768,
12 heads, 50,257 tokens, 1,024 positions), 4 sequences of 64 random tokens, AdamW lr 3e-4 and
weight decay 0.1; float32, median of 5 steps after 2. Prints the step, forward, backward and
update times those sections print.

    /usr/bin/python3 bench/torch_train.py [--model sort|gpt2] [--threads N] [--json FILE] [--markdown PAGE]

--markdown appends the table to PAGE (./dev bench: docs/benchmarks.md, right after
tapegrad_bench wrote it), under one heading for every run of this script.

Debian's python3-torch installs for /usr/bin/python3 only; CI never runs this.
"""
import argparse
import json
import os
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


MODELS = {
    # vocab, max_len, dim, heads, layers, batch, T, lr, weight decay, warm-up, timed, dtypes
    "sort": dict(vocab=11, max_len=17, dim=64, heads=4, layers=2, batch=64, t=16, lr=3e-3, wd=0.01, warmup=10, timed=30,
                 dtypes=(torch.float32, torch.float64)),
    "gpt2": dict(vocab=50257, max_len=1024, dim=768, heads=12, layers=12, batch=4, t=64, lr=3e-4, wd=0.1, warmup=2, timed=5,
                 dtypes=(torch.float32,)),
}


def run(dtype, m, sort):
    torch.manual_seed(1)
    model = Decoder(m["vocab"], m["max_len"], m["dim"], m["heads"], m["layers"]).to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=m["lr"], weight_decay=m["wd"])
    batch, t, vocab = m["batch"], m["t"], m["vocab"]
    fwd, bwd, upd, total = [], [], [], []
    for step in range(m["warmup"] + m["timed"]):
        ids = torch.randint(0, vocab, (batch, t))
        targets = torch.randint(0, vocab - 1 if sort else vocab, (batch, t))
        if sort:
            targets[:, : t // 2] = -100
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(ids).reshape(-1, vocab), targets.reshape(-1), ignore_index=-100)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        t3 = time.perf_counter()
        if step >= m["warmup"]:
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
    p.add_argument("--model", choices=sorted(MODELS), default="sort")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--markdown", metavar="PAGE", help="append the table to this Markdown page")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    m = MODELS[args.model]
    name = NAMES[args.model]
    print(f"PyTorch {torch.__version__}, {name}, {args.threads} thread(s); milliseconds per step (median of {m['timed']})")
    print(f"{'dtype':<8} {'tokens/s':>9} {'step':>9} {'forward':>9} {'backward':>9} {'update':>9} {'step min-max':>13}")
    rows = []
    for dtype in m["dtypes"]:
        r = run(dtype, m, args.model == "sort")
        rows.append(r)
        print(f"{r['dtype']:<8} {r['tokens_per_s']:>9.0f} {r['step_ms']:>9.2f} {r['forward_ms']:>9.2f} {r['backward_ms']:>9.2f} "
              f"{r['update_ms']:>9.2f} {r['step_min_ms']:>7.2f}-{r['step_max_ms']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "model": args.model, "threads": args.threads, "warmup": m["warmup"],
                       "timed": m["timed"], "rows": rows}, f, indent=2)
    if args.markdown:
        append_markdown(args.markdown, args.model, args.threads, rows, m["timed"])


NAMES = {"sort": "train_sort's model", "gpt2": "the GPT-2 shape"}
SECTIONS = {"sort": "train", "gpt2": "gpt2"}


def append_markdown(path, model, threads, rows, timed):
    with open(path) as f:
        page = f.read()
    out = []
    heading = f"## {SECTIONS[model]} against PyTorch"
    if heading not in page:
        out += ["", heading, "",
                "The same model, batch and step in PyTorch eager (`bench/torch_train.py`, another process, run",
                f"after the sections above; compare with the `{SECTIONS[model]}` section's rows at the same thread count)."]
    # Debian's PyTorch takes its products from whichever libblas.so.3 the alternatives system
    # points at, and the reference BLAS is far slower than OpenBLAS: the page names it.
    blas = os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
    out += ["", f"**PyTorch {torch.__version__} (BLAS: `{blas}`), {NAMES[model]}, {threads} thread(s): ms, median of {timed} steps (min-max)**", "",
            "| dtype | tokens/s | step ms | forward ms | backward ms | update ms |",
            "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        out.append(f"| {r['dtype']} | {r['tokens_per_s']:.0f} | {r['step_ms']:.2f} ({r['step_min_ms']:.2f}-{r['step_max_ms']:.2f}) | "
                   f"{r['forward_ms']:.2f} | {r['backward_ms']:.2f} | {r['update_ms']:.2f} |")
    with open(path, "a") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
