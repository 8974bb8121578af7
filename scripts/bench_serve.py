#!/usr/bin/env python3
"""Decode rate of `wick serve`, for one or more binaries side by side, and
llama.cpp's `llama-server` beside them.

For each --wick binary (and --llama-server) in turn (rounds interleaved:
A B A B ...), starts the server on loopback, sends a warm-up request, then
for each count in --streams that many concurrent greedy chat requests of
--tokens tokens each (ignore_eos), and prints the generated tokens per
second over the wall clock and the server's CPU milliseconds (user +
system, /proc) per generated token. Both use every core unless
WICK_THREADS / --llama-threads say otherwise; llama-server gets as many
slots (-np) as the most streams.

With --prompt-words N it also times the first token of a streamed request
whose prompt is N words (about N tokens), each
request's words unique so that no prefix cache serves it: the median of
--ttft-requests requests, in ms, and the prompt tokens the server counted.

Standard library only. Example (docs/perf.md, session 70):
  scripts/bench_serve.py --wick /tmp/wick-before --wick build/bin/wick \
      --llama-server ~/.cache/wick/peers/llama.cpp-0.3.36/build/bin/llama-server
"""
import argparse
import json
import os
import random
import socket
import subprocess
import threading
import time
import urllib.request


VOCAB = ("the of and to in is that it was for on are as with his they at be this from have or by one had "
         "not but what all were when we there can an your which their said if do will each about how up out "
         "them then she many some so these would other into has more her two like him see time could no make "
         "than first been its who now people my made over did down only way find use may water long little "
         "very after words called just where most know").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def post(url, body):
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def run_streams(url, n_streams, n_tokens):
    """n_streams concurrent requests; returns the tokens they generated."""
    counts = [0] * n_streams

    def one(i):
        body = {"messages": [{"role": "user", "content": f"Tell me a story about the number {i}."}],
                "temperature": 0, "max_tokens": n_tokens, "ignore_eos": True}
        counts[i] = post(url, body)["usage"]["completion_tokens"]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n_streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts)


def ttft(url, n_words, tag):
    """Milliseconds to the first streamed content of a prompt of n_words
    words (unique to tag), and its prompt tokens."""
    rng = random.Random(tag)  # common words in an order of the tag's: ~1 token a word
    words = " ".join(rng.choice(VOCAB) for _ in range(n_words))
    body = {"messages": [{"role": "user", "content": f"{tag}: {words}"}], "temperature": 0,
            "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0, first, n_prompt = time.time(), None, 0
    try:
        r = urllib.request.urlopen(req, timeout=600)
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{e}: {e.read()[:300]!r}") from None
    with r:
        for line in r:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                n_prompt = chunk["usage"]["prompt_tokens"]
            if first is None and any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                first = time.time()
    return 1000 * ((first or time.time()) - t0), n_prompt


def measure(cmd, streams, n_tokens, prompt_words=0, n_ttft=0):
    """cmd(port): the server's command line."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(cmd(port), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            if proc.poll() is not None:  # (a crash at load: say so now, not after a minute)
                raise RuntimeError(f"{cmd(port)[0]} exited with status {proc.returncode} before it served")
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"{cmd(port)[0]} did not start")
        run_streams(url, 1, 16)  # warm-up
        out = []
        for n in streams:
            c0, t0 = cpu_seconds(proc.pid), time.time()
            n_gen = run_streams(url, n, n_tokens)
            dt, cpu = time.time() - t0, cpu_seconds(proc.pid) - c0
            out.append((n, n_gen / dt, 1000 * cpu / n_gen))
        ttfts = []
        if prompt_words:
            ttft(url, prompt_words, "warm")
            ttfts = [ttft(url, prompt_words, f"r{time.time_ns()}") for _ in range(n_ttft)]
        return out, ttfts
    finally:
        proc.terminate()
        proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wick", action="append", help="a wick binary (repeat to compare; default build/bin/wick)")
    ap.add_argument("--model", default=os.environ.get("WICK_TEST_MODEL",
                                                      os.path.expanduser("~/.cache/wick/models/smollm2.gguf")))
    ap.add_argument("--streams", default="1,4", help="concurrent requests, comma-separated")
    ap.add_argument("--tokens", type=int, default=128, help="tokens each request generates")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--serve-args", default="", help="more `wick serve` arguments")
    ap.add_argument("--llama-server", help="llama.cpp's llama-server, run beside")
    ap.add_argument("--prompt-words", type=int, default=0, help="also time the first token of prompts this long")
    ap.add_argument("--ttft-requests", type=int, default=3, help="requests timed for --prompt-words")
    ap.add_argument("--llama-threads", type=int, default=os.cpu_count(), help="its -t")
    a = ap.parse_args()
    streams = [int(s) for s in a.streams.split(",")]
    servers = [(w, lambda port, w=w: [w, "serve", "--model", a.model, "--port", str(port), *a.serve_args.split()])
               for w in a.wick or ["build/bin/wick"]]
    if a.llama_server:
        ctx = max(streams) * (a.tokens + 128 + 4 * a.prompt_words)
        servers.append((a.llama_server, lambda port: [
            a.llama_server, "-m", a.model, "--port", str(port), "-t", str(a.llama_threads),
            "-np", str(max(streams)), "-c", str(ctx)]))
    print(f"model {a.model}, {a.tokens} tokens a request, OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}")
    print("| binary | round | streams | generated tok/s | server CPU ms / token |")
    print("|---|---|---|---|---|")
    for r in range(a.rounds):
        for name, cmd in servers:
            out, ttfts = measure(cmd, streams, a.tokens, a.prompt_words, a.ttft_requests)
            for n, rate, ms in out:
                print(f"| {name} | {r + 1} | {n} | {rate:.1f} | {ms:.1f} |", flush=True)
            if ttfts:
                ms = sorted(t for t, _ in ttfts)
                print(f"| {name} | {r + 1} | TTFT ms, {ttfts[0][1]} prompt tokens | median {ms[len(ms) // 2]:.0f} "
                      f"({', '.join(f'{t:.0f}' for t in ms)}) | |", flush=True)


if __name__ == "__main__":
    main()
