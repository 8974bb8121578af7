#!/usr/bin/env python3
"""Soak test of `wick serve` on loopback: mixed traffic for a bounded time.

Starts a server (the default model), then runs --streams concurrent clients
for --seconds. Each client loops over requests drawn from: OpenAI chat,
completions and responses, Ollama chat and generate, streaming and not; --hangup of the
streaming ones hang up after a few chunks; --hostile of all requests are
malformed or hostile (a body past --max-body, invalid UTF-8, max_tokens far
past the limit, JSON nested past the limit, n at its limit and past it, a
foreign Host header, a model name that climbs out of the store, an image
input item).

Afterwards it checks: no 5xx (and no hostile request answered 2xx, except n
at its limit, which is valid), the server alive and healthy, KV blocks and
running sequences back to zero, resident memory flat after the warm-up (the
slope of RSS over time is reported; the end may exceed the start by at most
25 % + 16 MiB), and /metrics consistent with what the clients counted: per
endpoint and status, wick_requests_total equals the clients' count, and
wick_generated_tokens_total covers at least the tokens the non-streaming
responses reported. Prints a JSON summary; exit 1 on failure.

Bounded: loopback only, every loop ends at the deadline, every request has a
timeout. usage: soak.py [--streams 128] [--seconds 600] [--hangup 0.1]
[--hostile 0.05] [--wick build/bin/wick] [--model PATH]
"""
import argparse
import json
import os
import random
import re
import sys
import threading
import time

import requests

sys.path.insert(0, os.path.dirname(__file__))
import conftest  # noqa: E402

MAX_BODY = 1 << 20  # the server runs with --max-body 1 MiB so oversized bodies stay cheap
PROMPTS = ["Tell me about Paris.", "Write a haiku about the sea.", "What is 2+2?", "Name three colours.",
           "Explain rain to a child.", "Give me a recipe for tea.", "Count to five."]


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def normal_request(rng, hangup):
    """(endpoint, body, stream, hang up after k chunks or 0)."""
    kind = rng.choice(["chat", "completions", "ollama_chat", "ollama_generate", "responses"])
    stream = rng.random() < 0.6
    hang = rng.randint(1, 4) if stream and rng.random() < hangup else 0
    n_out = rng.randint(4, 24)
    msgs = [{"role": "user", "content": rng.choice(PROMPTS)}]
    seed = rng.randint(0, 1 << 30)
    if kind == "chat":
        body = {"messages": msgs, "max_tokens": n_out, "stream": stream, "seed": seed, "temperature": 0.7}
        return "/v1/chat/completions", body, stream, hang
    if kind == "responses":  # half of them kept in the response store
        body = {"input": rng.choice(PROMPTS), "max_output_tokens": n_out, "stream": stream, "seed": seed,
                "temperature": 0.7, "store": rng.random() < 0.5}
        return "/v1/responses", body, stream, hang
    if kind == "completions":
        body = {"prompt": rng.choice(PROMPTS), "max_tokens": n_out, "stream": stream, "seed": seed}
        return "/v1/completions", body, stream, hang
    opts = {"num_predict": n_out, "seed": seed}
    if kind == "ollama_chat":
        return "/api/chat", {"model": "smollm2", "messages": msgs, "stream": stream, "options": opts}, stream, hang
    return "/api/generate", {"model": "smollm2", "prompt": rng.choice(PROMPTS), "stream": stream,
                             "options": opts}, stream, hang


def hostile_request(rng):
    """(name, endpoint, raw body bytes, extra headers, expected statuses)."""
    msgs = [{"role": "user", "content": "hi"}]
    kind = rng.choice(["oversized", "bad_utf8", "huge_max_tokens", "deep_json", "n_at_limit", "n_past_limit",
                       "foreign_host", "path_traversal", "negative_max_tokens", "responses_image"])
    ep = "/v1/chat/completions"
    hdr = {"Content-Type": "application/json"}
    j = lambda b: json.dumps(b).encode()  # noqa: E731
    if kind == "oversized":
        body = b'{"messages":[{"role":"user","content":"' + b"x" * (MAX_BODY + 1024) + b'"}]}'
        return kind, ep, body, hdr, {413}
    if kind == "bad_utf8":
        return kind, ep, b'{"messages":[{"role":"user","content":"a\xff\xfeb"}]}', hdr, {400}
    if kind == "huge_max_tokens":
        return kind, "/v1/completions", j({"prompt": "x", "max_tokens": 10 ** 12}), hdr, {400}
    if kind == "negative_max_tokens":
        return kind, "/v1/completions", j({"prompt": "x", "max_tokens": -5}), hdr, {400}
    if kind == "deep_json":
        return kind, ep, b'{"messages":' + b"[" * 5000 + b"]" * 5000 + b"}", hdr, {400}
    if kind == "n_at_limit":
        return kind, "/v1/completions", j({"prompt": "Hi", "n": 8, "max_tokens": 2}), hdr, {200, 429}
    if kind == "n_past_limit":
        return kind, "/v1/completions", j({"prompt": "Hi", "n": 1 << 40, "max_tokens": 2}), hdr, {400}
    if kind == "responses_image":
        item = {"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}
        return kind, "/v1/responses", j({"input": [item]}), hdr, {400}
    if kind == "foreign_host":
        return kind, ep, j({"messages": msgs, "max_tokens": 2}), {**hdr, "Host": "evil.example.com"}, {403}
    return kind, "/api/chat", j({"model": "../../../etc/passwd", "messages": msgs}), hdr, {404}


class Counts:
    def __init__(self):
        self.lock = threading.Lock()
        self.status = {}       # (endpoint, status) -> n, as the server should count them
        self.hostile = {}      # kind -> {status: n}
        self.unexpected = []   # hostile requests answered otherwise than expected
        self.errors = []       # transport errors on normal requests
        self.hung_up = 0
        self.completed = 0
        self.usage_tokens = 0  # completion tokens reported by non-streaming responses

    def add(self, endpoint, status):
        with self.lock:
            self.status[(endpoint, status)] = self.status.get((endpoint, status), 0) + 1


def run_normal(url, rng, hangup, c):
    ep, body, stream, hang = normal_request(rng, hangup)
    try:
        with requests.post(url + ep, json=body, stream=stream, timeout=300) as r:
            c.add(ep, r.status_code)
            if r.status_code != 200:
                return
            if not stream:
                d = r.json()
                usage = d.get("usage", {})
                tokens = usage.get("completion_tokens", usage.get("output_tokens", d.get("eval_count", 0)))
                with c.lock:
                    c.completed += 1
                    c.usage_tokens += tokens
                return
            n = 0
            for line in r.iter_lines():
                if line and line != b"data: [DONE]":
                    n += 1
                if hang and n >= hang:
                    break
            with c.lock:
                if hang:
                    c.hung_up += 1
                else:
                    c.completed += 1
    except requests.RequestException as e:
        with c.lock:
            c.errors.append(f"{ep}: {str(e)[:160]}")


def run_hostile(url, rng, c):
    kind, ep, body, hdr, expect = hostile_request(rng)
    try:
        r = requests.post(url + ep, data=body, headers=hdr, timeout=300)
        status = r.status_code
    except requests.ConnectionError:
        status = "reset"  # a server may close on an oversized body before answering
    with c.lock:
        c.hostile.setdefault(kind, {})
        c.hostile[kind][status] = c.hostile[kind].get(status, 0) + 1
        if status not in expect and not (kind == "oversized" and status == "reset"):
            c.unexpected.append((kind, status))
    # counted by the endpoint's handler only when it got there
    if isinstance(status, int) and kind not in ("oversized", "foreign_host"):
        c.add(ep, status)


def client(url, stop_at, a, c, seed):
    rng = random.Random(seed)
    while time.time() < stop_at:
        if rng.random() < a.hostile:
            run_hostile(url, rng, c)
        else:
            run_normal(url, rng, a.hangup, c)


def server_counts(url):
    counts, generated = {}, 0.0
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        m = re.match(r'wick_requests_total\{endpoint="([^"]*)",status="(\d+)"\} (\S+)', line)
        if m:
            counts[(m[1], int(m[2]))] = int(float(m[3]))
        elif line.startswith("wick_generated_tokens_total "):
            generated = float(line.split()[1])
    return counts, generated


def slope_mib_per_min(samples):
    """Least-squares slope of (seconds, KiB) samples, in MiB per minute."""
    if len(samples) < 2:
        return 0.0
    n = len(samples)
    mt = sum(t for t, _ in samples) / n
    mr = sum(r for _, r in samples) / n
    var = sum((t - mt) ** 2 for t, _ in samples)
    cov = sum((t - mt) * (r - mr) for t, r in samples)
    return cov / var * 60 / 1024 if var else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--hangup", type=float, default=0.1)
    ap.add_argument("--hostile", type=float, default=0.05)
    ap.add_argument("--warmup", type=float, default=None, help="seconds of warm-up (default: min(30, seconds/4))")
    ap.add_argument("--wick", default=os.environ.get("WICK_BIN", "build/bin/wick"))
    ap.add_argument("--model", default=conftest.MODEL)
    a = ap.parse_args()
    conftest.WICK, conftest.MODEL = a.wick, a.model
    srv = conftest.Server("--http-threads", str(a.streams + 8), "--max-body", str(MAX_BODY))
    try:
        pid = srv.proc.pid
        c = Counts()

        def run(seconds, streams, seed0):
            stop_at = time.time() + seconds
            ts = [threading.Thread(target=client, args=(srv.url, stop_at, a, c, seed0 + i), daemon=True)
                  for i in range(streams)]
            for t in ts:
                t.start()
            return ts

        warm = a.warmup if a.warmup is not None else min(30.0, a.seconds / 4)
        # at full concurrency, so that buffers, KV pages and caches reach their size first
        for t in run(warm, a.streams, 10_000):
            t.join(warm + 330)
        rss0 = rss_kib(pid)
        t0 = time.time()
        samples = [(0.0, rss0)]
        ts = run(a.seconds, a.streams, 0)
        while any(t.is_alive() for t in ts) and time.time() < t0 + a.seconds + 330:
            time.sleep(min(5.0, max(0.5, a.seconds / 60)))
            if srv.proc.poll() is not None:
                break
            samples.append((time.time() - t0, rss_kib(pid)))
        wall = time.time() - t0
        alive = srv.proc.poll() is None
        deadline = time.time() + 60
        while alive and time.time() < deadline and (srv.metric("wick_kv_blocks_used") > 0
                                                     or srv.metric("wick_running_sequences") > 0):
            time.sleep(0.2)
        time.sleep(0.5)  # a non-streaming request is counted just after its response
        rss1 = rss_kib(pid) if alive else 0
        health = requests.get(srv.url + "/health", timeout=5).status_code if alive else 0
        blocks = srv.metric("wick_kv_blocks_used") if alive else -1
        running = srv.metric("wick_running_sequences") if alive else -1
        counts, generated = server_counts(srv.url) if alive else ({}, 0)
        # the warm-up's requests are in the server's counters too: c holds both
        mismatched = {f"{ep} {st}": {"clients": n, "server": counts.get((ep, st), 0)}
                      for (ep, st), n in sorted(c.status.items()) if counts.get((ep, st), 0) != n}
        n5xx = sum(n for (_, st), n in c.status.items() if st >= 500)
        slope = slope_mib_per_min([s for s in samples if s[0] >= 0])
        summary = {
            "streams": a.streams, "seconds": round(wall, 1), "warmup_s": warm,
            "requests": sum(c.status.values()) + sum(sum(v.values()) for k, v in c.hostile.items()
                                                     if k in ("oversized", "foreign_host")),
            "completed": c.completed, "hung_up": c.hung_up,
            "status": {f"{ep} {st}": n for (ep, st), n in sorted(c.status.items())},
            "hostile": {k: {str(s): n for s, n in v.items()} for k, v in sorted(c.hostile.items())},
            "hostile_unexpected": c.unexpected[:10], "client_errors": len(c.errors),
            "server_5xx": n5xx, "metrics_mismatches": mismatched,
            "generated_tokens_total": generated, "usage_tokens_non_streaming": c.usage_tokens,
            "rss_after_warmup_mib": round(rss0 / 1024, 1), "rss_end_mib": round(rss1 / 1024, 1),
            "rss_max_mib": round(max(r for _, r in samples) / 1024, 1),
            "rss_slope_mib_per_min": round(slope, 2),
            "kv_blocks_used_at_end": blocks, "running_at_end": running,
            "server_alive": alive, "health": health,
        }
        print(json.dumps(summary, indent=1))
        checks = {
            "server alive and healthy": alive and health == 200,
            "no 5xx": n5xx == 0,
            "hostile requests refused as expected": not c.unexpected,
            "no transport errors on normal requests": not c.errors,
            "KV blocks and sequences back to zero": blocks == 0 and running == 0,
            "RSS flat after warm-up": alive and rss1 <= rss0 * 1.25 + 16384,
            "/metrics requests match the clients": not mismatched,
            "/metrics generated tokens cover the responses": generated >= c.usage_tokens,
            "traffic ran": c.completed > 0 and (a.hangup == 0 or c.hung_up > 0 or a.seconds < 20),
        }
        for name, ok in checks.items():
            print(("ok   " if ok else "FAIL ") + name)
        if c.errors:
            print("client errors:", c.errors[:5])
        ok = all(checks.values())
        print("PASS" if ok else "FAIL")
        sys.exit(0 if ok else 1)
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
