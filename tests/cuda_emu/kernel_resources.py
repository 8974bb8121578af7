#!/usr/bin/env python3
"""What each kernel of a .cu file takes on an H100 (sm_90), for the CUDA
emulator (docs/cuda_emu.md, "Registers"): nvcc's PTX gives a kernel's
__launch_bounds__ (.maxntid), ptxas -v its registers, static shared memory and
stack frame. One line a kernel, tab-separated:

    mangled name  registers  static smem bytes  stack bytes  max threads (0: no bound)

with nvcc's name for an anonymous namespace (_GLOBAL__N__<hash>_<len>_<file>_<hash>)
written as g++ writes it (_GLOBAL__N_1), so that the emulated kernel's symbol
names the same line.

    kernel_resources.py --launch NVCC ARGS... -o OBJ ...
    kernel_resources.py --merge OUT.tsv OBJ...

--launch is wick_cuda's compiler launcher (src/CMakeLists.txt): it runs the
build's own compile with ptxas -v and nvcc's intermediate files kept, and
writes OBJ.resources.tsv from that sm_90 compile, so the table is the shipped
code's and no second compile is needed (a second one was ~100 s of CI's CPU).
--merge joins the tables of the .cu objects among OBJ....
"""
import os
import re
import shutil
import subprocess
import sys

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


ARCH_RE = re.compile(r"for 'sm_(\d+a?)'")


def entries_for(text: str, sm: str) -> str:
    """ptxas -v's lines for one architecture (nvcc prints every real one)."""
    out, keep = [], False
    for line in text.splitlines():
        if "Compiling entry function" in line:
            m = ARCH_RE.search(line)
            keep = bool(m) and m.group(1) == sm
        if keep:
            out.append(line)
    return "\n".join(out)


def table(ptxas_text: str, ptx_text: str, what: str) -> list:
    info, bounds = ptxas_info(ptxas_text), max_threads(ptx_text)
    if set(info) != set(bounds):
        raise SystemExit(f"kernel_resources: ptxas and the PTX name other kernels in {what}")
    return [f"{normalize(n)}\t{r['regs']}\t{r['smem']}\t{r['stack']}\t{bounds[n]}\n"
            for n, r in sorted(info.items())]


def write(out: str, lines: list) -> None:
    with open(out + ".tmp", "w") as f:
        f.writelines(lines)
    os.replace(out + ".tmp", out)


def launch(cmd: list) -> int:
    obj = cmd[cmd.index("-o") + 1]
    keep = obj + ".keep"
    shutil.rmtree(keep, ignore_errors=True)
    os.makedirs(keep)
    try:
        run = subprocess.run(cmd + ["-Xptxas", "-v", "-keep", "-keep-dir", keep],
                             capture_output=True, text=True)
        text = run.stdout + run.stderr
        # what the compile says, less ptxas's report (the table holds it)
        rest = [l for l in text.splitlines(keepends=True)
                if not l.startswith("ptxas info") and not re.match(r"\s+\d+ bytes stack frame", l)]
        sys.stderr.write("".join(rest))
        if run.returncode != 0:
            return run.returncode
        try:
            ptx = [p for p in os.listdir(keep) if p.endswith(f".compute_{ARCH}.ptx")]
            if len(ptx) != 1 or f"for 'sm_{ARCH}'" not in text:
                raise SystemExit(f"kernel_resources: {obj} has no sm_{ARCH} code; the CUDA "
                                 f"emulator's kernel table is the H100's: add {ARCH} to "
                                 "CMAKE_CUDA_ARCHITECTURES or configure with -DWICK_CUDA_EMU=OFF")
            with open(os.path.join(keep, ptx[0])) as f:
                write(obj + ".resources.tsv", table(entries_for(text, ARCH), f.read(), obj))
        except BaseException:
            os.remove(obj)  # so that the next build compiles it again
            raise
        return 0
    finally:
        shutil.rmtree(keep, ignore_errors=True)


def merge(out: str, objs: list) -> None:
    write(out, [open(p + ".resources.tsv").read() for p in objs if p.endswith(".cu.o")])


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--merge":
        merge(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) >= 3 and sys.argv[1] == "--launch":
        sys.exit(launch(sys.argv[2:]))
    else:
        sys.exit(__doc__)
