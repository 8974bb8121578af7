#!/usr/bin/env python3
"""Turns a .cu file into host C++ for the CUDA emulator (tests/cuda_emu).

Three rewrites, nothing else (the line count stays, and #line keeps the
compiler's messages on the original file):
  kernel<T><<<grid, block[, smem[, stream]]>>>(args)
      -> ::wick_emu::launch(grid, block, smem, stream, kernel<T>, args)
  extern __shared__ [__align__(n)] type name[];
      -> type* name = reinterpret_cast<type*>(::wick_emu::dynamic_smem());
  __shared__ [__align__(n)] type a[d]..., b;
      -> auto& a = ::wick_emu::cta_shared<type[d]..., n>([] {}); auto& b = ...
     (each CTA's own, fresh: a static would be one for all CTAs)

usage: rewrite_cu.py IN.cu OUT.cpp
"""
import re
import sys

STATIC_SHARED = re.compile(r"(?<!extern )__shared__\s+(?:__align__\(\s*(\d+)\s*\)\s+)?([^;]+);")
DECLARATOR = re.compile(r"^(.*?)\b(\w+)\s*((?:\[[^\]]*\]\s*)*)$", re.S)
SHARED = re.compile(r"extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([\w:\s]+?)\s+(\w+)\s*\[\s*\]\s*;")


def split_top(text):
    """Splits at the commas outside (), [], {} and <>."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def kernel_start(src, end):
    """Start of the kernel expression that ends at src[end] (exclusive)."""
    i = end
    while True:
        while i > 0 and src[i - 1].isspace():
            i -= 1
        if i > 0 and src[i - 1] == ">":  # template arguments
            depth = 0
            while i > 0:
                i -= 1
                if src[i] == ">":
                    depth += 1
                elif src[i] == "<":
                    depth -= 1
                    if depth == 0:
                        break
            continue
        j = i
        while j > 0 and (src[j - 1].isalnum() or src[j - 1] in "_:"):
            j -= 1
        return j


def matching(src, i, open_ch, close_ch):
    depth = 0
    for k in range(i, len(src)):
        if src[k] == open_ch:
            depth += 1
        elif src[k] == close_ch:
            depth -= 1
            if depth == 0:
                return k
    raise SystemExit(f"unbalanced {open_ch} at offset {i}")


def rewrite(src):
    out, pos = [], 0
    while True:
        i = src.find("<<<", pos)
        if i < 0:
            out.append(src[pos:])
            break
        start = kernel_start(src, i)
        j = src.index(">>>", i)
        config = split_top(src[i + 3:j])
        if not 2 <= len(config) <= 4:
            raise SystemExit(f"launch with {len(config)} configuration values at offset {i}")
        config += ["0", "cudaStream_t(nullptr)"][len(config) - 2:]
        k = j + 3
        while src[k].isspace():
            k += 1
        if src[k] != "(":
            raise SystemExit(f"launch without arguments at offset {i}")
        close = matching(src, k, "(", ")")
        args = src[k + 1:close]
        kernel = src[start:i].strip()
        call = "::wick_emu::launch(" + ",".join(config) + ", " + kernel
        call += (", " + args if args.strip() else "") + ")"
        out.append(src[pos:start])
        # keep the lines: the kernel's text moved into the call had no newline
        out.append(call)
        pos = close + 1
    text = "".join(out)
    text = SHARED.sub(
        lambda m: f"{m.group(1)}* {m.group(2)} = reinterpret_cast<{m.group(1)}*>(::wick_emu::dynamic_smem());",
        text)
    return STATIC_SHARED.sub(static_shared, text)


def static_shared(m):
    """One `auto&` a declarator; the lambda's type makes each site's key its own."""
    line = m.string[m.string.rfind("\n", 0, m.start()) + 1:m.start()]
    if "//" in line or "*" in line.lstrip()[:1]:  # in a comment: left as it is
        return m.group(0)
    align, out, type_ = m.group(1) or "0", [], None
    for i, d in enumerate(split_top(m.group(2))):
        parts = DECLARATOR.match(d.strip())
        if not parts or "=" in d or "\n" in d or (i == 0) == (not parts.group(1).strip()):
            raise SystemExit(f"__shared__ declarator not understood: {d!r}")
        type_ = parts.group(1).strip() if i == 0 else type_
        dims = parts.group(3).replace(" ", "")
        out.append(f"auto& {parts.group(2)} = ::wick_emu::cta_shared<{type_}{dims}, {align}>([] {{}});")
    return " ".join(out)


def main():
    src_path, out_path = sys.argv[1], sys.argv[2]
    with open(src_path) as f:
        src = f.read()
    with open(out_path, "w") as f:
        f.write(f'#line 1 "{src_path}"\n' + rewrite(src))


if __name__ == "__main__":
    main()
