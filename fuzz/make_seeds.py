#!/usr/bin/env python3
"""Writes the hand-made seeds of fuzz_tape, fuzz_shapes, fuzz_layer, fuzz_masked and fuzz_checkpoint.

Each seed spells out, in the order a target asks for them, the choices that lead to one case
(FuzzedDataProvider reads integers and flags from the end of the input, most significant byte
first; once the bytes run out every choice is its minimum, so a seed stops after its last
interesting choice). Run: fuzz/make_seeds.py DIR, which writes DIR/<target>/seed-<name>.
Check what a seed reaches with FUZZ_DEBUG=1 build-fuzz/fuzz/<target> FILE.
"""
import os
import sys


class Seed:
    def __init__(self):
        self.tail = bytearray()  # in reading order: the input is this, reversed

    def int(self, lo, hi, v):  # ConsumeIntegralInRange(lo, hi) == v
        assert lo <= v <= hi, (lo, hi, v)
        rng, x, n = hi - lo, v - lo, 0
        while n < 8 and (rng >> (8 * n)) > 0:
            n += 1
        self.tail += x.to_bytes(n, "big") if n else b""
        return self

    def flag(self, b):  # ConsumeBool
        self.tail.append(1 if b else 0)
        return self

    def reals(self, *fractions):  # ConsumeFloatingPointInRange, each at lo + fraction (hi - lo)
        for f in fractions:
            self.tail += int(f * (2**64 - 1)).to_bytes(8, "big")
        return self

    def data(self):
        return bytes(reversed(self.tail))


def values(n, start=0.3):  # n pleasant fractions
    return [((start + 0.37 * i) % 0.9) + 0.05 for i in range(n)]


# ---- fuzz_tape: leaves of shape [2] (float64, all requiring grad), steps, writes, backward ----

def tape(steps, writes=(), roots=((2, 2),), scalar=False, twice=False, leaves=2, rank=1, n=2, float32=False):
    s = Seed().int(0, 2, rank).int(1, 3, n).int(0, 3, 0 if float32 else 1).int(1, 4, leaves)
    numel = n**rank
    for _ in range(leaves):
        s.reals(*values(numel)).int(0, 3, 1)
    s.int(0, 12, len(steps))
    pool = leaves
    for st in steps:
        pool = st(s, pool)
    s.int(0, 3, len(writes))
    for kind, slot, leaf in writes:
        s.int(0, 6, kind).int(0, pool - 1, slot).int(0, leaves - 1, leaf)
    s.int(1, 3, len(roots))
    for slot, g in roots:
        s.int(0, pool - 1, slot).int(0, 9, g)
        if g >= 2:
            s.reals(*values(numel, 0.6))
    return s.flag(scalar).flag(twice)


def op(kind, a, b, op_=0, how=0, guards=(), saved_all=False, thread=False):
    """A step of kind 3-9 on slots a and b (kind 8 adds two tensors to the pool)."""
    def step(s, pool):
        s.int(0, 13, kind).int(0, 3, len(guards))
        for g in guards:
            s.flag(g)
        s.int(0, pool - 1, a).int(0, pool - 1, b).int(0, 19, op_).int(0, 11, how).flag(saved_all)
        s.flag(thread)
        if thread:
            s.flag(True)
        return pool + (2 if kind == 8 else 0 if kind == 9 else 1)
    return step


def slot_step(kind, slot, value=False):  # 0 drop, 1 detach, 2 set_requires_grad(value)
    def step(s, pool):
        s.int(0, 13, kind).int(0, pool - 1, slot)
        if kind == 2:
            s.flag(value)
        return pool
    return step


def tape_seeds():
    seeds = {}
    for how in range(12):  # every backward behaviour of a user op (kind 6: user_mul)
        seeds[f"user-op-behaviour-{how}"] = tape([op(6, 0, 1, how=how)])
    seeds["user-op-saved-all"] = tape([op(6, 0, 1, saved_all=True)])
    for how in (0, 1, 2, 4, 5):  # gradcheck of the user op (kind 9)
        seeds[f"gradcheck-user-op-{how}"] = tape([op(9, 0, 1, how=how)], roots=((0, 2),))
    seeds["pair-one-output-read"] = tape([op(8, 0, 1), op(3, 2, 2, op_=4)], roots=((4, 2),))
    seeds["pair-both-outputs"] = tape([op(8, 0, 1, how=1)], roots=((2, 2), (3, 2)))
    for o in range(20):  # every built-in op, then backward from its result
        seeds[f"builtin-{o}"] = tape([op(3, 0, 1, op_=o)], rank=2)
    seeds["guards-no-grad"] = tape([op(4, 0, 1, guards=(False,))])
    seeds["guards-no-then-enable"] = tape([op(5, 0, 1, op_=5, guards=(False, True))])
    seeds["guards-enable-then-no"] = tape([op(5, 0, 1, guards=(True, False, True))])
    seeds["drop-detach-require"] = tape([op(3, 0, 1), slot_step(0, 2), op(3, 0, 1, op_=2), slot_step(1, 3),
                                         slot_step(2, 3, True), slot_step(2, 0, False)], roots=((3, 2),))
    for kind in range(7):  # each in-place write between record and backward
        seeds[f"inplace-{kind}"] = tape([op(3, 0, 1, op_=5), op(6, 0, 2)], writes=((kind, 3, 0),), roots=((3, 2),))
    seeds["inplace-exp-output"] = tape([op(3, 0, 1, op_=5), op(3, 2, 1, op_=2)], writes=((4, 2, 0),), roots=((3, 2),))
    seeds["thread"] = tape([op(6, 0, 1, thread=True), op(3, 2, 0, op_=15)], roots=((3, 2),))
    seeds["bad-roots"] = tape([op(3, 0, 1)], roots=((2, 0), (2, 1)))
    seeds["scalar-twice"] = tape([op(3, 0, 1, op_=19), op(3, 2, 1, op_=11)], rank=0, roots=((3, 2),), scalar=True, twice=True)
    seeds["float32-matmul"] = tape([op(3, 0, 1, op_=15), op(7, 2, 0, how=1)], rank=2, float32=True, roots=((3, 2),))
    return seeds


# ---- fuzz_shapes -----------------------------------------------------------------------------

HUGE = [1 << 20, 1 << 31, 1 << 40, 1 << 46, 1 << 47, 1 << 48, 1 << 62, 2**63 - 1, -1, -2, -2**63]


def size(s, v):
    if 0 <= v <= 4:
        return s.int(0, 9, 0).int(0, 4, v)
    if v in HUGE:
        return s.int(0, 9, 7).int(0, 10, HUGE.index(v))
    return s.int(0, 9, 9).int(0, 70, v)


def shape(s, dims, max_rank=5):
    s.int(0, max_rank, len(dims))
    for d in dims:
        size(s, d)
    return s


DTYPES = {"float32": 0, "float64": 1, "int64": 3, "bool": 4}
EXTREME = [-2**63, -2**63 + 1, -(1 << 62), 1 << 62, 2**63 - 2, 2**63 - 1]


def index(s, v):
    if -6 <= v <= 6:
        return s.int(0, 7, 1).int(-6, 6, v)
    return s.int(0, 7, 0).int(0, 5, EXTREME.index(v))


def chain(dims, dtype="float64", grad=True, ops=()):
    s = Seed().int(0, 7, 4)
    shape(s, dims).int(0, 4, DTYPES[dtype])
    if dtype.startswith("float"):
        s.flag(grad)
    s.int(1, 4, max(len(ops), 1))
    for o in ops:
        o(s)
    return s


def shape_seeds():
    seeds = {}
    for w in range(4):
        seeds[f"factory-{w}"] = shape(Seed().int(0, 7, 0), [2, 3]).int(0, 4, 1).int(0, 8, 2).int(0, 3, w)
    seeds["factory-huge-zero"] = shape(Seed().int(0, 7, 0), [0, 1 << 46]).int(0, 4, 0).int(0, 8, 0).int(0, 3, 1)
    seeds["factory-too-big"] = shape(Seed().int(0, 7, 0), [1 << 40, 1 << 40]).int(0, 4, 1).int(0, 8, 0).int(0, 3, 2)
    seeds["factory-negative"] = shape(Seed().int(0, 7, 0), [3, -1]).int(0, 4, 0)
    seeds["factory-full-int64"] = shape(Seed().int(0, 7, 0), [4]).int(0, 4, 3).int(0, 8, 8).int(0, 3, 3)
    seeds["arange"] = Seed().int(0, 7, 1).flag(True).int(-20, 20, -3).flag(True).int(-20, 20, 7).flag(True).int(0, 4, 2).int(0, 4, 1)
    seeds["arange-huge"] = Seed().int(0, 7, 1).flag(True).int(-20, 20, 0).flag(False).int(0, 11, 6).flag(True).int(0, 4, 0).int(0, 4, 3)
    seeds["arange-nan"] = Seed().int(0, 7, 1).flag(False).int(0, 11, 11)
    seeds["causal-mask"] = size(size(Seed().int(0, 7, 2), 3), 4)
    index(seeds["causal-mask"], -1)
    seeds["causal-mask-long-empty"] = size(size(Seed().int(0, 7, 2), 1 << 40), 0)
    seeds["causal-mask-too-big"] = size(size(Seed().int(0, 7, 2), 1 << 40), 1 << 20)
    seeds["broadcast-shapes"] = shape(shape(Seed().int(0, 7, 3), [3, 1, 1 << 62]), [4, 1, 1])
    seeds["broadcast-shapes-fails"] = shape(shape(Seed().int(0, 7, 3), [3, 2]), [4, 2])

    def reshape(dims):  # -1 entries are drawn as 0, then turned into -1
        def r(s):
            if dims == [-1]:
                s.int(0, 13, 0).flag(True).int(0, 5, 1)
                return
            shape(s.int(0, 13, 0).flag(False), [0 if d == -1 else d for d in dims])
            for d in dims:
                s.int(0, 5, 0 if d == -1 else 1)
        return r

    def permute(rank):  # reverses the first two dims (one of them negative)
        def p(s):
            s.int(0, 13, 2)
            for i in range(rank, 1, -1):
                s.int(0, i - 1, 0 if i == 2 else i - 1)
            for i in range(rank):
                s.flag(i == 0)
            s.int(0, 5, 1).int(0, 5, 1)
        return p

    def transpose(rank):
        return lambda s: s.int(0, 13, 3).flag(False).int(-rank, rank - 1, 0).flag(False).int(-rank, rank - 1, -1)

    def slice_(s):  # rank 3: dim 1, start 1, end 6, step 2
        s.int(0, 13, 4).flag(False).int(0, 2, 1)
        index(s, 1)
        s.flag(True)
        index(s, 6)
        s.flag(True).int(-1, 4, 2)

    def narrow(s):  # rank 3: dim 2, start 1, length 2
        s.int(0, 13, 6).flag(False).int(0, 2, 2).flag(False).int(0, 4, 1).flag(False).int(0, 4, 2)

    def select(rank, dim=0, i=-1):
        return lambda s: s.int(0, 13, 7).flag(False).int(0, rank - 1, dim).flag(False).int(-3, 3, i)

    def expand(s):  # [2, 1, 3] -> [2^20, 2, 64, 3]: 4e8 elements over 6 stored
        s.int(0, 13, 8).int(0, 2, 1)
        size(s.int(0, 3, 2), 1 << 20)
        s.int(0, 3, 1)
        size(s.int(0, 3, 2), 64)
        s.int(0, 3, 0).int(0, 7, 1)

    def unsqueeze(rank, dim):
        return lambda s: s.int(0, 13, 9).flag(True).flag(False).int(-rank - 1, rank, dim)

    def concat(rank, dim, sizes):  # x with one or two others of other sizes along dim
        def c(s):
            s.int(0, 13, 10).flag(False).flag(False).int(-rank - 1, rank, dim).int(1, 2, len(sizes))
            for i, n in enumerate(sizes):
                size(s.int(0, 7, 1), n).int(0, 7, 1).int(0, i + 1, i + 1)
        return c

    def stack(rank, dim):
        return lambda s: s.int(0, 13, 10).flag(True).flag(False).int(-rank - 1, rank, dim).int(1, 2, 1).int(0, 7, 1).int(0, 7, 1).int(0, 1, 0)

    def reduce(which, dims, rank=3):
        def r(s):
            s.int(0, 13, 11).int(0, 3, len(dims))
            for d in dims:
                s.flag(False).int(-rank, rank - 1, d)
            s.flag(True).int(0, 2, which)
        return r

    def matmul(s):  # [..., 3] @ [3, 2]
        s.int(0, 13, 12)
        shape(s, [3, 2], 4).int(0, 3, 1).int(0, 7, 1).int(0, 3, 1)

    seeds["chain-reshape"] = chain([2, 3, 2], ops=[reshape([3, -1]), reshape([-1])])
    seeds["chain-reshape-bad"] = chain([2, 3], ops=[reshape([-1, -1])])
    seeds["chain-permute-reshape"] = chain([2, 1, 3], ops=[permute(3), reshape([3, 2])])
    seeds["chain-transpose"] = chain([2, 1, 3], ops=[transpose(3), transpose(3)])
    seeds["chain-slice"] = chain([4, 3, 2], ops=[slice_, reshape([-1])])
    seeds["chain-narrow-select"] = chain([2, 3, 4], ops=[narrow, select(3)])
    seeds["chain-expand-huge"] = chain([2, 1, 3], ops=[expand, select(4), select(3, 0, 1), reshape([-1])])
    seeds["chain-zero-size-2^48-bytes"] = chain([0, 1 << 46], dtype="float32", ops=[permute(2), reshape([1 << 46, 0])])
    seeds["chain-unsqueeze-concat"] = chain([2, 2, 3], ops=[unsqueeze(3, 3), concat(4, 1, [2, 0])])
    seeds["chain-concat-long-zero-size"] = chain([0, 1 << 46], dtype="bool", ops=[concat(2, 1, [1 << 46])])
    seeds["chain-stack"] = chain([2, 3], ops=[stack(2, -1)])
    for which in range(3):
        seeds[f"chain-reduce-{which}"] = chain([2, 3, 2], ops=[reduce(which, [0, -1])])
    seeds["chain-max-empty"] = chain([2, 0, 3], ops=[reduce(2, [1])])
    seeds["chain-matmul"] = chain([2, 1, 3], ops=[matmul])
    seeds["chain-int64-matmul"] = chain([2, 3], dtype="int64", ops=[matmul])
    seeds["chain-too-big"] = chain([1 << 62, 0, 4], dtype="bool")
    return seeds


# ---- fuzz_layer ------------------------------------------------------------------------------

ODD = [-1, -7, -2**63, 1 << 20, 1 << 31, 1 << 40, 1 << 46, 3 << 61, 2**63 - 1]


def field(s, v):
    if 0 <= v <= 9:
        return s.int(0, 3, 1).int(0, 9, v)
    return s.int(0, 3, 0).int(0, 8, ODD.index(v))


def config(fields, bias=True, dtype=0, run=None):
    s = Seed().flag(True)
    for v in fields:
        field(s, v)
    s.flag(bias).int(0, 3, dtype).int(0, 3, 1)
    if run:  # b, q, k, then the inputs' values, then self-attention and causal
        b, q, k, cq, cc, self_, causal = run
        s.int(1, 2, b).int(1, 3, q).int(1, 3, k).reals(*values(b * q * cq))
        if cq == cc:
            s.flag(self_)
        if not self_:
            s.reals(*values(b * k * cc))
        s.flag(causal)
    return s


ENDS = [-2**63, -2**63 + 1, -2**62, -1, 0, 1, 2, 7, 2**31, 2**62, 2**63 - 2, 2**63 - 1]


def extreme(s, v):  # fuzz_layer's extreme(): one of the ends, or a small value
    if v in ENDS:
        return s.flag(True).int(0, len(ENDS) - 1, ENDS.index(v))
    return s.flag(False).int(-9, 9, v)


def integers(case, *choices):  # fuzz_layer's integers(): mode byte 2, the case, then its choices
    s = Seed().int(0, 255, 2).int(0, 4, case)
    for kind, v in choices:
        if kind == "x":
            extreme(s, v)
        elif kind == "flag":
            s.flag(v)
        else:
            s.int(kind[0], kind[1], v)
    return s


def layer_seeds():
    seeds = {}
    seeds["integers-position-offset-max"] = integers(0, ((0, 3), 2), ("x", 2**63 - 1))
    seeds["integers-position-offset-min"] = integers(0, ((0, 3), 0), ("x", -2**63))
    seeds["integers-causal-offset-max"] = integers(1, ((0, 4), 3), ((0, 4), 4), ("x", 2**63 - 1))
    seeds["integers-causal-offset-min"] = integers(1, ((0, 4), 3), ((0, 4), 4), ("x", -2**63))
    seeds["integers-schedule-ends"] = integers(2, ("x", 2**63 - 2), ("x", 2**63 - 1), ("x", 2**63 - 1))
    seeds["integers-optimizer-last-step"] = integers(3, ("x", 2**63 - 1))
    seeds["integers-generate-overflow"] = integers(4, ("x", 2**63 - 2), ("flag", True), ("x", 2**63 - 1), ("x", 4))
    seeds["integers-generate-top-k"] = integers(4, ("x", 2), ("flag", False), ("x", 2**63 - 1), ("x", 0))
    #                query heads context head value out
    seeds["config-ok"] = config([4, 2, 0, 0, 0, 0], run=(2, 3, 2, 4, 4, False, True))
    seeds["config-self"] = config([4, 2, 0, 3, 1, 5], dtype=1, run=(1, 3, 2, 4, 4, True, True))
    seeds["config-cross"] = config([2, 1, 3, 0, 2, 1], bias=False, run=(1, 2, 3, 2, 3, False, False))
    seeds["config-query-zero"] = config([0, 1, 0, 0, 0, 0])
    seeds["config-heads-negative"] = config([4, -7, 0, 0, 0, 0])
    seeds["config-context-negative"] = config([4, 1, -1, 0, 0, 0])
    seeds["config-head-dim-min"] = config([4, 1, 0, -2**63, 0, 0])
    seeds["config-value-negative"] = config([4, 1, 0, 0, -1, 0])
    seeds["config-out-negative"] = config([4, 1, 0, 0, 0, -7])
    seeds["config-int64"] = config([4, 1, 0, 0, 0, 0], dtype=2)
    seeds["config-heads-divide"] = config([5, 2, 0, 0, 0, 0])
    seeds["config-heads-overflow"] = config([4, 1 << 40, 0, 1 << 31, 0, 0])
    seeds["config-value-overflow"] = config([4, 3 << 61, 0, 1, 2**63 - 1, 0])
    seeds["config-wq-too-big"] = config([1 << 40, 1, 0, 1 << 20, 0, 0])
    seeds["config-wo-too-big"] = config([1, 1, 0, 1, 1 << 46, 1 << 20])
    seeds["config-valid-large"] = config([1 << 20, 1, 0, 1, 0, 1])

    def kv(heads, width, commands, context=0, head_dim=0, value_dim=0, out=0, float64=True):
        s = Seed().flag(False).int(1, 3, heads).int(1, 2, width).int(0, 7, 1 if not context else 0)
        if context:
            s.int(1, 4, context)
        s.int(0, 2, head_dim).int(0, 3, value_dim).int(0, 3, out).flag(True).flag(float64).int(0, 9, 3)
        s.int(1, 12, len(commands))
        for c in commands:
            c(s)
        return s

    def cmd(what, i, j=0):
        return lambda s: s.int(0, 9, what).int(0, 2, i).int(0, 2, j)

    def decode(i, b, n, width, cached=0, same_batch=True, nan=False, key_mask=None, weights=True, bias=False):
        def c(s):
            s.int(0, 9, 4).int(0, 2, i).int(0, 2, 0)
            if cached:
                s.int(0, 7, 1 if same_batch else 0)
            if not cached or not same_batch:
                s.int(1, 3, b)
            s.int(1, 3, n).reals(*values(b * n * width))
            s.int(0, 7, 0 if nan else 1)
            if nan:
                s.int(0, b * n * width - 1, 0)
            s.flag(key_mask is not None)
            if key_mask is not None:
                s.int(0, 7, 1)
                for bit in key_mask:
                    s.flag(bit)
            s.flag(False).int(0, 3, 1)  # no query mask, no attention mask
            if bias:
                s.int(0, 3, 0).flag(True).int(0, 7, 1).reals(*values(heads_of[0] * (cached + n))).flag(False)
            else:
                s.int(0, 3, 1)
            s.flag(weights)
        return c

    heads_of = [2]
    seeds["kv-steps"] = kv(2, 2, [decode(0, 1, 2, 4), decode(0, 1, 1, 4, cached=2), decode(0, 1, 3, 4, cached=3)])
    seeds["kv-copy-then-decode-both"] = kv(2, 2, [decode(0, 1, 2, 4), cmd(1, 0, 1), decode(1, 1, 1, 4, cached=2),
                                                  decode(0, 1, 1, 4, cached=2)])
    seeds["kv-copy-construct-move"] = kv(2, 2, [decode(0, 2, 1, 4), cmd(2, 0, 2), cmd(3, 2, 1), decode(1, 2, 1, 4, cached=1)])
    seeds["kv-self-copy-self-move"] = kv(2, 2, [decode(0, 1, 2, 4), cmd(1, 0, 0), cmd(3, 0, 0), decode(0, 1, 1, 4, cached=2)])
    seeds["kv-clear-new-batch"] = kv(2, 2, [decode(0, 1, 2, 4), cmd(0, 0), decode(0, 3, 1, 4)])
    seeds["kv-batch-change-refused"] = kv(2, 2, [decode(0, 1, 2, 4), decode(0, 2, 1, 4, cached=2, same_batch=False)])
    seeds["kv-key-mask-nan"] = kv(2, 2, [decode(0, 1, 2, 4, nan=True, key_mask=[False, True]),
                                         decode(0, 1, 1, 4, cached=2, key_mask=[False, True, True])])
    seeds["kv-bias"] = kv(2, 2, [decode(0, 1, 1, 4), decode(0, 1, 2, 4, cached=1, bias=True)])
    seeds["kv-short-mask"] = kv(2, 2, [decode(0, 1, 2, 4), lambda s: (s.int(0, 9, 4).int(0, 2, 0).int(0, 2, 0).int(0, 7, 1)
                                                                      .int(1, 3, 1).reals(*values(4)).int(0, 7, 1).flag(True)
                                                                      .int(0, 7, 0).int(1, 2, 1))])
    seeds["kv-cross-layer-refuses"] = kv(1, 2, [decode(0, 1, 1, 2)], context=3)
    seeds["kv-many"] = kv(3, 1, [decode(0, 2, 3, 3)] + [decode(0, 2, 3, 3, cached=3 * (i + 1)) for i in range(6)], head_dim=2,
                          value_dim=3, out=2, float64=False)
    return seeds


# ---- fuzz_masked -----------------------------------------------------------------------------

def sdpa(lead, q, k, d, dv, kind, mask_bits=(), offset=0, float64=True, both=True):
    s = Seed().flag(True).int(0, 2, len(lead))
    for x in lead:
        s.int(1, 3, x)
    s.int(1, 4, q).int(1, 4, k).int(1, 3, d).int(1, 3, dv).flag(float64).flag(both)
    for _ in range(3):  # q, k and v use the whole lead
        s.int(0, len(lead), 0)
        for _ in lead:
            s.int(0, 3, 1)
    n = 1
    for x in lead:
        n *= x
    s.reals(*values(n * q * d), *values(n * k * d, 0.5), *values(n * k * dv, 0.7))
    s.int(0, 4, kind)
    if kind == 4:
        s.int(-4, 4, offset)
    elif kind == 1:  # the mask has the whole lead too
        s.int(0, len(lead), 0)
        for _ in lead:
            s.int(0, 3, 1)
    for bit in mask_bits:
        s.int(0, 2, 0 if bit else 1)
    return s  # upstream gradients -2, and every free entry poisoned with NaN


def mha(b, q, k, h, d, dv, cq, cout, layer=False, self_=False, cc=2, key=None, query=None, causal=False, offset=0, bias=None):
    s = Seed().flag(False).int(1, 2, b).int(1, 3, q).int(1, 3, k).int(1, 2, h).int(1, 2, d).int(1, 2, dv).int(1, 3, cq).int(1, 3, cout)
    s.flag(layer)
    if layer:
        s.flag(self_)
    if not self_:
        s.int(1, 3, cc)
    s.flag(True)  # float64
    for m in (key, query):
        s.int(0, 3, 1 if m is not None else 0)
        for bit in m or ():
            s.int(0, 2, 0 if bit else 1)
    s.flag(False).flag(causal).int(-3, 3, offset)
    s.flag(bias is not None)
    if bias == "full":
        s.flag(True)
    elif bias == "heads":
        s.flag(False).flag(True)
    elif bias == "pairs":
        s.flag(False).flag(False)
    return s  # values, poison choices, upstream gradients and parameters: defaults (every free entry NaN)


def masked_seeds():
    seeds = {}
    seeds["sdpa-causal-offset"] = sdpa([], 3, 3, 2, 2, 4, offset=-1)
    seeds["sdpa-rows"] = sdpa([2], 3, 2, 2, 1, 2, mask_bits=[True, False, True])
    seeds["sdpa-keys"] = sdpa([], 2, 4, 1, 2, 3, mask_bits=[True, False, False, True])
    seeds["sdpa-lead-mask"] = sdpa([2, 1], 2, 3, 2, 2, 1, mask_bits=[True, False, False, False, False, False] * 2, float64=False)
    seeds["mha-key-query"] = mha(2, 3, 3, 2, 1, 2, 2, 2, key=[True, False, True, False, True, True], query=[False, True, True, True, False, True])
    seeds["mha-causal-bias"] = mha(1, 3, 3, 2, 2, 1, 2, 1, causal=True, offset=-2, bias="full")
    seeds["mha-bias-heads"] = mha(1, 2, 3, 2, 1, 1, 1, 2, key=[False, True, True], bias="heads")
    seeds["mha-bias-pairs"] = mha(2, 2, 2, 1, 2, 2, 3, 1, query=[True, False, False, True], bias="pairs")
    seeds["layer-cross-padding"] = mha(2, 2, 3, 2, 1, 1, 2, 2, layer=True, key=[True, True, False, True, False, False])
    seeds["layer-self-padding"] = mha(1, 3, 3, 1, 2, 2, 3, 3, layer=True, self_=True, key=[True, False, True], query=[True, False, True])
    return seeds


# ---- fuzz_checkpoint: a raw file, or a fragment repeated between a prefix and a suffix ----

class Raw:  # the whole input is the file, then the mode flag (read from the end)
    def __init__(self, file):
        self.file = file

    def data(self):
        return self.file + bytes([0])


def safetensors(header, data=b""):
    h = header.encode()
    return len(h).to_bytes(8, "little") + h + data


def escaped(text):  # ConsumeRandomLengthString's form: backslashes doubled, then a terminator
    return text.replace("\\", "\\\\").encode() + b"\\X"


class Repeated:
    def __init__(self, count, size, prefix, suffix, fragment):
        self.front = escaped(prefix) + escaped(suffix) + fragment.encode()
        self.tail = Seed().flag(True).int(0, 20000, count).int(0, 16, size)

    def data(self):
        return self.front + self.tail.data()


def checkpoint_seeds():
    entry = '"t%i":{"dtype":"F32","shape":[1],"data_offsets":[%b,%e]},'
    last = '"end":{"dtype":"BOOL","shape":[0],"data_offsets":[0,0]}}'
    return {
        "valid": Raw(safetensors('{"__metadata__":{"step":"3"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', bytes(8))),
        "bools-and-ids": Raw(safetensors('{"m":{"dtype":"BOOL","shape":[2],"data_offsets":[8,10]},'
                                         '"i":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}', bytes(8) + bytes([1, 0]))),
        "many-tensors": Repeated(20000, 4, "{", last, entry),
        "many-keys-in-one-entry": Repeated(20000, 0, '{"a":{', '"dtype":"F32"}}', '"k%i":1,'),
        "long-shape": Repeated(20000, 0, '{"a":{"dtype":"F32","data_offsets":[0,0],"shape":[', "0]}}", "1,"),
        "many-metadata": Repeated(20000, 0, '{"__metadata__":{', '"z":"z"}}', '"k%i":"v",'),
        "duplicate-late": Repeated(20000, 4, "{", '"t7":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}', entry),
    }


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "fuzz/corpus"
    for target, seeds in (("tape", tape_seeds()), ("shapes", shape_seeds()), ("layer", layer_seeds()), ("masked", masked_seeds()),
                          ("checkpoint", checkpoint_seeds())):
        os.makedirs(os.path.join(out, target), exist_ok=True)
        for name, seed in seeds.items():
            with open(os.path.join(out, target, f"seed-{name}"), "wb") as f:
                f.write(seed.data())
        print(f"{target}: {len(seeds)} seeds")


if __name__ == "__main__":
    main()
