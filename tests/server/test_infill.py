"""Fill-in-the-middle end to end: a random-weight Qwen3-shaped model with the real Qwen3
tokenizer (whose vocabulary has <|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>), served by
`wick serve`: completions' `suffix` through the `openai` package and Ollama's `suffix`
through the `ollama` package lay out the prompt as HF `tokenizers` encodes the same text
with the FIM tokens written in, and answer what plain completion of those ids answers;
a model without FIM tokens is a 400 naming `suffix`."""
import os

import ollama
import openai
import pytest
import requests
import tokenizers

from conftest import QWEN3_TOKENIZER, Server, qwen3_vocab_model

PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def fim_server(tmp_path_factory):
    s = Server(model=qwen3_vocab_model(tmp_path_factory.mktemp("fim-qwen3")))
    s.model = s.proc.args[3]  # the served model's name: its path
    yield s
    assert s.proc.poll() is None, "the server died during the tests"
    s.stop()


def oa(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def hf_ids(text):
    return tokenizers.Tokenizer.from_file(os.path.join(QWEN3_TOKENIZER, "tokenizer.json")).encode(text).ids


def test_completions_suffix_lays_out_prefix_suffix_middle(fim_server):
    want = hf_ids("<|fim_prefix|>" + PREFIX + "<|fim_suffix|>" + SUFFIX + "<|fim_middle|>")
    client = oa(fim_server)
    r = client.completions.create(model="", prompt=PREFIX, suffix=SUFFIX, temperature=0, max_tokens=8,
                                  extra_body={"prompt_logprobs": 0})
    assert r.usage.prompt_tokens == len(want)
    entries = r.choices[0].model_extra["prompt_logprobs"]
    assert entries[0] is None
    # each entry is keyed by its prompt token's id (and its alternatives' with prompt_logprobs > 0)
    assert [int(next(iter(e))) for e in entries[1:]] == want[1:]
    plain = client.completions.create(model="", prompt=want, temperature=0, max_tokens=8)
    assert r.choices[0].text == plain.choices[0].text


def test_ollama_suffix_answers_as_completions(fim_server):
    client = ollama.Client(host=fim_server.url)
    opts = {"temperature": 0, "num_predict": 8, "repeat_penalty": 1.0}
    got = client.generate(model=fim_server.model, prompt=PREFIX, suffix=SUFFIX, options=opts)
    want = oa(fim_server).completions.create(model="", prompt=PREFIX, suffix=SUFFIX, temperature=0, max_tokens=8)
    assert got.response == want.choices[0].text
    assert got.prompt_eval_count == want.usage.prompt_tokens
    # the cursor at the start of the file: an empty prompt with a suffix generates, it is no load request
    empty = client.generate(model=fim_server.model, prompt="", suffix=SUFFIX, options=opts)
    assert empty.done_reason != "load" and empty.eval_count > 0


def test_suffix_errors(fim_server, server, model_name):
    r = requests.post(fim_server.url + "/v1/completions", timeout=30,
                      json={"prompt": [1, 2, 3], "suffix": "x", "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
    r = requests.post(fim_server.url + "/v1/completions", timeout=30,
                      json={"prompt": "a", "suffix": "x", "echo": True, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo"
    # SmolLM2 has no FIM tokens
    r = requests.post(server.url + "/v1/completions", timeout=30,
                      json={"model": model_name, "prompt": "a", "suffix": "x", "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
    assert "fill-in-the-middle" in r.json()["error"]["message"]
    r = requests.post(server.url + "/api/generate", timeout=30,
                      json={"model": model_name, "prompt": "a", "suffix": "x", "stream": False})
    assert r.status_code == 400 and "fill-in-the-middle" in r.json()["error"]
