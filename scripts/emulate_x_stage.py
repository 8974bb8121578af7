#!/usr/bin/env python3
"""scripts/emulate_x_stage.py: the decode kernel's x stage (src/backend/cuda/matmul.cu,
XS: xs_pair, xs_row_pairs, stage_x, xs_load) replayed lane by lane on the CPU, for
checking a change to its layout without a GPU.

For each weight format's chunk shape (E elements a lane: 16-bit 8, 8-bit 16, 4-bit
32), k_pad of a few chunks, 1 to 16 rows: stage_x's writes (a uint2 of pairs k/2,
k/2 + 1 for each group i of four elements: row i / (k_pad / 4), k = 4 i mod
k_pad) into a model of shared memory, then every lane's reads, addressed as the
kernel does (xs_lane's first pair of the lane's row, rows past M clamped to M - 1,
then xs_chunk ch + 2 s for chunk ch and step s; one step a uint2 for 8-bit weights,
two a uint4 otherwise), must find the pairs of elements
ch KC + E c + 4 s .. that load_x4 + pack_bf16 would give lane (g, c), at the load's
alignment (rows past M: any row's, their outputs are dropped). Then the banks: each
load's lanes, by half warp (8-byte loads) or quarter warp (16-byte loads), must touch
distinct banks or the same word (a broadcast): no bank conflicts at any row count. It models the
kernel, it does not run it: keep the two in step; the GPU test
CudaMatmul.StagedActivationsKeepTheBits decides. Run: python3 scripts/emulate_x_stage.py
"""
import sys

E_OF = {"bf16": 8, "i8": 16, "u4": 32}


def xs_pair(fmt, i):
    return i + ((i >> 5) << 2) if fmt == "u4" else i


def xs_row_pairs(fmt, k_pad):
    length = xs_pair(fmt, k_pad // 2 - 1) + 1
    want = {"u4": 8, "i8": 2, "bf16": 16}[fmt]
    return length + ((want - length % 32) + 32) % 32


def check(fmt, k_pad, M):
    E = E_OF[fmt]
    KC = 4 * E
    rs = xs_row_pairs(fmt, k_pad)
    chunk = xs_pair(fmt, 2 * E)  # xs_chunk
    smem = {}  # word -> (row, pair)
    n_row = k_pad // 4  # stage_x: group i of the rows' four-element groups
    for i in range(M * n_row):
        r = i // n_row
        k = 4 * (i - r * n_row)
        at = r * rs + xs_pair(fmt, k // 2)
        assert at % 2 == 0, "uint2 store misaligned"
        for j in range(2):
            assert at + j not in smem, f"{fmt}: stage words overlap at {at + j}"
            assert at + j < (r + 1) * rs, f"{fmt}: row {r} spills past its stride"
            smem[at + j] = (r, k // 2 + j)
    two = fmt != "i8"  # steps a load
    width = 4 if two else 2  # words a load
    phase = 8 if two else 16  # lanes served together
    errors = 0
    for ch in range(k_pad // KC):
        for s in range(0, E // 4, 2 if two else 1):
            for hi in (0, 8):  # rows g and g + 8
                lanes = []
                for lane in range(32):
                    g, c = lane >> 2, lane & 3
                    r = g + hi
                    lane_at = min(r, M - 1) * rs + xs_pair(fmt, E // 2 * c)  # xs_lane
                    at = lane_at + ch * chunk + 2 * s
                    assert at % width == 0, f"{fmt}: load misaligned"
                    e = ch * KC + E * c + 4 * s
                    got = [smem.get(at + j) for j in range(width)]
                    want = [(min(r, M - 1), e // 2 + j) for j in range(width)]
                    if got != want:
                        errors += 1
                    lanes.append((lane, at))
                for p0 in range(0, 32, phase):
                    banks = {}
                    for lane, at in lanes:
                        if p0 <= lane < p0 + phase:
                            for j in range(width):
                                banks.setdefault((at + j) % 32, set()).add(at + j)
                    if any(len(words) > 1 for words in banks.values()):
                        errors += 1
    return errors


def main():
    bad = 0
    for fmt, E in E_OF.items():
        KC = 4 * E
        for n_chunks in (1, 3, 7, 24):
            for M in (1, 2, 3, 5, 8, 9, 12, 16):
                e = check(fmt, n_chunks * KC, M)
                if e:
                    print(f"FAIL {fmt} k_pad {n_chunks * KC} rows {M}: {e} loads wrong or conflicting")
                bad += e
    print("x stage: every load reads its pairs, no bank conflicts" if not bad else f"{bad} failures")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
