"""Starts real `wick serve` processes on loopback for the server tests."""
import os
import socket
import subprocess
import time

import pytest
import requests

WICK = os.environ.get("WICK_BIN", "build/bin/wick")
MODEL = os.environ.get("WICK_TEST_MODEL", os.path.expanduser("~/.cache/wick/models/smollm2.gguf"))
# Under CI (CI=true or CI=1) a test that cannot run fails instead of skipping.
CI = os.environ.get("CI", "").lower() in ("true", "1")
# Sanitizer builds (make test-asan, make test-tsan) run several times slower:
# the waits for the server to become ready or idle stretch by this factor.
TIME_SCALE = float(os.environ.get("WICK_TEST_TIME_SCALE", "1"))


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


@pytest.fixture(scope="session")
def server():
    s = Server()
    yield s
    assert s.proc.poll() is None, "the server died during the tests"
    s.stop()


@pytest.fixture(scope="session")
def model_name():
    return MODEL
