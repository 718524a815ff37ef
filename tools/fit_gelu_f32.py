#!/usr/bin/env python3
"""Fits the coefficient tables of kernels/gelu_f32.cpp (python3 with mpmath; prints C++).

P(r) ~ e^r / sqrt(2 pi) on |r| <= ln 2 / 2, and the Mills ratio M(a) = Phi(-a) / phi(a) on the
16 intervals of a = |x| indexed by bits(a + 1) >> 21 (mod 16), each as a degree-6 polynomial
(M in a - c, c the interval's centre). Relative least squares on Chebyshev nodes, 40 digits;
the coefficients are rounded to float one at a time from the constant term up and the rest
refitted after each rounding. Prints each fit's worst relative error (on stderr) and the tables.
"""
import struct
import sys

import mpmath as mp

mp.mp.dps = 40
K = 1 / mp.sqrt(2 * mp.pi)
DEG = 6


def f32(v):
    return struct.unpack('f', struct.pack('f', float(v)))[0]


def mills(a):
    return mp.erfc(a / mp.sqrt(2)) / 2 * mp.exp(a * a / 2) / K


def fit_rounded(fn, lo, hi, c, nodes=48):
    xs = [(lo + hi) / 2 + (hi - lo) / 2 * mp.cos(mp.pi * (k + 0.5) / nodes) for k in range(nodes)]
    ys = [fn(x) for x in xs]
    fixed = []
    while len(fixed) <= DEG:
        nf = len(fixed)
        A = mp.matrix(nodes, DEG + 1 - nf)
        b = mp.matrix(nodes, 1)
        for i, x in enumerate(xs):
            t, w = x - c, 1 / ys[i]
            for j in range(DEG + 1 - nf):
                A[i, j] = t ** (nf + j) * w
            b[i] = (ys[i] - sum(fixed[j] * t ** j for j in range(nf))) * w
        fixed.append(mp.mpf(f32(mp.qr_solve(A, b)[0][0])))
    return [f32(v) for v in fixed]


def worst(fn, lo, hi, c, coef, steps=300):
    e = 0
    for k in range(steps + 1):
        x = lo + (hi - lo) * mp.mpf(k) / steps
        p = 0
        for cj in reversed(coef):
            p = p * (x - c) + cj
        e = max(e, abs(p / fn(x) - 1))
    return e


def literal(v):
    for digits in range(6, 12):
        s = '%.*g' % (digits, v)
        if f32(float(s)) == f32(v):
            break
    return s + ('' if 'e' in s or '.' in s else '.0') + 'f'


def main():
    eps = mp.mpf('1e-6')  # a + 1 is rounded: each interval is fitted a little wider
    rr = mp.log(2) / 2 + eps
    exp_coef = fit_rounded(lambda r: K * mp.exp(r), -rr, rr, 0)
    print('P', mp.nstr(worst(lambda r: K * mp.exp(r), -rr, rr, 0, exp_coef), 3), file=sys.stderr)
    table = [None] * 16
    for e in range(4):
        for s in range(4):
            lo = 2 ** e * (1 + mp.mpf(s) / 4) - 1
            hi = 2 ** e * (1 + mp.mpf(s + 1) / 4) - 1
            c = (lo + hi) / 2
            lo, hi = max(lo - eps, 0), min(hi + eps, mp.mpf(14.8) + eps)
            coef = fit_rounded(mills, lo, hi, c)
            print('M on [%g, %g]' % (lo, hi), mp.nstr(worst(mills, lo, hi, c, coef, 100), 3), file=sys.stderr)
            table[(4 * e + s + 12) % 16] = (float(c), coef)
    print('kExp[7] = {%s};' % ', '.join(literal(v) for v in exp_coef))
    print('kCentre[16] = {%s};' % ', '.join(literal(c) for c, _ in table))
    print('kMills[7][16] = {')
    for j in range(DEG + 1):
        print('    {%s},' % ', '.join(literal(coef[j]) for _, coef in table))
    print('};')


if __name__ == '__main__':
    main()
