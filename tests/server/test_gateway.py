"""wick replicas behind a real cache-aware gateway (the PyPI `sglang-router`,
the SGLang Model Gateway) on loopback: the worker endpoints it reads, requests
forwarded through it, and the metrics Kubernetes routers read under vLLM's names."""
import os
import subprocess
import sys
import time

import pytest
import requests

from conftest import MODEL, Server, free_port


@pytest.fixture(scope="module")
def replicas():
    pytest.importorskip("sglang_router")
    ws = [Server(), Server()]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    gw = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--worker-urls",
                           *[w.url for w in ws], "--policy", "cache_aware", "--host", "127.0.0.1",
                           "--port", str(port), "--prometheus-port", str(free_port())],
                          stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            r = requests.get(url + "/workers", timeout=1)
            if r.status_code == 200 and sum(w["is_healthy"] for w in r.json()["workers"]) == 2:
                break
        except requests.RequestException:
            pass
        time.sleep(0.3)
    else:
        gw.kill()
        raise RuntimeError("the gateway did not see two healthy workers")
    yield url, ws
    gw.terminate()
    gw.wait(10)
    for w in ws:
        assert w.proc.poll() is None, "a replica died"
        w.stop()


def test_worker_endpoints(replicas):
    _, ws = replicas
    info = requests.get(ws[0].url + "/get_model_info", timeout=10).json()
    assert info["served_model_name"] == MODEL and info["is_generation"] is True
    assert info["max_context_length"] > 0 and info["vocab_size"] == 49152
    assert info["eos_token_ids"]
    load = requests.get(ws[0].url + "/get_load", timeout=10).json()
    assert load["num_reqs"] == load["num_running_reqs"] + load["num_waiting_reqs"]
    server = requests.get(ws[0].url + "/get_server_info", timeout=10).json()
    assert server["max_running_requests"] > 0


def test_requests_through_the_gateway(replicas):
    url, ws = replicas
    body = {"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 12, "temperature": 0}
    for _ in range(4):
        r = requests.post(url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert "Paris" in r.json()["choices"][0]["message"]["content"]
    chunks = requests.post(url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120, stream=True)
    lines = [l for l in chunks.iter_lines(decode_unicode=True) if l]
    assert lines[-1] == "data: [DONE]"
    r = requests.post(url + "/v1/completions", json={"model": MODEL, "prompt": "The capital of France is",
                                                    "max_tokens": 4, "temperature": 0}, timeout=120)
    assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["text"]
    served = sum(w.metric("wick_generated_tokens_total") > 0 for w in ws)
    assert served >= 1


def test_vllm_metric_names(replicas):
    _, ws = replicas
    text = requests.get(ws[0].url + "/metrics", timeout=10).text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc",
                 "vllm:kv_cache_usage_perc"):
        line = next(l for l in text.splitlines() if l.startswith(name + "{"))
        assert f'model_name="{MODEL}"' in line
        value = float(line.split()[-1])
        assert 0 <= value and (value <= 1 or not name.endswith("perc"))
