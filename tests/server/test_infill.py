"""Fill-in-the-middle end to end: a random-weight Qwen3-shaped model with the real Qwen3
tokenizer (whose vocabulary has <|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>), served by
`wick serve`: completions' `suffix` through the `openai` package and Ollama's `suffix`
through the `ollama` package lay out the prompt as HF `tokenizers` encodes the same text
with the FIM tokens written in, and answer what plain completion of those ids answers;
a model without FIM tokens is a 400 naming `suffix`."""
import json
import os

import ollama
import pytest
import requests
import tokenizers

from conftest import QWEN3_TOKENIZER, Server, oa, qwen3_vocab_model

PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def fim_server(tmp_path_factory):
    s = Server(model=qwen3_vocab_model(tmp_path_factory.mktemp("fim-qwen3")))
    s.model = s.proc.args[3]  # the served model's name: its path
    yield s
    assert s.proc.poll() is None, "the server died during the tests"
    s.stop()


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


def sse_events(resp):
    return [json.loads(line[len("data: "):]) for line in resp.content.decode().splitlines() if line.startswith("data: ")]


def test_llamacpp_infill(fim_server):
    """llama.cpp's /infill (the editors' FIM endpoint): input_prefix, input_suffix and
    input_extra files laid out as HF `tokenizers` encodes the same text, the answer that
    plain completion of those ids gives, whole and streamed."""
    files = [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}]
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": files, "prompt": "return",
            "n_predict": 8, "temperature": 0}
    want = hf_ids("<|file_sep|>util.py\n" + files[0]["text"] + "<|fim_prefix|>" + PREFIX + "<|fim_suffix|>" +
                  SUFFIX + "<|fim_middle|>return")
    r = requests.post(fim_server.url + "/infill", json=body, timeout=60)
    r.raise_for_status()
    j = r.json()
    assert j["stop"] is True and j["tokens_evaluated"] == len(want) and j["tokens_predicted"] == 8
    assert j["stop_type"] == "limit" and j["timings"]["predicted_n"] == 8
    plain = oa(fim_server).completions.create(model="", prompt=want, temperature=0, max_tokens=8)
    assert j["content"] == plain.choices[0].text
    events = sse_events(requests.post(fim_server.url + "/infill", json={**body, "stream": True}, timeout=60))
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == j["content"]
    # without files or prompt: what completions' suffix answers
    r = requests.post(fim_server.url + "/infill", timeout=60, json={
        "input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 8, "temperature": 0})
    suffix = oa(fim_server).completions.create(model="", prompt=PREFIX, suffix=SUFFIX, temperature=0, max_tokens=8)
    assert r.json()["content"] == suffix.choices[0].text


def test_llamacpp_completion(fim_server):
    """llama.cpp's /completion: a text or token-id prompt, n_predict, stop; the answer
    plain /v1/completions gives."""
    prompt = "The capital of France is"
    want = oa(fim_server).completions.create(model="", prompt=prompt, temperature=0, max_tokens=6)
    for p in (prompt, hf_ids(prompt)):
        j = requests.post(fim_server.url + "/completion", timeout=60,
                          json={"prompt": p, "n_predict": 6, "temperature": 0}).json()
        assert j["content"] == want.choices[0].text and j["tokens_evaluated"] == want.usage.prompt_tokens
    events = sse_events(requests.post(fim_server.url + "/completion", timeout=60,
                                      json={"prompt": prompt, "n_predict": 6, "temperature": 0, "stream": True}))
    assert "".join(e["content"] for e in events) == want.choices[0].text and events[-1]["stop"] is True


def test_llamacpp_n_probs(fim_server):
    """llama.cpp's n_probs: completion_probabilities, one entry per generated token with its
    id, text, bytes and logprob and the top n_probs alternatives, the values /v1/completions'
    logprobs give; streamed, each event carries its own tokens' and together they equal the
    whole answer's."""
    prompt = "The capital of France is"
    want = oa(fim_server).completions.create(model="", prompt=prompt, temperature=0, max_tokens=6, logprobs=4)
    body = {"prompt": prompt, "n_predict": 6, "temperature": 0, "n_probs": 4}
    j = requests.post(fim_server.url + "/completion", json=body, timeout=60).json()
    probs = j["completion_probabilities"]
    assert len(probs) == 6 and j["content"] == want.choices[0].text
    lp = want.choices[0].logprobs
    hf = tokenizers.Tokenizer.from_file(os.path.join(QWEN3_TOKENIZER, "tokenizer.json"))
    for p, token, value, top in zip(probs, lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert p["token"] == token and abs(p["logprob"] - value) < 1e-6
        assert p["bytes"] == list(p["token"].encode())
        assert hf.decode([p["id"]], skip_special_tokens=False) == p["token"]
        assert len(p["top_logprobs"]) == 4 and p["top_logprobs"][0]["id"] == p["id"]  # greedy
        assert {t["token"]: t["logprob"] for t in p["top_logprobs"]} == pytest.approx(top, abs=1e-6)
        assert [t["logprob"] for t in p["top_logprobs"]] == sorted((t["logprob"] for t in p["top_logprobs"]),
                                                                   reverse=True)
    events = sse_events(requests.post(fim_server.url + "/completion", json={**body, "stream": True}, timeout=60))
    assert [p for e in events for p in e.get("completion_probabilities", [])] == probs
    assert "completion_probabilities" not in requests.post(fim_server.url + "/completion", timeout=60, json={
        "prompt": prompt, "n_predict": 2}).json()


def test_llamacpp_props(fim_server, server):
    """llama.cpp's GET /props: the served model's context, path and chat template, the slots
    and /completion's defaults; ?model= names another; POST is a 501."""
    j = requests.get(fim_server.url + "/props", timeout=30).json()
    template = json.load(open(os.path.join(fim_server.model, "tokenizer_config.json")))["chat_template"]
    assert j["chat_template"] == template and j["model_path"] == fim_server.model
    assert j["default_generation_settings"]["n_ctx"] == 4096 and j["total_slots"] >= 1
    params = j["default_generation_settings"]["params"]
    assert params["top_k"] == 40 and params["n_probs"] == 0 and params["temperature"] == pytest.approx(0.8)
    assert j["modalities"]["vision"] is False
    r = requests.get(fim_server.url + "/props", params={"model": "no-such-model"}, timeout=30)
    assert r.status_code == 404
    assert requests.post(fim_server.url + "/props", json={}, timeout=30).status_code == 501


def test_llamacpp_errors(fim_server, server, model_name):
    for body, param in (({"prompt": "x", "n_probs": 101}, "n_probs"), ({"prompt": "x", "n_probs": -1}, "n_probs"),
                        ({"prompt": "x", "n_probs": 2, "post_sampling_probs": True}, "post_sampling_probs"),
                        ({"prompt": 5}, "prompt"),
                        ({"prompt": "x", "n_predict": 0}, "n_predict"),
                        ({"prompt": "x", "json_schema": "no"}, "json_schema")):
        r = requests.post(fim_server.url + "/completion", json=body, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
    r = requests.post(fim_server.url + "/infill", json={"input_prefix": "a", "input_extra": [3]}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_extra[0]"
    r = requests.post(server.url + "/infill", json={"model": model_name, "input_prefix": "a"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_prefix"
