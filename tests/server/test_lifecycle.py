"""Model lifecycle (keep_alive, /api/ps, load and unload, copy, delete, pull,
create), embeddings and token utilities against a real `wick serve`, with the
`ollama` and `openai` packages where they have the call."""
import base64
import concurrent.futures as cf
import datetime as dt
import math
import os
import shutil
import struct
import sys
import time

import ollama
import openai
import pytest
import requests

from conftest import MODEL, Server, serving

HERE = os.path.dirname(os.path.abspath(__file__))


def post(s, path, body, method="POST"):
    return requests.request(method, s.url + path, json=body, timeout=120)


def ps_names(s):
    return [m["name"] for m in requests.get(s.url + "/api/ps", timeout=5).json()["models"]]


def rss_bytes(s):
    with open(f"/proc/{s.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def until(cond, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A model store holding the default model as 'lc' (a hard link, or a copy)."""
    d = tmp_path_factory.mktemp("store")
    try:
        os.link(MODEL, d / "lc.gguf")
    except OSError:
        shutil.copy(MODEL, d / "lc.gguf")
    return d


@pytest.fixture(scope="module")
def lc_server(store):
    yield from serving(env={"WICK_MODELS": str(store)})


def generate(s, model="lc", prompt="Say hi.", **extra):
    r = post(s, "/api/generate", {"model": model, "prompt": prompt, "stream": False,
                                  "options": {"num_predict": 4, "temperature": 0}, **extra})
    assert r.status_code == 200, r.text
    return r.json()


# ---- keep_alive, /api/ps, load and unload -------------------------------------------------------

def test_keep_alive_0_unloads_and_frees_the_memory(lc_server):
    s = lc_server
    base = rss_bytes(s)
    generate(s, keep_alive=-1)  # loaded, with its engine and KV cache
    loaded = rss_bytes(s)
    assert "lc:latest" in ps_names(s)
    grown = loaded - base
    assert grown > 40 << 20, f"loading a second model grew RSS by {grown >> 20} MiB only"
    r = ollama.Client(host=s.url).generate(model="lc", prompt="", keep_alive=0)
    assert r.done and r.done_reason == "unload"
    assert until(lambda: "lc:latest" not in ps_names(s))
    # the engine, weights and KV go within a step of the engine thread
    assert until(lambda: rss_bytes(s) < loaded - grown * 0.8), \
        f"RSS {rss_bytes(s) >> 20} MiB after unloading; {base >> 20} before loading, {loaded >> 20} loaded"
    # a request with keep_alive 0 unloads after it answers
    generate(s, keep_alive=0)
    assert until(lambda: "lc:latest" not in ps_names(s))


def test_empty_prompt_loads_and_ps_lists_the_model(lc_server):
    s = lc_server
    r = post(s, "/api/generate", {"model": "lc", "keep_alive": "1h"}).json()
    assert r["done"] is True and r["done_reason"] == "load" and r["response"] == ""
    ps = ollama.Client(host=s.url).ps()
    entry = next(m for m in ps.models if m.model == "lc:latest")
    assert entry.size == os.path.getsize(MODEL)
    assert entry.size_vram == 0  # the CPU backend
    assert entry.details.family == "llama"
    left = (entry.expires_at - dt.datetime.now(dt.timezone.utc)).total_seconds()
    assert 3500 < left <= 3600, left
    # chat: no messages loads, keep_alive 0 unloads
    r = post(s, "/api/chat", {"model": "lc", "messages": [], "keep_alive": "-1"}).json()
    assert r["done_reason"] == "load" and r["message"] == {"role": "assistant", "content": ""}
    never = [m for m in requests.get(s.url + "/api/ps", timeout=5).json()["models"] if m["name"] == "lc:latest"]
    assert never[0]["expires_at"].startswith("9999-")
    r = post(s, "/api/chat", {"model": "lc", "keep_alive": 0}).json()
    assert r["done_reason"] == "unload"
    assert "lc:latest" not in ps_names(s)
    # unloading a model that is not loaded does not load it
    assert post(s, "/api/generate", {"model": "lc", "keep_alive": 0}).json()["done_reason"] == "unload"
    assert "lc:latest" not in ps_names(s)
    assert post(s, "/api/generate", {"model": "nope", "keep_alive": 0}).status_code == 404


def test_a_short_expiry_unloads_after_the_set_time(lc_server):
    s = lc_server
    t0 = time.time()
    generate(s, keep_alive="2s")
    entry = next(m for m in requests.get(s.url + "/api/ps", timeout=5).json()["models"] if m["name"] == "lc:latest")
    expires = dt.datetime.fromisoformat(entry["expires_at"].replace("Z", "+00:00")).timestamp()
    assert t0 < expires < time.time() + 2.5
    time.sleep(1.0)
    assert "lc:latest" in ps_names(s), "unloaded before its keep-alive ran out"
    assert until(lambda: "lc:latest" not in ps_names(s), timeout=6)
    assert time.time() - t0 >= 2.0


def test_openai_requests_take_keep_alive_too(lc_server):
    s = lc_server
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
    r = client.chat.completions.create(model="lc", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                       extra_body={"keep_alive": 0})
    assert r.choices[0].message.content is not None
    assert until(lambda: "lc:latest" not in ps_names(s))
    bad = post(s, "/v1/completions", {"model": "lc", "prompt": "hi", "keep_alive": "soon"})
    assert bad.status_code == 400 and "keep_alive" in bad.text


def test_a_request_during_unload_never_fails(lc_server):
    s = lc_server
    stop = time.time() + 6

    def unloader():
        n = 0
        while time.time() < stop:
            assert post(s, "/api/generate", {"model": "lc", "keep_alive": 0}).status_code == 200
            n += 1
            time.sleep(0.02)
        return n

    def user(i):
        results = []
        while time.time() < stop or len(results) < 3:
            body = {"model": "lc", "prompt": f"Count to {i}.", "stream": i % 2 == 0, "keep_alive": 0,
                    "options": {"num_predict": 3}}
            r = post(s, "/api/generate", body)
            results.append((r.status_code, r.text))
        return results

    with cf.ThreadPoolExecutor(5) as ex:
        unloads = ex.submit(unloader)
        users = [ex.submit(user, i) for i in range(4)]
        results = [x for f in users for x in f.result()]
        assert unloads.result() > 10
    assert len(results) >= 12
    for code, text in results:
        assert code == 200, text
        assert '"done":true' in text.replace(" ", ""), text


# ---- copy, delete, pull, create ----------------------------------------------------------------

def test_copy_and_delete_inside_the_store(lc_server, store):
    s = lc_server
    client = ollama.Client(host=s.url)
    assert client.copy("lc:latest", "lc-copy").status == "success"
    assert (store / "lc-copy.gguf").exists()
    assert "lc-copy:latest" in [m.model for m in client.list().models]
    assert generate(s, model="lc-copy", keep_alive=-1)["done"]
    assert "lc-copy:latest" in ps_names(s)
    # a loaded model is unloaded first, then deleted
    assert client.delete("lc-copy").status == "success"
    assert not (store / "lc-copy.gguf").exists()
    assert "lc-copy:latest" not in ps_names(s)
    assert post(s, "/api/generate", {"model": "lc-copy", "prompt": "hi"}).status_code == 404
    assert post(s, "/api/delete", {"model": "lc-copy"}, "DELETE").status_code == 404


def test_copy_and_delete_refuse_names_outside_the_store(lc_server, store, tmp_path):
    s = lc_server
    outside = tmp_path / "victim.gguf"
    outside.write_text("not a model")
    os.symlink(outside, store / "escape.gguf")
    try:
        for name in ["../victim", str(outside), str(outside)[:-5], "escape", "..", "no-such"]:
            r = post(s, "/api/delete", {"model": name}, "DELETE")
            assert r.status_code == 404, (name, r.text)
            r = post(s, "/api/copy", {"source": name, "destination": "stolen"})
            assert r.status_code == 404, (name, r.text)
        assert outside.exists() and (store / "escape.gguf").is_symlink()
        assert not (store / "stolen.gguf").exists()
        for dest in ["../evil", "/tmp/evil", "a/b", ".hidden", ""]:
            r = post(s, "/api/copy", {"source": "lc", "destination": dest})
            assert r.status_code == 400, (dest, r.text)
        assert not (store.parent / "evil.gguf").exists() and not os.path.exists("/tmp/evil.gguf")
        r = post(s, "/api/copy", {"source": "lc", "destination": "escape"})
        assert r.status_code == 409 and "already exists" in r.text
        r = post(s, "/api/delete", {"model": MODEL}, "DELETE")  # the operator's --model
        assert r.status_code in (400, 404) and os.path.exists(MODEL)
    finally:
        os.unlink(store / "escape.gguf")


def test_pull_and_create_say_how_to_add_a_model(lc_server, store):
    s = lc_server
    client = ollama.Client(host=s.url)
    assert client.pull("lc").status == "success"  # already in the store
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("llama3.2")
    assert e.value.status_code == 404
    assert "no network" in str(e.value) and str(store) in str(e.value) and "llama3.2.gguf" in str(e.value)
    r = post(s, "/api/create", {"model": "mine", "from": "lc"})
    assert r.status_code == 501 and str(store) in r.json()["error"]


# ---- embeddings --------------------------------------------------------------------------------

PARA = ["The cat sat on the mat.", "A cat was sitting on the mat."]
OTHER = "Quarterly revenue rose five percent on strong cloud sales."


def cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_openai_embeddings_batch_invariant_and_meaningful(server, model_name):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    texts = PARA + [OTHER]
    batch = client.embeddings.create(model=model_name, input=texts)
    assert [d.index for d in batch.data] == [0, 1, 2]
    vecs = [d.embedding for d in batch.data]
    for t, v in zip(texts, vecs):
        alone = client.embeddings.create(model=model_name, input=t).data[0].embedding
        assert alone == v, "the same text gave another vector alone than in a batch"
        assert abs(sum(x * x for x in v) - 1) < 1e-4
    assert len(vecs[0]) == 576  # SmolLM2-135M's n_embd
    assert cos(vecs[0], vecs[1]) > cos(vecs[0], vecs[2])
    assert cos(vecs[0], vecs[1]) > cos(vecs[1], vecs[2])
    assert batch.usage.prompt_tokens == batch.usage.total_tokens > 10
    # base64: the float32 values' bytes
    raw = requests.post(server.url + "/v1/embeddings", json={"input": PARA[0], "encoding_format": "base64"},
                        timeout=60).json()["data"][0]["embedding"]
    b = base64.b64decode(raw)
    assert list(struct.unpack(f"<{len(b) // 4}f", b)) == vecs[0]
    # token ids give what their text gives
    ids = requests.post(server.url + "/tokenize", json={"content": PARA[0]}, timeout=10).json()["tokens"]
    by_ids = client.embeddings.create(model=model_name, input=[ids]).data[0].embedding
    assert by_ids == vecs[0]


def test_embeddings_bad_input_is_a_400(server):
    for body, says in [({"input": ""}, "empty"), ({"input": []}, "empty"), ({"input": 5}, "must be"),
                       ({}, "required"), ({"input": "x", "dimensions": 7}, "576 dimensions"),
                       ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
                       ({"input": [[1, 99999999]]}, "vocabulary"), ({"input": "word " * 5000}, "context holds")]:
        r = requests.post(server.url + "/v1/embeddings", json=body, timeout=30)
        assert r.status_code == 400, (body, r.text)
        assert says in r.json()["error"]["message"], (body, r.text)


def test_ollama_embed_matches_openai(server, model_name):
    client = ollama.Client(host=server.url)
    r = client.embed(model=model_name, input=PARA)
    oa = requests.post(server.url + "/v1/embeddings", json={"model": model_name, "input": PARA}, timeout=60).json()
    assert r.embeddings == [d["embedding"] for d in oa["data"]]
    assert r.prompt_eval_count == oa["usage"]["prompt_tokens"]
    one = client.embed(model=model_name, input=PARA[1], keep_alive="10m").embeddings
    assert one == [r.embeddings[1]]
    legacy = client.embeddings(model=model_name, prompt=PARA[0])
    assert list(legacy.embedding) == r.embeddings[0]
    show = client.show(model_name)
    assert show.modelinfo["wick.pooling"] == "mean"


def test_ollama_embed_truncates_to_the_context():
    # truncate (default true) keeps the first n_ctx tokens; false refuses. A small
    # context, so that the truncated input is 256 tokens, not the default's thousands
    # (a 4,096-token prefill was 50 s of this suite on two cores).
    s = Server("--ctx-size", "256")
    try:
        client = ollama.Client(host=s.url)
        long = "word " * 1000
        kept = client.embed(model=MODEL, input=long)
        assert len(kept.embeddings[0]) == 576
        assert kept.prompt_eval_count == 256
        with pytest.raises(ollama.ResponseError) as e:
            client.embed(model=MODEL, input=long, truncate=False)
        assert e.value.status_code == 400
    finally:
        s.stop()


def test_last_token_pooling_is_selectable():
    s = Server("--pooling", "last")
    try:
        show = requests.post(s.url + "/api/show", json={"model": MODEL}, timeout=30).json()
        assert show["model_info"]["wick.pooling"] == "last"
        last = requests.post(s.url + "/api/embed", json={"model": MODEL, "input": PARA[0]}, timeout=60).json()
        assert len(last["embeddings"][0]) == 576
    finally:
        s.stop()


# ---- token utilities ---------------------------------------------------------------------------

def reference_tokenizer():
    from tokenizers import Tokenizer
    sys.path.insert(0, os.path.join(HERE, "..", "python"))  # make_text_fixtures and its gguf_meta
    from make_text_fixtures import smollm2_tokenizer_json
    return Tokenizer.from_str(smollm2_tokenizer_json(MODEL))


TEXTS = ["Hello world", "  leading spaces and\ttabs\n", "12345 digits", "naïve café — 東京 🚀",
         "def f(x):\n    return x ** 2\n", "<|im_start|>user\nhi<|im_end|>"]


def test_tokenize_and_detokenize_match_tokenizers(server):
    ref = reference_tokenizer()
    for text in TEXTS:
        r = requests.post(server.url + "/tokenize", json={"content": text}, timeout=10)
        assert r.status_code == 200, r.text
        ids = r.json()["tokens"]
        assert ids == ref.encode(text, add_special_tokens=False).ids, text
        back = requests.post(server.url + "/detokenize", json={"tokens": ids}, timeout=10).json()["content"]
        assert back == text == ref.decode(ids, skip_special_tokens=False)
    pieces = requests.post(server.url + "/tokenize", json={"content": "Hello world", "with_pieces": True},
                           timeout=10).json()["tokens"]
    assert [p["piece"] for p in pieces] == ["Hello", " world"]
    assert [p["id"] for p in pieces] == ref.encode("Hello world", add_special_tokens=False).ids
    # parse_special false: special-token text is plain text
    plain = requests.post(server.url + "/tokenize", json={"content": "<|im_end|>", "parse_special": False},
                          timeout=10).json()["tokens"]
    assert len(plain) > 1
    for path, body in [("/tokenize", {}), ("/tokenize", {"content": 5}), ("/detokenize", {"tokens": [-1]}),
                       ("/detokenize", {"tokens": [10 ** 9]}), ("/detokenize", {"tokens": "x"}),
                       ("/apply-template", {}), ("/tokenize", {"content": "x", "model": "nope"})]:
        r = requests.post(server.url + path, json=body, timeout=10)
        assert r.status_code in (400, 404), (path, body, r.text)


def test_apply_template_is_the_chat_prompt(server, model_name):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    prompt = requests.post(server.url + "/apply-template", json={"messages": msgs}, timeout=10).json()["prompt"]
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>") and prompt.endswith("<|im_start|>assistant\n")
    ids = requests.post(server.url + "/tokenize", json={"content": prompt}, timeout=10).json()["tokens"]
    r = requests.post(server.url + "/v1/chat/completions", json={"model": model_name, "messages": msgs, "max_tokens": 1},
                      timeout=60).json()
    assert r["usage"]["prompt_tokens"] == len(ids)
