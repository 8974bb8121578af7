#!/usr/bin/env python3
"""scripts/emulate_tiled_stage.py: the tiled (prefill) kernel's stage (src/backend/cuda/
matmul_tiled.cu) replayed on the CPU, for checking its layout without a GPU. Two
parts, both since session 61:

1. Group values (Stage, stage_rows, load_chunk's groups, staged_b, the integer
   products' cols and xs): a chunk's stage holds, beside x's and the weights'
   tiles, each weight's group scales and mins of the chunk (4 floats a row) and,
   for integer products, x's block scales d and 16-sums s of the chunk, all
   copied by stage_rows (8-byte cp.async, zeros past the valid rows and units).
   Every thread's copies of every chunk go into a dictionary of shared-memory
   words (each word names the global value it holds), then every lane's reads,
   addressed as the kernel does, must find the value the kernel read from global
   memory before (group_index's scale and min; int_chunk's cols.off + ch NG,
   xr.d + ch N32, xr.s + ch 2 N32), or zero where it belonged to a row past n_out
   or M (dropped outputs). Copies stay inside their region and inside the chunk's
   values of their row; vector reads are aligned.
2. bf16 products' x in quads (to_bf16_kernel, quad_offset, load_chunk's pair
   rows, the steps' 16-byte loads): to_bf16_kernel's words, the CTA's cp.async
   copies of pair rows into the swizzled stage, then each lane's load of each
   mma step must be the A registers (row g's pair 2 st, row g + 8's, row g's
   pair 2 st + 1, row g + 8's, of the lane's E elements), zeros for rows past M;
   and each load's quarter warps must touch 8 distinct 16-byte segments of 128
   bytes (no bank conflicts).
4. The ring (mm_tiled_kernel's loop, with and without PRE): cp.async groups,
   wait_group counts, barriers, stage slots and decoded buffers, for every
   chunk count up to 3 NS: each read of a slot or buffer (the mma's chunk, PRE's
   decode of the next) finds the chunk it wants, its copies complete and behind
   a barrier, and no copy or decode writes what another read of the same phase
   (between two barriers) uses.
3. Weights decoded once a CTA (PRE: decode_chunk, decoded_b, dq_offset): each
   thread's lane loads u = t + i NTHR (weight u / 4 BN, row (u / 4) % BN, lane
   u % 4) decode into the bf16 tile, then every mma lane's loads of its E / 2
   words must find the words its own decode would have made (weight a, its row,
   its lane c), every word written once, and the stores and loads of each
   quarter warp must touch distinct segments.

It models the kernel, it does not run it: keep the two in step; the GPU tests
CudaMatmulTiled.* (the tiled kernel against the decode kernel, bit for bit)
decide. Run: python3 scripts/emulate_tiled_stage.py
"""
import itertools
import sys

E_OF = {"i8": 16, "u4": 32}


def layout(fmt, WM, WN, MT, NT, gated, IG):
    KC = 4 * E_OF[fmt]
    BM, BN, NACC = 16 * MT * WM, 8 * NT * WN, 2 if gated else 1
    N32 = KC // 32
    A_BYTES, B_BYTES = BM * 2 * KC, BN * 64
    G_ROW, G_BYTES = 16, BN * 16
    SCALE = A_BYTES + NACC * B_BYTES
    MIN = SCALE + NACC * G_BYTES
    XD_ROW, XS_ROW = 4 * N32, 8 * N32
    XD = MIN + NACC * G_BYTES
    XS = XD + (BM * XD_ROW if IG else 0)
    CHUNK = XS + (BM * XS_ROW if IG else 0)
    return dict(KC=KC, BM=BM, BN=BN, NACC=NACC, N32=N32, G_ROW=G_ROW, G_BYTES=G_BYTES,
                SCALE=SCALE, MIN=MIN, XD=XD, XS=XS, XD_ROW=XD_ROW, XS_ROW=XS_ROW, CHUNK=CHUNK)


def stage_rows(smem, dst, rows, units, nthr, src, pitch, n_ok, units_ok, lo, hi, row_len):
    """stage_rows<ROWS, UNITS, NTHR>: src(i) names global value i (floats) past the
    chunk's first value of the first row, whose values end row_len later (a read past
    that would belong to the next chunk, or past the array's end on its last row)."""
    for tid in range(nthr):
        for i in range((rows * units + nthr - 1) // nthr):
            u = tid + i * nthr
            if u >= rows * units:
                break
            r, part = u // units, u % units
            ok = r < n_ok and part < units_ok
            assert not ok or 2 * part + 2 <= row_len, "a copy past the chunk's values"
            at = dst + 8 * u
            assert lo <= at and at + 8 <= hi, "copy outside its region"
            for w in range(2):
                smem[at + 4 * w] = src(r * pitch + 2 * part + w) if ok else 0


def check(fmt, group, WM, WN, MT, NT, gated, IG, k_pad, n_out, n0, M, m0, has_min):
    L = layout(fmt, WM, WN, MT, NT, gated, IG)
    KC, BM, BN, N32 = L["KC"], L["BM"], L["BN"], L["N32"]
    E, nthr = E_OF[fmt], WM * WN * 32
    shift = group.bit_length() - 1
    n_groups = KC >> shift
    pitch = k_pad >> shift
    n_checked = 0
    for ch in range(k_pad // KC):
        smem = {}
        at = n0 * pitch + ch * n_groups
        for a in range(L["NACC"]):
            for kind, base in (("scale", L["SCALE"]), ("min", L["MIN"])):
                if kind == "min" and not has_min:
                    continue
                dst = base + a * L["G_BYTES"]
                stage_rows(smem, dst, BN, L["G_ROW"] // 8, nthr,
                           lambda i, a=a, kind=kind: (kind, a, at + i), pitch, n_out - n0,
                           n_groups // 2, dst, dst + L["G_BYTES"], n_groups)
        if IG:
            xd_at = m0 * (k_pad // 32) + ch * N32
            stage_rows(smem, L["XD"], BM, L["XD_ROW"] // 8, nthr, lambda i: ("d", xd_at + i),
                       k_pad // 32, M - m0, L["XD_ROW"] // 8, L["XD"], L["XS"], N32)
            xs_at = m0 * (k_pad // 16) + ch * 2 * N32
            stage_rows(smem, L["XS"], BM, L["XS_ROW"] // 8, nthr, lambda i: ("s", xs_at + i),
                       k_pad // 16, M - m0, L["XS_ROW"] // 8, L["XS"], L["CHUNK"], 2 * N32)

        def read(byte, n, want):
            nonlocal n_checked
            assert byte % (4 * n) == 0 or n == 1, "misaligned vector read"
            for i in range(n):
                got = smem.get(byte + 4 * i, "unwritten")
                assert got == want(i), (fmt, group, ch, byte, i, got, want(i))
                n_checked += 1

        for warp, lane in itertools.product(range(WM * WN), range(32)):
            wm, wn, g, c = warp // WN, warp % WN, lane >> 2, lane & 3
            for a, nt in itertools.product(range(L["NACC"]), range(NT)):
                if not IG:  # staged_b: the lane's group of its row
                    row = wn * 8 * NT + 8 * nt + g
                    gq = (E * c) >> shift
                    byte = row * L["G_ROW"] + 4 * gq
                    valid = n0 + row < n_out
                    gi = (n0 + row) * pitch + (ch * KC + E * c >> shift)
                    read(L["SCALE"] + a * L["G_BYTES"] + byte, 1,
                         lambda i: ("scale", a, gi) if valid else 0)
                    if has_min:
                        read(L["MIN"] + a * L["G_BYTES"] + byte, 1,
                             lambda i: ("min", a, gi) if valid else 0)
                    continue
                NG = KC // IG
                for jc in range(2):  # int_chunk: cols.off[nt][jc] + ch NG, ch = 0
                    row = wn * 8 * NT + 8 * nt + 2 * c + jc
                    valid = n0 + row < n_out
                    off = row * (L["G_ROW"] // 4)
                    first = (n0 + row) * pitch + ch * NG
                    read(L["SCALE"] + a * L["G_BYTES"] + 4 * off, NG,
                         lambda i: ("scale", a, first + i) if valid else 0)
                    if has_min:
                        read(L["MIN"] + a * L["G_BYTES"] + 4 * off, NG,
                             lambda i: ("min", a, first + i) if valid else 0)
            if IG:
                for mt, h in itertools.product(range(MT), range(2)):
                    r = wm * 16 * MT + 16 * mt + g + 8 * h
                    valid = m0 + r < M
                    d0 = (m0 + r) * (k_pad // 32) + ch * N32
                    read(L["XD"] + r * L["XD_ROW"], N32, lambda i: ("d", d0 + i) if valid else 0)
                    s0 = (m0 + r) * (k_pad // 16) + ch * 2 * N32
                    for i4 in range(0, 2 * N32, 4):
                        read(L["XS"] + r * L["XS_ROW"] + 4 * i4, 4,
                             lambda i: ("s", s0 + i4 + i) if valid else 0)
    return n_checked


def quad_rows(M):
    return (M + 15) // 16 * 16 if M > 0 else 0


def seg_swizzle(lane_bytes, row, o):
    """Byte o of a row whose lanes c read lane_bytes each at lane_bytes c + 16 j."""
    odd = row & 1
    if lane_bytes == 32:
        return o ^ (16 * odd)
    if lane_bytes == 64:
        return o ^ (16 * (((o >> 7) & 1) | (odd << 1)))
    return o ^ (16 * (((o >> 7) & 3) | (odd << 2)))


def quad_offset(E, pair_row, o):
    return seg_swizzle(4 * E, pair_row, o)


def distinct_segments(addrs):
    """Whether a quarter warp's 16-byte accesses hit 8 distinct segments of 128 bytes."""
    segs = [(b // 16) % 8 for b in addrs]
    return len(set(segs)) == len(segs)


def check_quads(E, WM, WN, MT, k_pad, M, m0):
    """to_bf16_kernel's words, one CTA's copies of x (tile rows m0 ..) and its
    lanes' step loads, for every chunk."""
    KC, NTHR, BM = 4 * E, WM * WN * 32, 16 * MT * WM
    A_ROW = 2 * KC
    A_UNIT, A_UNITS = 2 * A_ROW, BM // 2
    AV = A_UNIT // 16
    A_STEP = NTHR // AV
    N_ACP = A_UNITS // A_STEP
    assert NTHR % AV == 0 and A_UNITS % A_STEP == 0
    n_words = quad_rows(M) * (k_pad // 2)
    xb = []
    for i in range(n_words):  # to_bf16_kernel
        pair_row, w = divmod(i, k_pad)
        r = pair_row // 8 * 16 + pair_row % 8 + 8 * (w % 2)
        xb.append(("x", r, w // 2) if r < M else 0)
    n_reads = 0
    for ch in range(k_pad // KC):
        smem = {}
        for t in range(NTHR):  # load_chunk's A copies
            a_row, a_part = divmod(t, AV)
            for i in range(N_ACP):
                row = a_row + i * A_STEP
                ok = m0 + 16 * (row // 8) < M
                src = (m0 // 2 + a_row) * 4 * k_pad + 16 * a_part + i * A_STEP * 4 * k_pad \
                    + ch * A_UNIT
                dst = row * A_UNIT + quad_offset(E, row, 16 * a_part)
                assert row * A_UNIT <= dst < (row + 1) * A_UNIT
                if ok:
                    assert src + 16 <= 4 * n_words, "a copy past x's quads"
                for j in range(4):
                    assert dst + 4 * j not in smem, "two copies to one word"
                    smem[dst + 4 * j] = xb[src // 4 + j] if ok else 0
        for warp, st in itertools.product(range(WM * WN), range(E // 4)):
            wm = warp // WN
            for mt in range(MT):
                segs = {}
                for lane in range(32):
                    g, c = lane >> 2, lane & 3
                    pr = wm * 8 * MT + 8 * mt + g
                    byte = pr * A_UNIT + quad_offset(E, pr, 4 * E * c + 16 * st)
                    assert byte % 16 == 0
                    got = [smem.get(byte + 4 * j, "unwritten") for j in range(4)]
                    r = m0 + wm * 16 * MT + 16 * mt + g
                    P = ch * KC // 2 + E * c // 2 + 2 * st
                    want = [("x", rr, pp) if rr < M else 0
                            for pp in (P, P + 1) for rr in (r, r + 8)]
                    assert got == want, (E, WM, WN, MT, M, ch, warp, lane, st, got, want)
                    n_reads += 1
                    segs.setdefault(lane // 8, {})[byte] = None
                for q, addrs in segs.items():  # a quarter warp: distinct segments of 128 B
                    assert distinct_segments(addrs), ("bank conflict", E, st, mt, q, sorted(addrs))
    return n_reads



def check_predecode(E, WM, WN, NT, NACC):
    KC, NTHR, BN = 4 * E, WM * WN * 32, 8 * NT * WN
    D_ROW = 2 * KC
    D_W = BN * D_ROW
    UNITS = NACC * BN * 4
    smem = {}
    for i in range((UNITS + NTHR - 1) // NTHR):
        segs = {}
        for t in range(NTHR):
            u = t + i * NTHR
            if u >= UNITS:
                break
            a, row, cu = u // (4 * BN), (u // 4) % BN, u % 4
            for v in range(E // 8):
                byte = a * D_W + row * D_ROW + seg_swizzle(2 * E, row, 2 * E * cu + 16 * v)
                assert a * D_W + row * D_ROW <= byte < a * D_W + (row + 1) * D_ROW
                for j in range(4):
                    assert byte + 4 * j not in smem, "two stores to one word"
                    smem[byte + 4 * j] = (a, row, cu, 4 * v + j)
                segs.setdefault((v, t // 8), []).append(byte)
        for (v, q), addrs in segs.items():
            assert distinct_segments(addrs), ("store bank conflict", E, v, q, addrs)
    assert len(smem) == NACC * D_W // 4, "a word not written"
    n = 0
    for warp, a, nt, v in itertools.product(range(WM * WN), range(NACC), range(NT),
                                            range(E // 8)):
        wn = warp % WN
        segs = {}
        for lane in range(32):
            g, c = lane >> 2, lane & 3
            row = wn * 8 * NT + 8 * nt + g
            byte = a * D_W + row * D_ROW + seg_swizzle(2 * E, row, 2 * E * c + 16 * v)
            got = [smem[byte + 4 * j] for j in range(4)]
            assert got == [(a, row, c, 4 * v + j) for j in range(4)], (E, warp, lane, got)
            segs.setdefault(lane // 8, {})[byte] = None
            n += 1
        for q, addrs in segs.items():
            assert distinct_segments(addrs), ("load bank conflict", E, v, q, sorted(addrs))
    return n


def check_ring(NS, PRE, n_chunks):
    """Replays the loop's events in order (every thread runs the same ones)."""
    groups = []        # per commit: the (slot, chunk) copies in it
    slot = {}          # slot -> (chunk, group index) of the last copies issued
    done = -1          # groups complete by the last wait
    visible = -1       # groups complete and behind a barrier
    dbuf = {}          # buffer -> (chunk, phase written)
    phase = 0
    writes = []        # this phase's writes: ("slot", s) or ("dbuf", b)
    reads = []
    state = {"ld": 0}

    def load_stage(sl):
        c = state["ld"]
        copies = []
        if c < n_chunks:
            copies.append((sl, c))
            slot[sl] = (c, len(groups))
            state["ld"] += 1
            writes.append(("slot", sl))
        groups.append(copies)

    def wait(n):
        nonlocal done
        done = max(done, len(groups) - 1 - n)

    def barrier():
        nonlocal visible, phase, writes, reads
        for w in writes:
            assert w not in reads, ("a write and a read of one phase", NS, PRE, n_chunks, w)
        visible = done
        phase += 1
        writes, reads = [], []

    def read_slot(sl, c):
        got, g = slot.get(sl, (None, None))
        assert got == c, ("slot holds another chunk", NS, PRE, n_chunks, sl, c, got)
        assert g <= visible, ("copies not landed or not behind a barrier", NS, PRE, n_chunks, c)
        reads.append(("slot", sl))

    def decode(c):
        read_slot(c % NS, c)
        dbuf[c & 1] = (c, phase)
        writes.append(("dbuf", c & 1))

    for st in range(NS - 1):
        load_stage(st)
    if PRE:
        wait(NS - 2)
        barrier()
        decode(0)
    for it in range(n_chunks):
        wait(NS - 3 if PRE else NS - 2)
        barrier()
        load_stage((it + NS - 1) % NS)
        if PRE and it + 1 < n_chunks:
            decode(it + 1)
        read_slot(it % NS, it)  # x's tile (and the weights' without PRE)
        if PRE:
            got, ph = dbuf.get(it & 1, (None, None))
            assert got == it and ph < phase, ("decoded chunk missing", NS, it, got)
            reads.append(("dbuf", it & 1))
    barrier()
    return n_chunks


def main():
    # dispatch_tile's shapes, and more: (fmt, WM, WN, MT, NT, gated, IG)
    shapes = []
    for fmt in ("i8", "u4"):
        for gated in (False, True):
            NT = 2 if gated or fmt == "u4" else 4
            for WM, WN in ((2, 4), (2, 2), (1, 2), (1, 1)):
                shapes.append((fmt, WM, WN, 4, NT, gated, 0))
                shapes.append((fmt, WM, WN, 2, NT, gated, 0))
                MTi = 1 if fmt == "u4" and gated else 2
                for IG in ((32,) if fmt == "u4" else (32, 16)):
                    shapes.append((fmt, WM, WN, MTi, NT, gated, IG))
            if NT == 4:
                shapes.append((fmt, 2, 4, 4, 2, gated, 0))
    total = 0
    for fmt, WM, WN, MT, NT, gated, IG in shapes:
        groups = (IG,) if IG else ((32, 16) if fmt == "i8" else (32,))
        KC = 4 * E_OF[fmt]
        BN, BM = 8 * NT * WN, 16 * MT * WM
        for group in groups:
            for has_min in (False, True):
                # a whole tile, and the last tile of a weight / of x with rows past the end
                for n_out, n0, M, m0 in ((2 * BN, BN, 2 * BM, BM), (BN + 5, BN, BM + 9, BM),
                                         (BN - 3, 0, 3, 0)):
                    total += check(fmt, group, WM, WN, MT, NT, gated, IG, 3 * KC, n_out, n0, M,
                                   m0, has_min)
    print(f"groups ok: {len(shapes)} tile shapes, {total} reads, each the value the kernel "
          "read from global memory before (zero past n_out / M)")
    # bf16 products' shapes (dispatch_tile, IG 0): E 8 (16-bit weights), 16 (8-bit), 32 (4-bit)
    total, n_shapes = 0, 0
    for E in (8, 16, 32):
        for (WM, WN), MT in itertools.product(((2, 4), (2, 2), (1, 2), (1, 1)), (4, 2)):
            n_shapes += 1
            BM = 16 * MT * WM
            for M, m0 in ((2 * BM, BM), (BM + 9, BM), (3, 0), (BM + 17, BM)):
                total += check_quads(E, WM, WN, MT, 3 * 4 * E, M, m0)
    print(f"quads ok: {n_shapes} tile shapes, {total} step loads, each the mma's A registers, "
          "no bank conflicts")
    # PRE (launch: two warps a column of tiles; 8-bit plain and gated, 4-bit plain)
    total, n_shapes = 0, 0
    for E, NT, NACC in ((16, 4, 1), (16, 2, 1), (16, 2, 2), (32, 2, 1)):
        for WN in (4, 2):
            n_shapes += 1
            total += check_predecode(E, 2, WN, NT, NACC)
    print(f"predecode ok: {n_shapes} tile shapes, {total} lane loads, each its own decode, "
          "no bank conflicts")
    n = 0
    for NS, PRE in ((4, False), (3, False), (5, True), (4, True), (3, True)):
        for n_chunks in range(1, 3 * NS + 1):
            n += check_ring(NS, PRE, n_chunks)
    print(f"ring ok: {n} chunks through rings of 3-5 stages, with and without PRE")


if __name__ == "__main__":
    sys.exit(main())
