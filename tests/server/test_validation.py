"""Raw HTTP: every validation rule gives a 4xx naming the field; the server
stays healthy afterwards."""
import json

import pytest
import requests

from conftest import Server


def post(server, path, body, **kw):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return requests.post(server.url + path, data=data, timeout=30, **kw)


def error_of(r):
    j = r.json()
    return j["error"] if isinstance(j["error"], str) else j["error"]["message"] + " param=" + str(j["error"]["param"])


MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("path,body,status,needle", [
    ("/v1/chat/completions", b"{not json", 400, "not valid JSON"),
    ("/v1/chat/completions", b"[1, 2]", 400, "must be a JSON object"),
    ("/v1/chat/completions", {"messages": []}, 400, "param=messages"),
    ("/v1/chat/completions", {}, 400, "'messages' is required"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "'messages' must be an array"),
    ("/v1/chat/completions", {"messages": [{"content": "x"}]}, 400, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "not one of"),
    ("/v1/chat/completions", {"messages": MSG, "model": "no-such-model"}, 404, "does not exist"),
    ("/v1/chat/completions", {"messages": MSG, "temperature": "hot"}, 400, "param=temperature"),
    ("/v1/chat/completions", {"messages": MSG, "temperature": -1}, 400, "param=temperature"),
    ("/v1/chat/completions", {"messages": MSG, "temperature": 50}, 400, "param=temperature"),
    ("/v1/chat/completions", {"messages": MSG, "top_p": 5}, 400, "param=top_p"),
    ("/v1/chat/completions", {"messages": MSG, "top_k": -2}, 400, "param=top_k"),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": -5}, 400, "param=max_tokens"),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 10**12}, 400, "param=max_tokens"),
    ("/v1/chat/completions", {"messages": MSG, "max_completion_tokens": 0}, 400, "param=max_completion_tokens"),
    ("/v1/chat/completions", {"messages": MSG, "n": 100}, 400, "param=n"),
    ("/v1/chat/completions", {"messages": MSG, "stop": 7}, 400, "param=stop"),
    ("/v1/chat/completions", {"messages": MSG, "stop": ["a", "b", "c", "d", "e"]}, 400, "param=stop"),
    ("/v1/chat/completions", {"messages": MSG, "presence_penalty": 9}, 400, "param=presence_penalty"),
    ("/v1/chat/completions", {"messages": MSG, "stream": "yes"}, 400, "param=stream"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 5000}]}, 400, "maximum context length"),
    ("/v1/chat/completions", {"messages": MSG, "logprobs": True, "top_logprobs": 50}, 400, "param=top_logprobs"),
    ("/v1/chat/completions", {"messages": MSG, "top_logprobs": 2}, 400, "param=top_logprobs"),
    ("/v1/chat/completions", {"messages": MSG, "tools": [{"type": "function"}]}, 400, "param=tools[0].function"),
    ("/v1/chat/completions", {"messages": MSG, "tool_choice": "always"}, 400, "param=tool_choice"),
    ("/api/chat", {"model": "smollm2", "messages": MSG, "tools": {}}, 400, "tools"),
    ("/v1/completions", {"prompt": "x", "logprobs": 9}, 400, "param=logprobs"),
    ("/v1/completions", {"prompt": 42}, 400, "param=prompt"),
    ("/v1/completions", {"prompt": [1, 2, 99999999]}, 400, "outside the vocabulary"),
    ("/v1/completions", {}, 400, "'prompt' is required"),
    ("/api/generate", {"prompt": "hi"}, 400, "'model' is required"),
    ("/api/generate", {"model": "smollm2", "prompt": "hi", "options": {"temperature": -3}}, 400, "temperature"),
    ("/api/generate", {"model": "smollm2", "prompt": "hi", "options": {"num_predict": 0}}, 400, "num_predict"),
    ("/api/generate", {"model": "smollm2", "prompt": "hi", "options": {"top_k": "many"}}, 400, "top_k"),
    ("/api/generate", {"model": "smollm2", "prompt": "word " * 5000}, 400, "context holds"),
    # (empty messages load the model, as on Ollama: test_lifecycle.py)
    ("/api/chat", {"model": "smollm2", "messages": "hi"}, 400, "must be an array"),
    ("/api/chat", {"model": "nope", "messages": MSG}, 404, "does not exist"),
    ("/api/show", {"model": "nope"}, 404, "does not exist"),
    ("/v1/chat/completions", {"messages": MSG, "chat_template_kwargs": {"messages": []}}, 400,
     "param=chat_template_kwargs"),
    ("/v1/chat/completions", {"messages": MSG, "chat_template_kwargs": {"add_generation_prompt": False}}, 400,
     "is reserved"),
    ("/v1/chat/completions", {"messages": MSG * 4097}, 400, "at most 4096 messages"),
    ("/v1/chat/completions", {"messages": MSG, "tools": [{"type": "function"}] * 129}, 400, "at most 128 tools"),
    ("/v1/chat/completions", {"messages": MSG, "stop": ["x" * 513]}, 400, "at most 512 bytes"),
    ("/api/generate", {"model": "smollm2", "prompt": "hi", "options": {"stop": ["x" * 513]}}, 400, "at most 512 bytes"),
])
def test_validation(server, path, body, status, needle):
    r = post(server, path, body)
    assert r.status_code == status, r.text
    assert needle in error_of(r), r.text


def test_unknown_endpoint_and_body_limit(server):
    assert requests.get(server.url + "/v2/nothing", timeout=5).status_code == 404
    r = post(server, "/v1/chat/completions", b"{" + b" " * (9 << 20) + b"}")
    assert r.status_code == 413


def test_still_healthy_after_bad_requests(server):
    assert requests.get(server.url + "/health", timeout=5).json() == {"status": "ok"}


def test_api_key():
    s = Server("--api-key", "sekret")
    try:
        body = {"messages": MSG, "max_tokens": 2}
        assert post(s, "/v1/chat/completions", body).status_code == 401
        assert post(s, "/v1/chat/completions", body, headers={"Authorization": "Bearer wrong"}).status_code == 401
        for near in ("Bearer sekreT", "Bearer sekret2", "Bearer sekre", "sekret", "Bearer sekretsekret"):
            assert post(s, "/v1/chat/completions", body, headers={"Authorization": near}).status_code == 401
        assert post(s, "/v1/chat/completions", body, headers={"Authorization": "Bearer sekret"}).status_code == 200
        assert requests.get(s.url + "/health", timeout=5).status_code == 200
    finally:
        s.stop()


def test_full_queue_answers_429():
    s = Server("--max-queue", "1", "--max-seqs", "1")
    try:
        import concurrent.futures as cf
        body = {"messages": MSG, "max_tokens": 64, "temperature": 0}
        with cf.ThreadPoolExecutor(6) as ex:
            codes = list(ex.map(lambda _: post(s, "/v1/chat/completions", body).status_code, range(6)))
        assert 429 in codes and 200 in codes, codes
        assert set(codes) <= {200, 429}
    finally:
        s.stop()


def test_disconnect_frees_blocks(server):
    with requests.post(server.url + "/v1/chat/completions", stream=True, timeout=30,
                       json={"messages": [{"role": "user", "content": "Write a long story."}], "stream": True,
                             "max_tokens": 400, "temperature": 0}) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 3:
                break  # hang up mid-stream
    import time
    deadline = time.time() + 10
    while time.time() < deadline and (server.metric("wick_kv_blocks_used") > 0 or server.metric("wick_running_sequences") > 0):
        time.sleep(0.1)
    assert server.metric("wick_kv_blocks_used") == 0
    assert server.metric("wick_running_sequences") == 0
