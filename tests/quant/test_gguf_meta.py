"""tests/python/gguf_meta.py (the tests' quick reader of GGUF fields and tensor types)
against gguf's GGUFReader on the default model: every field's value and type, every
tensor's name, type and shape."""
import gguf

import gguf_meta


def test_gguf_meta_equals_gguf_reader(model):
    meta, r = gguf_meta.read(model), gguf.GGUFReader(model)
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}  # the header's
    assert set(meta.fields) == set(fields)
    for key, f in fields.items():
        assert meta.fields[key] == f.contents(), key
        assert meta.types[key] == f.types, key
    assert list(meta.tensors) == [t.name for t in r.tensors]
    for t in r.tensors:
        m = meta.tensors[t.name]
        assert (m.tensor_type, m.shape) == (t.tensor_type, tuple(int(n) for n in t.shape)), t.name
    assert any(f.types[0] == gguf.GGUFValueType.ARRAY for f in fields.values())
