#!/usr/bin/env python3
"""Replicas behind the SGLang Model Gateway (PyPI sglang-router) on loopback, as the
scale-out issue asks: 300 requests built from 20 long shared system prompts in random order,
4 at a time, against (1) one replica alone, (2) three replicas behind the gateway with
cache_aware routing, one replica killed halfway, (3) the same with round_robin. Reports the
prefix-cache hit rate over all requests (sum of usage.prompt_tokens_details.cached_tokens over
sum of prompt_tokens), failures, and whether the gateway marked the killed replica unhealthy.
Not in `make test` (minutes on a 2-core machine):

    .venv/bin/python scripts/bench_gateway.py [--requests 300] [--prompts 20] [--json]
"""
import argparse
import concurrent.futures as cf
import json
import os
import random
import socket
import subprocess
import sys
import time

import requests

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
WICK = os.environ.get("WICK_BIN", os.path.join(ROOT, "build", "bin", "wick"))
MODEL = os.environ.get("WICK_TEST_MODEL", os.path.expanduser("~/.cache/wick/models/smollm2.gguf"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(fn, what, seconds=90):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if fn():
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{what} did not come up")


def replica():
    port = free_port()
    p = subprocess.Popen([WICK, "serve", "--model", MODEL, "--port", str(port)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env={**os.environ, "WICK_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: requests.get(url + "/health", timeout=1).status_code == 200, "wick serve")
    return p, url


def gateway(urls, policy):
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *urls,
                          "--policy", policy, "--host", "127.0.0.1", "--port", str(port),
                          "--prometheus-port", str(free_port()),
                          # a dead replica found within seconds (defaults: every 60 s, 3 failures)
                          "--health-check-interval-secs", "2", "--health-failure-threshold", "2"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: sum(w["is_healthy"] for w in requests.get(url + "/workers", timeout=1).json()["workers"])
               == len(urls), "the gateway")
    return p, url


def workload(n_requests, n_prompts, seed=7):
    rng = random.Random(seed)
    topics = ["astronomy", "baking", "chess", "diving", "economics", "falconry", "geology", "harps",
              "ice hockey", "jazz", "knitting", "lighthouses", "mycology", "navigation", "opera",
              "pottery", "quilting", "robotics", "sailing", "tea"]
    systems = []
    for i in range(n_prompts):
        t = topics[i % len(topics)]
        rules = " ".join(f"Rule {k}: when asked about {t}, answer in one short sentence and mention fact {k}."
                         for k in range(14))
        systems.append(f"You are assistant number {i}, an expert on {t}. {rules}")
    out = []
    for j in range(n_requests):
        s = rng.randrange(n_prompts)
        out.append({"model": "smollm2", "max_tokens": 4, "temperature": 0,
                    "messages": [{"role": "system", "content": systems[s]},
                                 {"role": "user", "content": f"Question {j}: tell me one thing."}]})
    return out


def run(url, bodies, on_half=None):
    prompt = cached = failures = 0
    half = len(bodies) // 2

    def one(b):
        r = requests.post(url + "/v1/chat/completions", json=b, timeout=300)
        if r.status_code != 200:
            return None
        u = r.json()["usage"]
        return u["prompt_tokens"], (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)

    t0 = time.time()
    with cf.ThreadPoolExecutor(4) as ex:
        for part, chunk in enumerate((bodies[:half], bodies[half:])):
            if part == 1 and on_half:
                on_half()
            for res in ex.map(one, chunk):
                if res is None:
                    failures += 1
                else:
                    prompt += res[0]
                    cached += res[1]
    return {"requests": len(bodies), "failures": failures, "prompt_tokens": prompt,
            "cached_tokens": cached, "hit_rate": cached / max(prompt, 1), "seconds": round(time.time() - t0, 1)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    bodies = workload(a.requests, a.prompts)
    results = {}
    procs = []
    try:
        p, url = replica()
        procs.append(p)
        results["one replica"] = run(url, bodies)
        p.terminate()
        p.wait(10)
        for policy in ("cache_aware", "round_robin"):
            reps = [replica() for _ in range(3)]
            procs += [r[0] for r in reps]
            gw, gurl = gateway([r[1] for r in reps], policy)
            procs.append(gw)
            killed = reps[2]
            res = run(gurl, bodies, on_half=lambda: (killed[0].kill(), killed[0].wait(10)))
            time.sleep(12)  # the gateway's health checks
            workers = requests.get(gurl + "/workers", timeout=5).json()["workers"]
            res["killed_marked_unhealthy"] = any(w["url"] == killed[1] and not w["is_healthy"] for w in workers) \
                or all(w["url"] != killed[1] for w in workers)
            results[f"3 replicas, {policy}, one killed halfway"] = res
            for p in [gw] + [r[0] for r in reps]:
                p.terminate()
                p.wait(10)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    one = results["one replica"]["hit_rate"]
    for k, r in results.items():
        r["hit_rate_vs_one_replica"] = round(r["hit_rate"] / one, 3) if one else None
    if a.json:
        print(json.dumps(results, indent=2))
    else:
        print("| setup | requests | failures | prompt tokens | cached | hit rate | vs one replica | s | killed marked unhealthy |")
        print("|---|---|---|---|---|---|---|---|---|")
        for k, r in results.items():
            print(f"| {k} | {r['requests']} | {r['failures']} | {r['prompt_tokens']} | {r['cached_tokens']} | "
                  f"{r['hit_rate']:.3f} | {r['hit_rate_vs_one_replica']} | {r['seconds']} | "
                  f"{r.get('killed_marked_unhealthy', '-')} |")


if __name__ == "__main__":
    main()
