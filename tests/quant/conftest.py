import os
import subprocess
import sys

import pytest

# tests/python's gguf_meta: GGUF fields and tensor types without GGUFReader's per-element views
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

WICK = os.environ.get("WICK_BIN", "build/bin/wick")
MODEL = os.environ.get("WICK_TEST_MODEL", os.path.expanduser("~/.cache/wick/models/smollm2.gguf"))


def wick(*args, check=True, **kw):
    r = subprocess.run([WICK, *map(str, args)], capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"wick {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr}")
    return r


@pytest.fixture(scope="session")
def model():
    if not os.path.exists(MODEL):
        pytest.skip(f"the default model is missing: {MODEL}")
    return MODEL
