"""spnl's span queries against a real `wick serve`: the raw endpoint
POST /v1/query/execute (g, plus/cross, repeat, map; streaming and not) and
spnl's own client (PyPI `spnl`) over the OpenAI-compatible endpoints."""
import asyncio
import json

import pytest
import requests

from conftest import serving

NAME = "smollm2"  # the default model, by its name in the model store
DOCS = ["The capital of France is Paris.", "The capital of Peru is Lima.", "Water boils at 100 degrees."]


def rag(question, docs, name="spnl/" + NAME, max_tokens=24):
    return {"g": {"model": name, "max_tokens": max_tokens, "temperature": 0, "input": {"cross": [
        {"system": "Answer briefly from the documents."},
        {"plus": [{"user": d} for d in docs]},
        {"user": question}]}}}


def execute(server, query, stream):
    r = requests.post(server.url + "/v1/query/execute", params={"stream": "true" if stream else "false"},
                      data=json.dumps(query), headers={"Content-Type": "text/plain"}, timeout=120, stream=stream)
    assert r.status_code == 200, r.text
    if not stream:
        return r.json()
    texts = {}
    lines = [l for l in r.iter_lines(decode_unicode=True) if l]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        assert line.startswith("data: ")
        for c in json.loads(line[6:])["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + c["text"]
    return texts


def test_g_with_plus_answers_from_the_documents(server):
    out = execute(server, rag("What is the capital of France?", DOCS), stream=False)
    assert out["object"] == "chat.completion"
    assert "Paris" in out["choices"][0]["message"]["content"]
    assert out["usage"]["prompt_tokens"] > 30


def test_stream_equals_non_stream(server):
    q = rag("What is the capital of France?", DOCS)
    full = execute(server, q, stream=False)["choices"][0]["message"]["content"]
    assert execute(server, q, stream=True) == {0: full}


def test_repeat_and_map(server):
    rep = execute(server, {"repeat": {"n": 3, "g": {"model": NAME, "input": {"user": "Say one word."},
                                                     "max_tokens": 4, "temperature": 0}}}, stream=False)
    assert [c["index"] for c in rep["choices"]] == [0, 1, 2]
    m = {"map": {"metadata": {"model": NAME, "max_tokens": 4, "temperature": 0},
                 "inputs": ["The capital of France is", "One, two,"]}}
    out = execute(server, m, stream=False)
    assert out["object"] == "text_completion"
    assert [c["index"] for c in out["choices"]] == [0, 1]
    assert "Paris" in out["choices"][0]["text"]
    streamed = execute(server, m, stream=True)
    assert streamed == {c["index"]: c["text"] for c in out["choices"]}


@pytest.mark.parametrize("query,param", [
    ({"par": []}, "query"),
    ({"g": {"model": NAME, "input": {"cross": [{"user": "a"}, {"plus": [{"user": 3}]}]}}}, "g.input.cross[1].plus[0]"),
    ({"g": {"model": NAME}}, "g.input"),
    ({"repeat": {"n": 0, "g": {"model": NAME, "input": {"user": "x"}}}}, "repeat.n"),
])
def test_bad_queries_are_400s_naming_the_node(server, query, param):
    r = requests.post(server.url + "/v1/query/execute", data=json.dumps(query), timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_completions_take_a_list_of_prompts_and_latest_names(server):
    r = requests.post(server.url + "/v1/completions", timeout=60, json={
        "model": NAME + ":latest", "prompt": ["The capital of France is", "One, two,"], "max_tokens": 4,
        "temperature": 0, "n": 2})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert choices[0]["text"] == choices[1]["text"]  # greedy: both choices of one prompt agree
    assert "Paris" in choices[0]["text"]


def test_spnl_client_over_openai(server, monkeypatch):
    spnl = pytest.importorskip("spnl")
    monkeypatch.setenv("OPENAI_API_BASE", server.url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    name = "openai/" + NAME
    plain = asyncio.run(spnl.execute(json.dumps(
        {"g": {"model": name, "input": {"user": "What is the capital of France?"}, "max_tokens": 16,
               "temperature": 0}})))
    assert "Paris" in plain.data
    withdocs = asyncio.run(spnl.execute(json.dumps(rag("What is the capital of France?", DOCS, name))))
    assert "Paris" in withdocs.data
    rep = asyncio.run(spnl.execute(json.dumps(
        {"repeat": {"n": 2, "g": {"model": name, "input": {"user": "Say hi"}, "max_tokens": 8, "temperature": 0.5}}})))
    assert rep.data
    m = asyncio.run(spnl.execute(json.dumps(
        {"map": {"metadata": {"model": name, "max_tokens": 6, "temperature": 0},
                 "inputs": ["The capital of France is", "One, two,"]}})))
    assert "Paris" in m.data


@pytest.fixture(scope="module")
def span_server():
    yield from serving("--span-cache")


def test_span_cache_reuses_documents_in_any_order(span_server):
    docs = [d + " " + " ".join(f"Note {i} on this topic." for i in range(12)) for d in DOCS]
    first = execute(span_server, rag("What is the capital of France?", docs), stream=False)
    assert first["usage"]["span_cache"]["misses"] == 3
    assert "Paris" in first["choices"][0]["message"]["content"]
    again = execute(span_server, rag("What is the capital of Peru?", docs[::-1]), stream=False)
    sc = again["usage"]["span_cache"]
    assert sc["hits"] == 3 and sc["misses"] == 0
    assert sc["tokens_reused"] > 0 and sc["tokens_recomputed"] > 0
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= sc["tokens_reused"]
    assert "Lima" in again["choices"][0]["message"]["content"]
    assert span_server.metric("wick_span_cache_hits_total") >= 3
    assert span_server.metric("wick_span_tokens_reused_total") >= sc["tokens_reused"]


def test_span_repair_extras_count_exactly(span_server):
    """`span_recompute` and `span_blend` on `g`: every span token computed again
    with blend 1 (reused none), the first K alone with blend 0; bad values are 400s."""
    docs = [d + " " + " ".join(f"Fact {i} of the blend test." for i in range(10)) for d in DOCS]
    execute(span_server, rag("Warm up.", docs), stream=False)  # the documents cached
    q = rag("What is the capital of Peru?", docs[::-1])
    q["g"].update({"span_recompute": 0, "span_blend": 1})
    everything = execute(span_server, q, stream=False)["usage"]["span_cache"]
    assert everything["hits"] == 3 and everything["tokens_reused"] == 0
    q["g"].update({"span_recompute": 4, "span_blend": 0})
    first = execute(span_server, q, stream=False)["usage"]["span_cache"]
    # the first span follows the system message: all three are repaired
    assert first["tokens_recomputed"] == 3 * 4
    assert first["tokens_reused"] == everything["tokens_recomputed"] - 12
    q["g"].update({"span_recompute": 0, "span_blend": 0.2})
    blend = execute(span_server, q, stream=False)["usage"]["span_cache"]
    assert 0 < blend["tokens_recomputed"] < everything["tokens_recomputed"]
    assert blend["tokens_reused"] + blend["tokens_recomputed"] == everything["tokens_recomputed"]
    q["g"]["span_blend"] = 1.5
    r = requests.post(span_server.url + "/v1/query/execute", data=json.dumps(q), timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "g.span_blend"


def test_continue_final_message_continues_the_answer(server):
    """A greedy answer cut at a word boundary and sent back as the assistant's last message
    (continue_final_message) is continued with the rest of the same answer: on the chat
    endpoint and on span queries."""
    msgs = [{"role": "user", "content": "List three colours of the rainbow, separated by commas."}]
    chat = {"model": NAME, "max_tokens": 16, "temperature": 0}
    r = requests.post(server.url + "/v1/chat/completions", json={**chat, "messages": msgs}, timeout=60)
    assert r.status_code == 200, r.text
    full = r.json()["choices"][0]["message"]["content"]
    cut = full.index(" ", 1)
    head = full[:cut]
    r = requests.post(server.url + "/v1/chat/completions", timeout=60, json={
        **chat, "max_tokens": 24, "continue_final_message": True,
        "messages": msgs + [{"role": "assistant", "content": head}]})
    assert r.status_code == 200, r.text
    assert (head + r.json()["choices"][0]["message"]["content"]).startswith(full)

    q = rag("What is the capital of France?", DOCS)
    answer = execute(server, q, stream=False)["choices"][0]["message"]["content"]
    cut = answer.index(" ", 1)
    q["g"]["input"]["cross"].append({"assistant": answer[:cut]})
    q["g"]["continue_final_message"] = True
    rest = execute(server, q, stream=False)["choices"][0]["message"]["content"]
    assert (answer[:cut] + rest).startswith(answer)

    r = requests.post(server.url + "/v1/chat/completions", timeout=60,
                      json={**chat, "messages": msgs, "continue_final_message": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message", r.text


def test_span_context_extra_keys_the_cache_by_the_system_message(span_server):
    """`span_context` on `g`: documents computed after the system message are
    cached under it: found again in another order (the first document, right
    after its context, needs no repair), not by another system message nor
    when computed alone; a non-boolean is a 400."""
    docs = [d + " " + " ".join(f"Line {i} of the context test." for i in range(10)) for d in DOCS]
    q = rag("What is the capital of Peru?", docs)
    q["g"].update({"span_context": True, "span_recompute": 4, "span_blend": 0})
    first = execute(span_server, q, stream=False)["usage"]["span_cache"]
    assert first["misses"] == 3 and first["tokens_recomputed"] == 2 * 4
    q["g"]["input"]["cross"][1]["plus"].reverse()
    again = execute(span_server, q, stream=False)
    assert again["usage"]["span_cache"]["hits"] == 3 and again["usage"]["span_cache"]["misses"] == 0
    assert again["usage"]["span_cache"]["tokens_recomputed"] == 2 * 4
    assert "Lima" in again["choices"][0]["message"]["content"]
    other = json.loads(json.dumps(q))
    other["g"]["input"]["cross"][0]["system"] = "Reply in one word."
    assert execute(span_server, other, stream=False)["usage"]["span_cache"]["misses"] == 3
    q["g"]["span_context"] = False
    alone = execute(span_server, q, stream=False)["usage"]["span_cache"]
    assert alone["misses"] == 3 and alone["tokens_recomputed"] == 3 * 4
    q["g"]["span_context"] = 1
    r = requests.post(span_server.url + "/v1/query/execute", data=json.dumps(q), timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "g.span_context"


def test_serve_span_context_is_the_default_for_span_queries():
    """`wick serve --span-context`: queries that do not say are computed after
    the system message (the first document needs no repair; a repeat hits)."""
    from conftest import Server
    s = Server("--span-cache", "--span-context", "--span-recompute", "4", "--span-blend", "0")
    try:
        docs = [d + " " + " ".join(f"Entry {i} of the default test." for i in range(10)) for d in DOCS]
        first = execute(s, rag("What is the capital of France?", docs), stream=False)["usage"]["span_cache"]
        assert first["misses"] == 3 and first["tokens_recomputed"] == 2 * 4
        again = execute(s, rag("What is the capital of Peru?", docs[::-1]), stream=False)["usage"]["span_cache"]
        assert again["hits"] == 3 and again["tokens_recomputed"] == 2 * 4
        q = rag("What is the capital of Peru?", docs)
        q["g"]["span_context"] = False  # the request's extra wins
        assert execute(s, q, stream=False)["usage"]["span_cache"]["misses"] == 3
        assert s.proc.poll() is None
    finally:
        s.stop()


def test_prompt_logprobs_on_g_leave_span_tokens_out(span_server):
    """`prompt_logprobs` on `g` (vLLM's extra): the documents' tokens come from the span
    cache (null entries); the question's tokens are computed (entries); streamed, a 400."""
    docs = [d + " " + " ".join(f"Line {i} of the logprobs test." for i in range(6)) for d in DOCS]
    execute(span_server, rag("Warm up.", docs), stream=False)
    q = rag("What is the capital of Peru?", docs[::-1], max_tokens=1)
    q["g"]["prompt_logprobs"] = 1
    out = execute(span_server, q, stream=False)
    lps = out["prompt_logprobs"]
    assert len(lps) == out["usage"]["prompt_tokens"] and lps[0] is None
    n_null = sum(e is None for e in lps)
    assert n_null >= out["usage"]["span_cache"]["tokens_reused"]  # every span token, at least
    assert all(e is not None for e in lps[-5:])  # the question, computed
    r = requests.post(span_server.url + "/v1/query/execute", params={"stream": "true"}, data=json.dumps(q), timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "g.prompt_logprobs"


# spnl's marker layout (`wick serve --span-markers PLUS,CROSS,PAD`): ids of
# SmolLM2's vocabulary, as spnl's deployments use 10, 13 and 27.
PLUS, CROSS, PAD, BLOCK = 10, 13, 27, 16


@pytest.fixture(scope="module")
def marker_server():
    yield from serving("--span-markers", f"{PLUS},{CROSS},{PAD}")


def test_marker_layout_queries_reuse_documents_without_repair(marker_server):
    """Span queries laid out with the markers: each document a span from its PLUS,
    found again in any order, reused whole (--span-recompute defaults to 0: a model
    trained with block attention needs no repair); the answer is the same cold and warm."""
    docs = [d + " " + " ".join(f"Remark {i} on the markers." for i in range(8)) for d in DOCS]
    first = execute(marker_server, rag("What is the capital of Peru?", docs), stream=False)
    assert first["usage"]["span_cache"]["misses"] == 3
    again = execute(marker_server, rag("What is the capital of Peru?", docs), stream=False)
    sc = again["usage"]["span_cache"]
    assert sc["hits"] == 3 and sc["misses"] == 0 and sc["tokens_recomputed"] == 0
    assert sc["tokens_reused"] >= sum(len(d) // 8 for d in docs)  # the documents' tokens, at least
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    moved = execute(marker_server, rag("What is the capital of Peru?", docs[::-1]), stream=False)
    assert moved["usage"]["span_cache"]["hits"] == 3
    info = requests.get(marker_server.url + "/get_server_info", timeout=10).json()
    assert info["span_cache"] is True
    assert info["span_markers"] == {"plus": PLUS, "cross": CROSS, "pad": PAD, "block_size": BLOCK}


def tokenize(server, text):
    r = requests.post(server.url + "/tokenize", json={"content": text}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def marked(server, docs, question):
    """Prompt ids laid out as spnl lays them out: system, each document after PAD to a
    block boundary and PLUS, then PAD, CROSS and the question with the generation prompt."""
    ids = tokenize(server, "<|im_start|>system\nAnswer briefly.<|im_end|>\n")
    for d in docs:
        ids += [PAD] * (-len(ids) % BLOCK) + [PLUS]
        ids += tokenize(server, f"<|im_start|>user\n{d}<|im_end|>\n")
    ids += [PAD] * (-len(ids) % BLOCK) + [CROSS]
    return ids + tokenize(server, f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")


def complete(server, prompt, **kw):
    r = requests.post(server.url + "/v1/completions", timeout=120,
                      json={"prompt": prompt, "max_tokens": 12, "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def test_token_id_prompts_get_the_spans_their_markers_lay_out(marker_server):
    """A client that lays out ids itself (spnl's tokenize_query, then /v1/completions):
    each aligned PLUS opens a span; cold and warm give the same tokens; a list of id
    prompts is one completion each; a text prompt is never read for markers."""
    docs = [f"Document {k}: " + " ".join(f"fact {k}.{i}" for i in range(12)) for k in range(3)]
    ids = marked(marker_server, docs, "What does document 1 say?")
    assert ids[::BLOCK].count(PLUS) == 3 and ids[::BLOCK].count(CROSS) == 1
    cold = complete(marker_server, ids)
    assert cold["usage"]["span_cache"] == {"hits": 0, "misses": 3, "tokens_reused": 0, "tokens_recomputed": 0}
    warm = complete(marker_server, ids)
    assert warm["usage"]["span_cache"]["hits"] == 3
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] >= warm["usage"]["span_cache"]["tokens_reused"] > 0
    assert warm["choices"][0]["text"] == cold["choices"][0]["text"]
    both = complete(marker_server, [ids, marked(marker_server, docs[::-1], "And document 2?")])
    assert [c["index"] for c in both["choices"]] == [0, 1]
    assert both["choices"][0]["text"] == cold["choices"][0]["text"]
    assert both["usage"]["span_cache"]["hits"] == 6
    text = complete(marker_server, "One + two = three. " * 20)
    assert "span_cache" not in text["usage"]
    r = requests.post(marker_server.url + "/v1/completions", timeout=30,
                      json={"prompt": ["text", [1, 2]], "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_span_markers_outside_the_vocabulary_stop_the_start():
    from conftest import Server
    with pytest.raises(RuntimeError, match="outside"):
        Server("--span-markers", "10,13,999999")
    with pytest.raises(RuntimeError, match="span markers"):
        Server("--span-markers", "10,13")


def test_prepare_caches_the_documents_for_execute(span_server):
    """spnl's POST /v1/query/prepare (`spnl --prepare`): the query's documents computed
    into the span cache with no answer (no choices, the usage); execute then hits them
    all. Streamed, the usage comes as one SSE chunk before [DONE]; a bad query is a 400."""
    docs = [d + " " + " ".join(f"Prepared line {i}." for i in range(9)) for d in DOCS]
    q = rag("What is the capital of France?", docs)
    r = requests.post(span_server.url + "/v1/query/prepare", params={"stream": "false"},
                      data=json.dumps(q), headers={"Content-Type": "text/plain"}, timeout=120)
    assert r.status_code == 200, r.text
    prep = r.json()
    assert prep["choices"] == [] and prep["usage"]["span_cache"]["misses"] == 3
    assert prep["usage"]["completion_tokens"] <= 1
    out = execute(span_server, rag("What is the capital of Peru?", docs[::-1]), stream=False)
    assert out["usage"]["span_cache"]["hits"] == 3 and out["usage"]["span_cache"]["misses"] == 0
    assert "Lima" in out["choices"][0]["message"]["content"]
    docs2 = [d + " Also prepared by a stream." for d in docs]
    r = requests.post(span_server.url + "/v1/query/prepare", params={"stream": "true"},
                      data=json.dumps(rag("Q?", docs2)), timeout=120)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    lines = [l for l in r.text.splitlines() if l]
    assert lines[-1] == "data: [DONE]" and len(lines) == 2
    chunk = json.loads(lines[0][6:])
    assert chunk["choices"] == [] and chunk["usage"]["span_cache"]["misses"] == 3
    again = execute(span_server, rag("Q?", docs2), stream=False)["usage"]["span_cache"]
    assert again["hits"] == 3
    bad = requests.post(span_server.url + "/v1/query/prepare", data='{"g": {"model": "x"}}', timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "g.input"
