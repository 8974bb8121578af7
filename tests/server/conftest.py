"""Starts real `wick serve` processes on loopback for the server tests."""
import json
import os
import shutil
import socket
import subprocess
import time

import openai
import pytest
import requests

WICK = os.environ.get("WICK_BIN", "build/bin/wick")
MODEL = os.environ.get("WICK_TEST_MODEL", os.path.expanduser("~/.cache/wick/models/smollm2.gguf"))
# Under CI (CI=true or CI=1) a test that cannot run fails instead of skipping.
CI = os.environ.get("CI", "").lower() in ("true", "1")
# Sanitizer builds (make test-asan, make test-tsan) run several times slower:
# the waits for the server to become ready or idle stretch by this factor.
TIME_SCALE = float(os.environ.get("WICK_TEST_TIME_SCALE", "1"))


SHARED = os.environ.get("WICK_SHARED", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared"))
QWEN3_TOKENIZER = os.path.join(SHARED, "tokenizers", "qwen3")
QWEN3_VOCAB = 151936  # Qwen3's embedding rows (the tokenizer's 151,669 ids fit)
QWEN3_IM_END = 151645


def qwen3_vocab_model(out):
    """The tiny Qwen3 fixture with its embedding grown to Qwen3's vocabulary (random
    rows), next to the real Qwen3 tokenizer and chat template, written to the folder
    `out` (a pathlib.Path): a random-weight model that reads and writes real text."""
    import numpy as np
    from safetensors.numpy import load_file, save_file
    tiny = os.path.join(SHARED, "fixtures", "tiny-models", "qwen3")
    if not (os.path.isdir(tiny) and os.path.isdir(QWEN3_TOKENIZER)):
        skip_or_fail(f"../shared fixtures not found at {SHARED}")
    tensors = load_file(os.path.join(tiny, "model.safetensors"))
    emb = tensors["model.embed_tokens.weight"]
    rng = np.random.default_rng(7)
    tensors["model.embed_tokens.weight"] = (rng.standard_normal((QWEN3_VOCAB, emb.shape[1])) * 0.02).astype(np.float32)
    save_file(tensors, str(out / "model.safetensors"))
    config = json.load(open(os.path.join(tiny, "config.json")))
    config.update(vocab_size=QWEN3_VOCAB, eos_token_id=QWEN3_IM_END, bos_token_id=None, max_position_embeddings=4096)
    json.dump(config, open(out / "config.json", "w"))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(QWEN3_TOKENIZER, f), out / f)
    return str(out)


def skip_or_fail(msg):
    if CI:
        pytest.fail(f"{msg} (CI={os.environ['CI']}: under CI a test that would skip fails)", pytrace=False)
    pytest.skip(msg)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *extra, env=None, model=None):
        model = model or MODEL  # read at call time: tests may point MODEL at a copy
        if not os.path.exists(model):
            skip_or_fail(f"model missing: {model}")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([WICK, "serve", "--model", model, "--port", str(self.port), *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **(env or {})})
        deadline = time.time() + 60 * TIME_SCALE
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("wick serve exited: " + self.proc.stdout.read())
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise RuntimeError("wick serve did not become healthy")

    def metric(self, name):
        for line in requests.get(self.url + "/metrics", timeout=5).text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(name)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def serving(*extra, env=None, model=None):
    """A server fixture's body (`yield from serving(...)`): the server for the tests, then a
    check that it outlived them, and its stop."""
    s = Server(*extra, env=env, model=model)
    yield s
    assert s.proc.poll() is None, "the server died during the tests"
    s.stop()


def oa(server):
    """The `openai` package's client for a server."""
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="session")
def server():
    yield from serving()


@pytest.fixture(scope="session")
def model_name():
    return MODEL
