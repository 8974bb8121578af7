"""`wick serve --device cuda` end to end on the CUDA emulator (the `wick-emu` binary,
docs/cuda_emu.md): the HTTP server, the engine's thread and the CUDA backend together,
with the openai client, on a machine with no GPU. Every kernel is emulated (a decode
step of the default model takes ~4 s of one core), so the answers are short and the
prompts repeat (the prefix cache serves them). WICK_BIN points at wick-emu
(tests/CMakeLists.txt, emu.server)."""
import os
import sys
import threading
import time

import requests

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "server"))
import conftest as c  # noqa: E402  (the server tests' helpers: Server, oa)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
OTHER = [{"role": "user", "content": "Name a colour."}]
EMU_ENV = {"WICK_EMU_GPU_MB": "1024"}  # (the KV cache is sized from it: keep it small)


def ask(server, messages, n, **kw):
    return c.oa(server).chat.completions.create(model=c.MODEL, messages=messages, temperature=0,
                                                max_tokens=n, **kw)


def text(server, messages, n):
    return ask(server, messages, n).choices[0].message.content


def test_gpu_answers_as_the_cpu_and_survives_a_hang_up():
    cpu = c.Server("--device", "cpu")  # the same binary's CPU backend
    try:
        want = {"q7": text(cpu, QUESTION, 7), "q3": text(cpu, QUESTION, 3), "o3": text(cpu, OTHER, 3)}
    finally:
        cpu.stop()
    gpu = c.Server("--device", "cuda", env=EMU_ENV)
    try:
        got = text(gpu, QUESTION, 7)
        assert "Paris" in got
        assert got == want["q7"]
        # streamed: the same text
        streamed = "".join(ch.choices[0].delta.content or ""
                           for ch in ask(gpu, QUESTION, 3, stream=True) if ch.choices)
        assert streamed == want["q3"]
        # two requests at once (one batch on the device) answer as each alone on the CPU
        out = {}
        threads = [threading.Thread(target=lambda k=k, m=m: out.__setitem__(k, text(gpu, m, 3)))
                   for k, m in (("q3", QUESTION), ("o3", OTHER))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert out == {"q3": want["q3"], "o3": want["o3"]}
        # a client that hangs up mid-stream: the server frees its blocks and answers on
        r = requests.post(gpu.url + "/v1/chat/completions", stream=True, timeout=120,
                          json={"model": c.MODEL, "messages": QUESTION, "max_tokens": 200,
                                "stream": True})
        next(r.iter_lines())
        r.close()
        deadline = time.time() + 120
        while time.time() < deadline and (gpu.metric("wick_kv_blocks_used") > 0
                                          or gpu.metric("wick_running_sequences") > 0):
            time.sleep(0.5)
        assert gpu.metric("wick_kv_blocks_used") == 0
        assert text(gpu, OTHER, 3) == want["o3"]
        assert gpu.proc.poll() is None, "the server died"
    finally:
        gpu.stop()
