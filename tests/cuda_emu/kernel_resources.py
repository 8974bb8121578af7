#!/usr/bin/env python3
"""What each kernel of a .cu file takes on an H100 (sm_90), for the CUDA
emulator (docs/cuda_emu.md, "Registers"): nvcc's PTX gives a kernel's
__launch_bounds__ (.maxntid), ptxas -v its registers, static shared memory and
stack frame. One line a kernel, tab-separated:

    mangled name  registers  static smem bytes  stack bytes  max threads (0: no bound)

with nvcc's name for an anonymous namespace (_GLOBAL__N__<hash>_<len>_<file>_<hash>)
written as g++ writes it (_GLOBAL__N_1), so that the emulated kernel's symbol
names the same line.

    kernel_resources.py NVCC INCLUDE_DIR OUT.tsv FILE.cu
    kernel_resources.py --merge OUT.tsv IN.tsv...
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

ARCH = "90"
# cudafe++'s name for a file's anonymous namespace, and its length before it
ANON = re.compile(r"_GLOBAL__N__[0-9a-f]{8}_(\d+)_")


def normalize(name: str) -> str:
    out, i = [], 0
    for m in ANON.finditer(name):
        if m.start() < i:
            continue
        file_len = int(m.group(1))
        end = m.end() + file_len + 9  # <file>_<8 hex>
        ident = name[m.start():end]
        prefix = str(len(ident))
        if not name.startswith(prefix, m.start() - len(prefix)):
            raise SystemExit(f"kernel_resources: unexpected anonymous namespace in {name}")
        out.append(name[i:m.start() - len(prefix)])
        out.append("12_GLOBAL__N_1")
        i = end
    out.append(name[i:])
    return "".join(out)


def max_threads(ptx: str) -> dict:
    """Each .entry's .maxntid product (its directives come before its body)."""
    bounds = {}
    for m in re.finditer(r"\.entry\s+(\S+)\s*\((.*?)\{", ptx, re.S):
        nt = re.search(r"\.maxntid\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?", m.group(2))
        n = 0
        if nt:
            n = 1
            for g in nt.groups():
                n *= int(g) if g else 1
        bounds[m.group(1)] = n
    return bounds


def ptxas_info(text: str) -> dict:
    info, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            cur = m.group(1)
            info[cur] = {"regs": 0, "smem": 0, "stack": 0}
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame", line)
        if m:
            info[cur]["stack"] = int(m.group(1))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            info[cur]["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            info[cur]["smem"] = int(s.group(1)) if s else 0
    return info


def one(nvcc: str, include: str, out: str, cu: str) -> None:
    ptxas = os.path.join(os.path.dirname(os.path.realpath(nvcc)), "ptxas")
    if not os.path.exists(ptxas):
        ptxas = shutil.which("ptxas") or ptxas
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        # the flags of the release build (src/CMakeLists.txt, wick_cuda)
        subprocess.run([nvcc, "-I", include, "-O3", "-DNDEBUG", "-std=c++17",
                        "--expt-relaxed-constexpr", f"-arch=compute_{ARCH}", "-ptx",
                        "-o", ptx, cu], check=True)
        v = subprocess.run([ptxas, f"-arch=sm_{ARCH}", "-O3", "-v", ptx, "-o",
                            os.path.join(tmp, "k.cubin")],
                           check=True, capture_output=True, text=True)
        with open(ptx) as f:
            bounds = max_threads(f.read())
    info = ptxas_info(v.stdout + v.stderr)
    if set(info) != set(bounds):
        raise SystemExit(f"kernel_resources: ptxas and the PTX name other kernels in {cu}")
    lines = [f"{normalize(n)}\t{r['regs']}\t{r['smem']}\t{r['stack']}\t{bounds[n]}\n"
             for n, r in sorted(info.items())]
    with open(out + ".tmp", "w") as f:
        f.writelines(lines)
    os.replace(out + ".tmp", out)


def merge(out: str, ins: list) -> None:
    text = "".join(open(p).read() for p in ins)
    with open(out + ".tmp", "w") as f:
        f.write(text)
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--merge":
        merge(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) == 5:
        one(*sys.argv[1:])
    else:
        sys.exit(__doc__)
