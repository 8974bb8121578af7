"""Issue 17 over real HTTP: model names stay in the store, the Host check
against DNS rebinding, invalid UTF-8 and deep JSON as 400s, header limits,
and requests nobody reads are cancelled (a client that hung up without
streaming, a 429 on a later choice)."""
import json
import os
import socket
import time

import requests

from conftest import MODEL, TIME_SCALE, Server

MSG = [{"role": "user", "content": "hi"}]
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"  # a prompt the model continues for thousands of tokens


def post(server, path, body, **kw):
    data = body if isinstance(body, bytes) else json.dumps(body)
    return requests.post(server.url + path, data=data, timeout=30 * TIME_SCALE, **kw)


def message(r):
    j = r.json()
    return j["error"] if isinstance(j["error"], str) else j["error"]["message"]


def raw(server, data, timeout=10):
    """Sends bytes on a fresh connection; returns the whole answer."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while True:
            b = s.recv(65536)
            if not b:
                return out
            out += b


def status_of(answer):
    return int(answer.split(b" ", 2)[1])


def eventually(cond, seconds=5.0):
    deadline = time.time() + seconds * TIME_SCALE
    while not cond():
        if time.time() > deadline:
            return False
        time.sleep(0.05)
    return True


def idle(server):
    return server.metric("wick_running_sequences") == 0 and server.metric("wick_kv_blocks_used") == 0


def test_model_names_resolve_only_inside_the_store(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    os.symlink(MODEL, store / "escape.gguf")  # a real model, but outside the store
    s = Server(env={"WICK_MODELS": str(store)})
    try:
        refused = ["../../../etc/passwd", "/etc/passwd", "escape", "..", "no-such-model",
                   os.path.relpath(MODEL, store), os.path.relpath(MODEL, store)[:-len(".gguf")]]
        for name in refused:
            for path, body in [("/api/show", {"model": name}),
                               ("/api/chat", {"model": name, "messages": MSG, "stream": False}),
                               ("/api/generate", {"model": name, "prompt": "hi", "stream": False}),
                               ("/v1/chat/completions", {"model": name, "messages": MSG}),
                               ("/v1/completions", {"model": name, "prompt": "hi"})]:
                r = post(s, path, body)
                # one answer for all: whether a file exists there is not told
                assert r.status_code == 404, (path, name, r.text)
                assert message(r) == f"The model '{name}' does not exist", (path, name, r.text)
        assert "escape" not in requests.get(s.url + "/v1/models", timeout=5).text
        assert "escape" not in requests.get(s.url + "/api/tags", timeout=5).text
        # the operator's --model (a path) is still served by that name and by default
        assert post(s, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 1}).status_code == 200
        assert post(s, "/v1/completions", {"prompt": "hi", "max_tokens": 1}).status_code == 200
    finally:
        s.stop()


def test_a_foreign_host_header_is_refused(server):
    for host in ("evil.example.com", "evil.example.com:%d" % server.port, "localhost.evil.com", "10.0.0.1"):
        r = requests.get(server.url + "/health", headers={"Host": host}, timeout=5)
        assert r.status_code == 403, (host, r.text)
        assert r.json()["error"]["code"] == "host_not_allowed"
        r = post(server, "/v1/chat/completions", {"messages": MSG, "max_tokens": 1}, headers={"Host": host})
        assert r.status_code == 403, (host, r.text)
    for host in ("localhost:%d" % server.port, "localhost", "127.0.0.1", "127.0.0.2:80", "[::1]:%d" % server.port):
        assert requests.get(server.url + "/health", headers={"Host": host}, timeout=5).status_code == 200, host


def test_allowed_hosts_adds_names():
    s = Server("--allowed-hosts", "my.box,other.box:9000")
    try:
        for host, code in (("my.box", 200), ("other.box:1234", 200), ("evil.example.com", 403), ("localhost", 200)):
            assert requests.get(s.url + "/health", headers={"Host": host}, timeout=5).status_code == code, host
    finally:
        s.stop()


def test_a_foreign_origin_is_refused(server):
    """A page of another origin cannot make the server work, even with a body that needs
    no preflight (text/plain); loopback pages get CORS headers and their preflight is
    answered; clients outside a browser send no Origin and pass."""
    body = json.dumps({"prompt": "x", "max_tokens": 1})
    for origin in ("https://evil.example.com", "http://localhost.evil.com", "null"):
        r = requests.post(server.url + "/v1/completions", data=body, timeout=30,
                          headers={"Origin": origin, "Content-Type": "text/plain"})
        assert r.status_code == 403, (origin, r.text)
        assert r.json()["error"]["code"] == "origin_not_allowed"
        assert "Access-Control-Allow-Origin" not in r.headers
        pre = requests.options(server.url + "/v1/completions", timeout=5,
                               headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
        assert pre.status_code == 403 and "Access-Control-Allow-Origin" not in pre.headers
    page = "http://localhost:5173"
    r = requests.post(server.url + "/v1/completions", data=body, timeout=30, headers={"Origin": page})
    assert r.status_code == 200, r.text
    assert r.headers["Access-Control-Allow-Origin"] == page and "Origin" in r.headers["Vary"]
    pre = requests.options(server.url + "/v1/chat/completions", timeout=5,
                           headers={"Origin": page, "Access-Control-Request-Method": "POST",
                                    "Access-Control-Request-Headers": "authorization, content-type"})
    assert pre.status_code == 204
    assert pre.headers["Access-Control-Allow-Origin"] == page
    assert "POST" in pre.headers["Access-Control-Allow-Methods"]
    assert pre.headers["Access-Control-Allow-Headers"] == "authorization, content-type"
    assert requests.post(server.url + "/v1/completions", data=body, timeout=30).status_code == 200


def test_allowed_origins_add_pages_and_preflights_need_no_key():
    s = Server("--allowed-origins", "https://ui.example:3000", "--api-key", "sekret")
    try:
        ui = {"Origin": "https://ui.example:3000"}
        pre = requests.options(s.url + "/v1/models", timeout=5,
                               headers={**ui, "Access-Control-Request-Method": "GET"})
        assert pre.status_code == 204 and pre.headers["Access-Control-Allow-Origin"] == ui["Origin"]
        assert "Authorization" in pre.headers["Access-Control-Allow-Headers"]
        assert requests.get(s.url + "/v1/models", headers=ui, timeout=5).status_code == 401
        r = requests.get(s.url + "/v1/models", headers={**ui, "Authorization": "Bearer sekret"}, timeout=5)
        assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == ui["Origin"]
        assert requests.get(s.url + "/v1/models", timeout=5,
                            headers={"Origin": "https://ui.example:3001",
                                     "Authorization": "Bearer sekret"}).status_code == 403
    finally:
        s.stop()
    s = Server(env={"WICK_ALLOWED_ORIGINS": "*"})
    try:
        r = requests.get(s.url + "/health", headers={"Origin": "https://anything.example"}, timeout=5)
        assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "https://anything.example"
    finally:
        s.stop()


def test_invalid_utf8_is_a_400_naming_the_byte_offset(server):
    for path, body, bad in [
            ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi\xff there"}]}', b"\xff"),
            ("/api/generate", b'{"model": "smollm2", "prompt": "caf\xc3"}', b"\xc3")]:  # a cut-off sequence
        r = post(server, path, body)
        assert r.status_code == 400, r.text
        assert f"not valid UTF-8 (byte offset {body.index(bad)})" in message(r), r.text


def test_deep_json_is_a_400(server):
    r = post(server, "/v1/chat/completions", b'{"messages": ' + b"[" * 200000 + b"]" * 200000 + b"}")
    assert r.status_code == 400, r.text
    assert "nests deeper than 64 levels" in message(r)


def test_header_limits(server):
    get = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    assert status_of(raw(server, get + b"X-Fine: " + b"a" * 4000 + b"\r\n\r\n")) == 200
    one_big = raw(server, get + b"X-Big: " + b"a" * 200000 + b"\r\n\r\n")
    assert status_of(one_big) == 431 and b"headers_too_large" in one_big, one_big[:200]
    many = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 40) for i in range(5000))
    assert status_of(raw(server, get + many + b"\r\n")) == 431
    long_line = raw(server, b"GET /health?" + b"q" * 200000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert status_of(long_line) == 431
    assert requests.get(server.url + "/health", timeout=5).status_code == 200


def test_a_non_streaming_client_that_hangs_up_cancels_its_request(server):
    assert eventually(lambda: idle(server))
    body = json.dumps({"prompt": COUNTING, "max_tokens": 3000, "temperature": 0}).encode()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    assert eventually(lambda: server.metric("wick_running_sequences") == 1)
    time.sleep(0.5)
    assert server.metric("wick_running_sequences") == 1  # still generating: 3000 tokens take long
    s.close()
    assert eventually(lambda: idle(server), seconds=3), "the request ran on after its client left"


def test_a_429_on_a_later_choice_cancels_the_earlier_ones():
    s = Server("--max-queue", "2")
    try:
        r = post(s, "/v1/completions", {"prompt": COUNTING, "max_tokens": 3000, "temperature": 0, "n": 3})
        assert r.status_code == 429, r.text
        # uncancelled, the two queued choices would hold the queue for their 3000 tokens
        again = lambda: post(s, "/v1/completions", {"prompt": COUNTING, "max_tokens": 2, "n": 2}).status_code == 200
        assert eventually(again, seconds=10), "choices nobody reads kept running"  # 3000 tokens: ~30 s
        assert eventually(lambda: idle(s), seconds=10)
    finally:
        s.stop()
