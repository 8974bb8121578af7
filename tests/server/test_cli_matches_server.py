"""`wick generate` (a Session) and `wick serve` (the Engine) run one generation
path: the same request gives the same tokens, at the context limit too.

The server reports tokens as strings with their log-probabilities, so a
token is compared through both: the CLI's id decoded alone (as the server
decodes it) and its log-probability and those of the runners-up."""
import json
import subprocess

import pytest
import requests

from conftest import MODEL, WICK, serving

CTX = 48
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"  # a prompt the model continues past any context
N_TOP = 2


def cli(*args):
    r = subprocess.run([WICK, *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def prompt_ids():
    return json.loads(cli("tokenize", MODEL, COUNTING, "--json"))


def cli_generate(ids, max_tokens):
    out = cli("generate", "--model", MODEL, "--prompt-ids", ",".join(map(str, ids)), "--temperature", "0",
              "--ctx-size", str(CTX), "--max-tokens", str(max_tokens), "--logprobs", str(N_TOP), "--json")
    return json.loads(out)


def token_text(tid, cache={}):
    if tid not in cache:
        cache[tid] = cli("detokenize", MODEL, str(tid), "--show-special")
    return cache[tid]


@pytest.fixture(scope="module")
def small_ctx_server():
    yield from serving("--ctx-size", str(CTX))


def server_complete(server, ids, max_tokens):
    body = {"model": MODEL, "prompt": ids, "temperature": 0, "logprobs": N_TOP}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    r = requests.post(server.url + "/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def assert_same_tokens(got, served):
    choice = served["choices"][0]
    lp = choice["logprobs"]
    assert served["usage"]["prompt_tokens"] == got["prompt_tokens"]
    assert served["usage"]["completion_tokens"] == len(got["tokens"])
    assert choice["text"] == got["text"]
    assert lp["tokens"] == [token_text(t) for t in got["tokens"]]
    assert len(lp["token_logprobs"]) == len(got["logprobs"])
    for i, (s_lp, s_top, c) in enumerate(zip(lp["token_logprobs"], lp["top_logprobs"], got["logprobs"])):
        assert abs(s_lp - c["logprob"]) < 1e-5, f"token {i}"
        assert s_top == {token_text(t["id"]): pytest.approx(t["logprob"], abs=1e-5)
                         for t in c["top_logprobs"]}, f"token {i}"


def test_same_tokens_below_the_context_limit(small_ctx_server):
    ids = prompt_ids()
    got = cli_generate(ids, 8)
    assert got["stop_reason"] == "length" and len(got["tokens"]) == 8
    served = server_complete(small_ctx_server, ids, 8)
    assert served["choices"][0]["finish_reason"] == "length"
    assert_same_tokens(got, served)


def test_same_tokens_at_the_context_limit(small_ctx_server):
    ids = prompt_ids()
    assert len(ids) < CTX - 4
    # the one behaviour: prompt and generated tokens together fill the context
    got = cli_generate(ids, 256)
    assert got["stop_reason"] == "context"
    assert len(ids) + len(got["tokens"]) == CTX
    # the server caps max_tokens at the room left: the same tokens, reported as "length"
    for max_tokens in (None, 256):
        served = server_complete(small_ctx_server, ids, max_tokens)
        assert served["choices"][0]["finish_reason"] == "length"
        assert_same_tokens(got, served)
