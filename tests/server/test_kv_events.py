"""KV-cache events (wick serve --kv-events) decoded by a subscriber that follows vLLM's published
schema: a multipart [topic, 8-byte big-endian sequence number, msgpack KVEventBatch [ts, events]],
events tagged arrays ["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium] and
["BlockRemoved", hashes, medium]. The stored blocks must be the request's own tokens block by
block, chained by parent hash; evicted blocks must come back as removed ones."""
import subprocess
import time

import pytest
import requests

from conftest import MODEL, WICK, Server, free_port

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")

BLOCK = 16


class Subscriber:
    def __init__(self, port, topic=b"kv-events"):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.connect(f"tcp://127.0.0.1:{port}")
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.topic, self.last_seq, self.events = topic, -1, []
        time.sleep(0.5)  # PUB/SUB: messages before the subscription is known are not delivered

    def drain(self, seconds=2.0):
        deadline = time.time() + seconds
        while time.time() < deadline:
            if not self.sub.poll(100):
                continue
            topic, seq, payload = self.sub.recv_multipart()
            assert topic == self.topic and len(seq) == 8
            seq = int.from_bytes(seq, "big")
            assert seq == self.last_seq + 1 or self.last_seq < 0, "sequence numbers follow each other"
            self.last_seq = seq
            ts, events = msgpack.unpackb(payload, raw=False)
            assert isinstance(ts, float) and abs(ts - time.time()) < 60
            self.events += events
        return self.events

    def close(self):
        self.sub.close(0)
        self.ctx.term()


def tokenize(text):
    out = subprocess.run([WICK, "tokenize", MODEL, text, "--json", "--add-special"],
                         capture_output=True, text=True, check=True).stdout
    return [int(t) for t in out.strip().strip("[]").split(",") if t.strip()]


def complete(url, prompt, n=4):
    r = requests.post(url + "/v1/completions", timeout=120,
                      json={"model": "smollm2", "prompt": prompt, "max_tokens": n, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def stored(events):
    return [e for e in events if e[0] == "BlockStored"]


def test_stored_blocks_are_the_prompts_blocks_chained_by_parent():
    port = free_port()
    srv = Server("--kv-events", f"tcp://127.0.0.1:{port}")
    sub = Subscriber(port)
    try:
        prompt = " ".join(f"Item {i} is a small red box on the table." for i in range(12))
        ids = tokenize(prompt)
        usage = complete(srv.url, prompt)["usage"]
        assert usage["prompt_tokens"] == len(ids)
        events = stored(sub.drain())
        n_full = len(ids) // BLOCK
        assert n_full >= 4 and len(events) >= n_full
        assert len(events) <= (usage["prompt_tokens"] + usage["completion_tokens"]) // BLOCK
        parent = None
        for i, e in enumerate(events[:n_full]):
            tag, hashes, parent_hash, token_ids, block_size, lora_id, medium = e
            assert len(hashes) == 1 and isinstance(hashes[0], int)
            assert parent_hash == parent, "each block chains to the one before"
            assert token_ids == ids[i * BLOCK:(i + 1) * BLOCK], f"block {i} holds the prompt's tokens"
            assert block_size == BLOCK and lora_id is None and medium in ("CPU", "GPU")
            parent = hashes[0]
        # the same prompt again hits the cache: nothing new is stored for its full blocks
        complete(srv.url, prompt)
        again = stored(sub.drain(1.0))[len(events):]
        assert not any(e[3] == ids[:BLOCK] for e in again), "a cached block is not stored twice"
    finally:
        sub.close()
        srv.stop()


def test_evicted_blocks_are_removed():
    port = free_port()
    # a cache of a few blocks: the second prompt evicts the first one's blocks
    srv = Server("--kv-events", f"tcp://127.0.0.1:{port}", "--kv-memory", "8", "-c", "160")
    sub = Subscriber(port)
    try:
        first = " ".join(f"Alpha {i} walks along the river." for i in range(16))
        complete(srv.url, first, n=2)
        first_hashes = {e[1][0] for e in stored(sub.drain())}
        assert first_hashes
        complete(srv.url, " ".join(f"Bravo {i} sings a quiet song." for i in range(16)), n=2)
        events = sub.drain()
        removed = {h for e in events if e[0] == "BlockRemoved" for h in e[1]}
        assert all(e[2] in ("CPU", "GPU") for e in events if e[0] == "BlockRemoved")
        assert removed and removed <= first_hashes | {e[1][0] for e in stored(events)}
        assert removed & first_hashes, "the first prompt's blocks were evicted and reported"
    finally:
        sub.close()
        srv.stop()


def test_an_address_that_cannot_be_bound_is_a_clear_error():
    r = subprocess.run([WICK, "serve", "--model", MODEL, "--port", str(free_port()), "--kv-events",
                        "nonsense://x"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "--kv-events nonsense://x" in r.stdout + r.stderr
