#!/usr/bin/env python3
"""Bounded load test of `wick serve` on loopback.

Starts a server (or uses --url), runs --streams concurrent streaming chat
clients for --seconds, of which --hangup hang up mid-stream, then checks: no
5xx, the server alive and healthy, KV blocks back to zero, memory flat (RSS
after a warm-up round against the end). Prints a summary; exit 1 on failure.
Traffic goes to 127.0.0.1 only; every loop is bounded in count and time.

usage: load_test.py [--streams 64] [--seconds 120] [--hangup 0.1] [--wick build/bin/wick] [--model PATH]
"""
import argparse
import json
import os
import random
import sys
import threading
import time

import requests

sys.path.insert(0, os.path.dirname(__file__))
from conftest import Server  # noqa: E402


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def client(url, stop_at, hangup, stats, lock, rng):
    prompts = ["Tell me about Paris.", "Write a haiku about the sea.", "What is 2+2?", "Name three colours.",
               "Explain rain to a child.", "Give me a recipe for tea."]
    while time.time() < stop_at:
        body = {"messages": [{"role": "user", "content": rng.choice(prompts)}], "stream": True,
                "max_tokens": rng.randint(8, 64), "temperature": 0.7, "seed": rng.randint(0, 1 << 30)}
        hang = rng.random() < hangup
        t0 = time.time()
        try:
            with requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=120) as r:
                code = r.status_code
                n = 0
                for line in r.iter_lines():
                    if line.startswith(b"data: {"):
                        n += 1
                        if hang and n >= 3:
                            break
                with lock:
                    stats["status"][code] = stats["status"].get(code, 0) + 1
                    stats["hangups" if hang else "completed"] += 1
                    stats["chunks"] += n
                    stats["latency"].append(time.time() - t0)
        except requests.RequestException as e:
            with lock:
                stats["errors"].append(str(e)[:200])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--hangup", type=float, default=0.1)
    ap.add_argument("--wick", default=os.environ.get("WICK_BIN", "build/bin/wick"))
    ap.add_argument("--model", default=os.environ.get("WICK_TEST_MODEL", os.path.expanduser("~/.cache/wick/models/smollm2.gguf")))
    a = ap.parse_args()
    os.environ["WICK_BIN"], os.environ["WICK_TEST_MODEL"] = a.wick, a.model
    import conftest
    conftest.WICK, conftest.MODEL = a.wick, a.model
    srv = Server("--http-threads", str(max(8, a.streams + 8)))
    try:
        lock = threading.Lock()
        def run(seconds, streams):
            stats = {"status": {}, "completed": 0, "hangups": 0, "chunks": 0, "latency": [], "errors": []}
            stop_at = time.time() + seconds
            ts = [threading.Thread(target=client, args=(srv.url, stop_at, a.hangup, stats, lock, random.Random(i)))
                  for i in range(streams)]
            for t in ts: t.start()
            for t in ts: t.join(seconds + 180)
            return stats
        run(min(10, a.seconds / 4), min(a.streams, 8))  # warm-up: buffers and caches reach their size
        rss0 = rss_kib(srv.proc.pid)
        t0 = time.time()
        stats = run(a.seconds, a.streams)
        wall = time.time() - t0
        deadline = time.time() + 30
        while time.time() < deadline and (srv.metric("wick_kv_blocks_used") > 0 or srv.metric("wick_running_sequences") > 0):
            time.sleep(0.2)
        rss1 = rss_kib(srv.proc.pid)
        alive = srv.proc.poll() is None
        health = requests.get(srv.url + "/health", timeout=5).status_code if alive else 0
        blocks = srv.metric("wick_kv_blocks_used") if alive else -1
        n5xx = sum(v for k, v in stats["status"].items() if k >= 500)
        lat = sorted(stats["latency"]) or [0]
        summary = {
            "streams": a.streams, "seconds": round(wall, 1), "requests": stats["completed"] + stats["hangups"],
            "completed": stats["completed"], "hung_up": stats["hangups"], "status": stats["status"],
            "client_errors": len(stats["errors"]), "chunks_per_s": round(stats["chunks"] / wall, 1),
            "latency_p50_s": round(lat[len(lat) // 2], 2), "latency_p99_s": round(lat[int(len(lat) * 0.99) - 1 if len(lat) > 1 else 0], 2),
            "rss_after_warmup_mib": round(rss0 / 1024, 1), "rss_end_mib": round(rss1 / 1024, 1),
            "kv_blocks_used_at_end": blocks, "server_alive": alive, "health": health,
        }
        print(json.dumps(summary, indent=1))
        ok = alive and health == 200 and n5xx == 0 and blocks == 0 and not stats["errors"] and rss1 <= rss0 * 1.25 + 16384
        if stats["errors"]:
            print("client errors:", stats["errors"][:5])
        print("PASS" if ok else "FAIL")
        sys.exit(0 if ok else 1)
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
