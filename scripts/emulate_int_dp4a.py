#!/usr/bin/env python3
"""scripts/emulate_int_dp4a.py: src/backend/cuda/matmul_dp4a.cuh and
matmul.cu's dp_kernel replayed thread by thread on the CPU, for checking a
change to them without a GPU.

The replay builds x's stage byte for byte as stage_int_x writes it (chunks
of levels with their 16-byte skew, then d, then the 16-sums) from
quantize_act's stored form (scripts/emulate_int_mma.py's, levels
interleaved per 4 elements, U4's even/odd order), and each thread (row
t % 8, slices t / 8, ...) loads its 64-byte chunks as dp_fetch does and sums
them as dp_chunk does: dp4a on the stored words, then int_chunk's FMAs.
The reference is int_chunk's arithmetic written from the elements
themselves (each group's exact integer sum from x's two levels per element,
folded per slice in k order, the slices then added in order), with none of
the kernel's bookkeeping. The two must agree bit for bit, and both within
1e-5 of sum |w x| of the float64 product; a wrong offset or word misses by
0.1 or more (try one). It models the kernel, it does not run it: keep the
two in step, and the GPU tests (tests/gpu/test_cuda_int.cpp) decide.
Run: .venv/bin/python scripts/emulate_int_dp4a.py
"""
import numpy as np

from emulate_int_mma import quantize_act

rng = np.random.default_rng(7)
f32 = np.float32


def fma(a, b, c):
    # one rounding of a b + c (a b is exact in float64; the sum's rounding
    # there is as good as one for these magnitudes, and both sides share it)
    return f32(float(a) * float(b) + float(c))


def s8(u):
    u = int(u) & 0xFF
    return u - 256 if u >= 128 else u


def dp4a(a, b, c):
    return c + sum(s8(a >> (8 * i)) * s8(b >> (8 * i)) for i in range(4))


def word(bs, at):
    return int(bs[at]) | int(bs[at + 1]) << 8 | int(bs[at + 2]) << 16 | int(bs[at + 3]) << 24


def stored_pos(e, nibbles):
    w = e & 7
    return (e & ~7) + (w & 1) * 4 + (w >> 1) if nibbles else e


def run(fmt, G, has_min, min8, M, n_in, n_out, kw, NT=1):
    nib = fmt == 'U4'
    E = 32 if nib else 16
    KC = 4 * E
    k_pad = (n_in + KC - 1) // KC * KC
    n_chunks = k_pad // KC
    NG = KC // G
    qv = rng.integers(0, 16, (n_out, k_pad)) if nib else rng.integers(-128, 128, (n_out, k_pad))
    qv[:, n_in:] = 0
    scale = rng.uniform(0.01, 0.1, (n_out, k_pad // G)).astype(f32)
    mn = rng.uniform(-0.5, 0.5, (n_out, k_pad // G)).astype(f32) if has_min else None
    rows = [bytes(((qv[o, 2 * b] & 15) | ((qv[o, 2 * b + 1] & 15) << 4)) for b in range(k_pad // 2))
            if nib else bytes(int(v) & 0xFF for v in qv[o]) for o in range(n_out)]
    x = rng.standard_normal((M, n_in)).astype(f32)
    x[0, 3] = 0.0
    xq, xd, xs, xhat = quantize_act(x, k_pad, nib)

    # ---- the reference: int_chunk's arithmetic, from the elements
    def levels(m, e):
        p = stored_pos(e, nib)
        at = (p // 4) * 8 + p % 4
        return s8(xq[m, at]), s8(xq[m, at + 4])

    want = np.zeros((M, n_out), f32)
    for m in range(M):
        lv = [levels(m, e) for e in range(k_pad)]
        for o in range(n_out):
            parts = []
            for w in range(kw):
                acc = f32(0)
                for ch in range(w, n_chunks, kw):
                    for q in range(NG):
                        grp = range(ch * KC + q * G, ch * KC + q * G + G)
                        c1 = sum(int(qv[o, e]) * lv[e][0] for e in grp)
                        c2 = sum(int(qv[o, e]) * lv[e][1] for e in grp)
                        xsum = sum(256 * lv[e][0] + lv[e][1] for e in grp)
                        b16 = (ch * KC + q * G) // 16
                        assert xsum == sum(int(xs[m, b16 + i]) for i in range(G // 16))
                        s = c1 * 256 + c2 - (8 * xsum if min8 else 0)
                        gi = ch * NG + q
                        d = xd[m, (ch * KC + q * G) // 32]
                        acc = fma(f32(s), f32(d * scale[o, gi]), acc)
                        if has_min:
                            acc = fma(-mn[o, gi], f32(f32(xsum) * d), acc)
                parts.append(acc)
            tot = parts[0]
            for v in parts[1:]:
                tot = f32(tot + v)
            want[m, o] = tot

    # ---- the kernel: stage_int_x's bytes, then every thread of every CTA
    chunk_bytes = 2 * KC + 16
    row_bytes = n_chunks * chunk_bytes
    stage_q = np.zeros(M * row_bytes, np.uint8)
    flat = xq.reshape(-1)  # rows k_pad apart: the pieces of all rows in order
    for i in range(len(flat) // 16):
        ch, piece = divmod(i, 2 * KC // 16)
        stage_q[ch * chunk_bytes + 16 * piece: ch * chunk_bytes + 16 * piece + 16] = flat[16 * i: 16 * i + 16]
    stage_d = xd.reshape(-1)
    stage_s = xs.reshape(-1)
    got = np.zeros((M, n_out), f32)
    TC = 8 * NT  # rows a CTA (NT 8-row tiles)
    n_threads = max(TC * kw, 32)
    n_threads = (n_threads + 31) // 32 * 32
    for tile in range((n_out + TC - 1) // TC):
        red = np.zeros((kw, 16, TC), f32)
        for t in range(n_threads):
            rc = t % TC
            row = tile * TC + rc
            w = t // TC  # the thread's slice (a thread a row and slice; those past kw idle)
            if w < kw:
                acc = [f32(0)] * 4
                for ch in range(w, n_chunks, kw):
                    # dp_fetch: 64 bytes of the row, the chunk's NG scales (mins)
                    if row < n_out:
                        raw = rows[row][ch * 64: ch * 64 + 64]
                        wq = [word(raw, 4 * i) for i in range(16)]
                        gi = ch * NG
                        sc = list(scale[row, gi:gi + NG])
                        mm = list(mn[row, gi:gi + NG]) if has_min else [f32(0)] * NG
                    else:
                        wq, sc, mm = [0] * 16, [f32(0)] * NG, [f32(0)] * NG
                    # dp_chunk
                    for m in range(M):
                        xb = m * row_bytes + ch * chunk_bytes
                        dx = stage_d[m * (k_pad // 32) + ch * (KC // 32):]
                        s16 = stage_s[m * (k_pad // 16) + ch * (KC // 16):]
                        for g in range(NG):
                            c1 = c2 = 0
                            for v in range(G // 8):
                                e = g * G + 8 * v
                                X = [word(stage_q, xb + 16 * (e // 8) + 4 * i) for i in range(4)]
                                if nib:
                                    w0 = wq[e // 8] & 0x0F0F0F0F
                                    w1 = (wq[e // 8] >> 4) & 0x0F0F0F0F
                                else:
                                    w0, w1 = wq[e // 4], wq[e // 4 + 1]
                                c1 = dp4a(w0, X[0], c1)
                                c2 = dp4a(w0, X[1], c2)
                                c1 = dp4a(w1, X[2], c1)
                                c2 = dp4a(w1, X[3], c2)
                            x16 = int(s16[g]) if G == 16 else int(s16[2 * g]) + int(s16[2 * g + 1])
                            s = c1 * 256 + c2 - (8 * x16 if min8 else 0)
                            d = dx[g // 2 if G == 16 else g]
                            acc[m] = fma(f32(s), f32(d * sc[g]), acc[m])
                            if has_min:
                                acc[m] = fma(-mm[g], f32(f32(x16) * d), acc[m])
                for m in range(M):
                    red[w, m, rc] = acc[m]
        # mm_epilogue: the slices in order
        for m in range(M):
            for rc in range(TC):
                col = tile * TC + rc
                if col >= n_out:
                    continue
                tot = red[0, m, rc]
                for w in range(1, kw):
                    tot = f32(tot + red[w, m, rc])
                got[m, col] = tot

    same = np.array_equal(want.view(np.uint32), got.view(np.uint32))
    wdeq = np.array([[float(f32(f32(qv[o, k] * scale[o, k // G]) -
                                (mn[o, k // G] if has_min else (f32(8 * scale[o, k // G]) if min8 else 0))))
                      for k in range(k_pad)] for o in range(n_out)])
    worst = max(abs(float(got[m, o]) - wdeq[o] @ xhat[m]) / np.abs(wdeq[o] * xhat[m]).sum()
                for m in range(M) for o in range(n_out))
    kind = 'min8' if min8 else 'min' if has_min else ''
    print(f'{fmt} G{G} {kind:4} M {M} n_in {n_in} n_out {n_out} kw {kw} NT {NT}: '
          f'bits {"equal" if same else "DIFFER"}, worst vs float64 {worst:.2e}')
    assert same, 'the kernel replay differs from int_chunk\'s sums'
    assert worst < 1e-5, worst


if __name__ == '__main__':
    run('I8', 32, False, False, M=1, n_in=256, n_out=13, kw=4)       # Q8_0
    run('I8', 32, True, False, M=3, n_in=200, n_out=8, kw=5)         # Q5_1 (a part chunk)
    run('I8', 16, False, False, M=4, n_in=320, n_out=9, kw=4)        # Q6_K
    run('I8', 16, True, False, M=2, n_in=256, n_out=8, kw=6)         # Q2_K
    run('U4', 32, False, True, M=1, n_in=512, n_out=11, kw=4)        # Q4_0
    run('U4', 32, True, False, M=4, n_in=384, n_out=8, kw=4)         # Q4_1, Q4_K
    run('U4', 32, False, True, M=3, n_in=200, n_out=5, kw=7)         # Q4_0, kw past the chunks
    run('I8', 32, False, False, M=2, n_in=256, n_out=45, kw=4, NT=4)  # a tall one's CTAs of 4 tiles
    run('U4', 32, True, False, M=1, n_in=256, n_out=40, kw=5, NT=4)
