"""A GGUF file's metadata and tensor descriptions, read as the format's specification lays
them out (ggml's docs/gguf.md: header, key-value pairs, tensor infos).

gguf's GGUFReader builds a numpy view for every element of an array field: 4.8 s for the
default model's 98k tokenizer strings, and the tests read such files many times. This reads
the same fields in about 0.1 s. Tensor data (dequantization) stays with GGUFReader and
gguf.quants; test_gguf_meta_equals_gguf_reader checks the two agree on the default model.
"""
import mmap
import struct
from dataclasses import dataclass

import gguf
import numpy as np

# GGUF value types -> struct formats (8: string, 9: array)
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
           11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


@dataclass
class Tensor:
    name: str
    tensor_type: gguf.GGMLQuantizationType
    shape: tuple  # ne order, innermost first (as GGUFReader's shape)


@dataclass
class Meta:
    fields: dict  # key -> value (str, number, bool or list)
    types: dict  # key -> gguf.GGUFValueType (arrays: [ARRAY, element type])
    tensors: dict  # name -> Tensor


def read(path) -> Meta:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        at = 0

        def take(fmt):
            nonlocal at
            v = struct.unpack_from(fmt, m, at)[0]
            at += struct.calcsize(fmt)
            return v

        def string():
            nonlocal at
            n = take("<Q")
            s = bytes(m[at:at + n]).decode("utf-8")
            at += n
            return s

        def value(t):
            nonlocal at
            if t == STRING:
                return string()
            if t != ARRAY:
                return take(SCALARS[t])
            et, n = take("<I"), take("<Q")
            if et == STRING:
                return [string() for _ in range(n)]
            dt = np.dtype(SCALARS[et])
            a = np.frombuffer(m, dt, n, at)
            at += n * dt.itemsize
            return a.tolist()

        if bytes(m[:4]) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        at = 4
        version, n_tensors, n_kv = take("<I"), take("<Q"), take("<Q")
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} not read here")
        fields, types = {}, {}
        for _ in range(n_kv):
            key, t = string(), take("<I")
            if t == ARRAY:
                types[key] = [gguf.GGUFValueType(t), gguf.GGUFValueType(struct.unpack_from("<I", m, at)[0])]
            else:
                types[key] = [gguf.GGUFValueType(t)]
            fields[key] = value(t)
        tensors = {}
        for _ in range(n_tensors):
            name, n_dims = string(), take("<I")
            shape = tuple(take("<Q") for _ in range(n_dims))
            tt, _offset = take("<I"), take("<Q")
            tensors[name] = Tensor(name, gguf.GGMLQuantizationType(tt), shape)
        return Meta(fields, types, tensors)
