"""Speculative decoding over HTTP: the request extras `spec` / `draft_max`
(OpenAI body, Ollama options), usage.speculative, the /metrics counters, and
greedy answers equal to plain decoding's, alone and in concurrent batches.
The draft model is the default model itself (same vocabulary)."""
import concurrent.futures
import json
import os
import subprocess

import pytest
import requests

from conftest import MODEL, WICK, free_port, serving

PASSAGE = ("The river runs past the old mill, under the stone bridge and through the town, where the "
           "market opens every Saturday morning and the bakers sell bread still warm from the oven.")
COPY = "Repeat this text exactly, word for word:\n\n" + PASSAGE


@pytest.fixture(scope="module")
def spec_server():
    yield from serving("--draft", MODEL, "--spec", "off", "--draft-max", "6")


def chat(server, content, **extra):
    body = {"messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": 48, **extra}
    r = requests.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_greedy_answers_equal_plain_decoding_with_both_proposers(spec_server):
    plain = chat(spec_server, COPY)
    assert "speculative" not in plain["usage"]
    for method in ("ngram", "draft"):
        out = chat(spec_server, COPY, spec=method)
        assert out["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"], method
        sp = out["usage"]["speculative"]
        assert 0 < sp["accepted"] <= sp["proposed"], (method, sp)
        assert sp["tokens_per_forward"] > 1.5, (method, sp)
        assert sp["forwards"] < out["usage"]["completion_tokens"]
    # the draft is the target itself: every guess is kept
    sp = chat(spec_server, COPY, spec="draft")["usage"]["speculative"]
    assert sp["accepted"] == sp["proposed"] and sp["acceptance_rate"] == 1.0


def test_concurrent_mixed_requests_equal_their_answers_alone(spec_server):
    prompts = [COPY, "What is the capital of France?", "Name three colours.", COPY]
    methods = ["ngram", "off", "draft", "draft"]
    alone = [chat(spec_server, p)["choices"][0]["message"]["content"] for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        futs = [ex.submit(chat, spec_server, p, spec=m) for p, m in zip(prompts * 2, methods * 2)]
        got = [f.result()["choices"][0]["message"]["content"] for f in futs]
    assert got == alone * 2


def test_stream_usage_and_completions(spec_server):
    body = {"messages": [{"role": "user", "content": COPY}], "temperature": 0, "max_tokens": 32,
            "spec": "ngram", "stream": True, "stream_options": {"include_usage": True}}
    r = requests.post(spec_server.url + "/v1/chat/completions", json=body, stream=True, timeout=120)
    lines = [l for l in r.iter_lines(decode_unicode=True) if l]
    assert lines[-1] == "data: [DONE]"
    usage = json.loads(lines[-2][6:])["usage"]
    assert usage["speculative"]["proposed"] > 0
    r = requests.post(spec_server.url + "/v1/completions",
                      json={"prompt": PASSAGE + "\n\n" + PASSAGE[:60], "max_tokens": 24, "temperature": 0,
                            "spec": "ngram", "draft_max": 4}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["speculative"]["proposed"] > 0


def test_ollama_options(spec_server):
    def gen(**options):
        r = requests.post(spec_server.url + "/api/generate",
                          json={"model": "smollm2", "prompt": COPY, "stream": False,
                                "options": {"temperature": 0, "num_predict": 40, **options}}, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()
    plain, spec = gen(), gen(spec="ngram")
    assert spec["response"] == plain["response"]
    assert spec["speculative"]["proposed"] > 0 and "speculative" not in plain


@pytest.mark.parametrize("body,param", [
    ({"spec": "fast"}, "spec"),
    ({"spec": 1}, "spec"),
    ({"draft_max": 99}, "draft_max"),
    ({"draft_max": -1}, "draft_max"),
])
def test_bad_extras_are_400s_naming_the_field(spec_server, body, param):
    r = requests.post(spec_server.url + "/v1/chat/completions",
                      json={"messages": [{"role": "user", "content": "hi"}], **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    r = requests.post(spec_server.url + "/api/chat",
                      json={"model": "smollm2", "messages": [{"role": "user", "content": "hi"}],
                            "stream": False, "options": body}, timeout=30)
    assert r.status_code == 400, r.text


def test_metrics_count_drafts(spec_server):
    chat(spec_server, COPY, spec="ngram")
    proposed = spec_server.metric("wick_spec_draft_tokens_total")
    accepted = spec_server.metric("wick_spec_accepted_tokens_total")
    assert 0 < accepted <= proposed
    assert spec_server.metric("wick_spec_generated_tokens_total") > spec_server.metric("wick_spec_forwards_total")
    text = requests.get(spec_server.url + "/metrics", timeout=5).text
    assert 'vllm:spec_decode_num_draft_tokens_total{model_name="' in text
    assert spec_server.metric("wick_kv_blocks_used") == 0


def test_draft_on_a_server_without_one_is_a_400(server):
    r = requests.post(server.url + "/v1/chat/completions",
                      json={"messages": [{"role": "user", "content": "hi"}], "spec": "draft"}, timeout=30)
    assert r.status_code == 400, r.text
    assert "draft" in r.json()["error"]["message"]


def test_a_draft_of_another_vocabulary_stops_the_server():
    tiny = os.path.join(os.path.dirname(__file__), "../../../shared/fixtures/tiny-models/llama")
    if not os.path.isdir(tiny):
        pytest.skip("shared tiny models missing")
    if not os.path.exists(MODEL):
        pytest.skip("default model missing")
    p = subprocess.run([WICK, "serve", "--model", MODEL, "--port", str(free_port()), "--draft", tiny],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "512 tokens" in p.stdout + p.stderr and "49152" in p.stdout + p.stderr, p.stdout + p.stderr
