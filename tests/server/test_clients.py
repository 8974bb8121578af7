"""The `openai` and `ollama` Python packages against a real `wick serve`."""
import concurrent.futures as cf

import ollama
import openai
import pytest
import requests

from conftest import oa

QUESTION = "What is the capital of France?"


def test_openai_chat(server, model_name):
    r = oa(server).chat.completions.create(model=model_name, messages=[{"role": "user", "content": QUESTION}],
                                           temperature=0, max_tokens=32)
    text = r.choices[0].message.content
    assert "Paris" in text
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_openai_chat_stream_equals_non_stream(server, model_name):
    client = oa(server)
    msgs = [{"role": "system", "content": "Answer in one sentence."}, {"role": "user", "content": QUESTION}]
    full = client.chat.completions.create(model=model_name, messages=msgs, temperature=0, max_tokens=40)
    parts, usage, finish = [], None, None
    for chunk in client.chat.completions.create(model=model_name, messages=msgs, temperature=0, max_tokens=40,
                                                stream=True, stream_options={"include_usage": True}):
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                parts.append(c.delta.content)
            finish = c.finish_reason or finish
    assert "".join(parts) == full.choices[0].message.content
    assert finish == full.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == full.usage.completion_tokens


def test_openai_completions(server, model_name):
    client = oa(server)
    r = client.completions.create(model=model_name, prompt="The capital of France is", temperature=0, max_tokens=8)
    assert "Paris" in r.choices[0].text
    assert r.choices[0].finish_reason == "length"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model_name, prompt="The capital of France is", temperature=0, max_tokens=8, stream=True) if c.choices)
    assert streamed == r.choices[0].text


def test_openai_n_and_seed(server, model_name):
    client = oa(server)
    r = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Say a word."}],
                                       temperature=1.0, seed=5, n=3, max_tokens=8)
    assert len(r.choices) == 3
    again = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Say a word."}],
                                           temperature=1.0, seed=5, n=3, max_tokens=8)
    assert [c.message.content for c in r.choices] == [c.message.content for c in again.choices]


def test_openai_models(server, model_name):
    client = oa(server)
    ids = [m.id for m in client.models.list().data]
    assert "smollm2" in ids
    for name in ids:  # the SDK's retrieve: each listed model, the served one's path included
        m = client.models.retrieve(name)
        assert m.id == name and m.object == "model"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("no-such-model")
    assert e.value.body["code"] == "model_not_found"


def test_ollama_generate_and_chat(server, model_name):
    client = ollama.Client(host=server.url)
    r = client.generate(model=model_name, prompt=QUESTION, options={"temperature": 0, "num_predict": 32})
    assert "Paris" in r.response
    assert r.done and r.eval_count > 0 and r.prompt_eval_count > 0 and r.total_duration > 0
    streamed = "".join(p.response for p in client.generate(model=model_name, prompt=QUESTION, stream=True,
                                                            options={"temperature": 0, "num_predict": 32}))
    assert streamed == r.response
    c = client.chat(model=model_name, messages=[{"role": "user", "content": QUESTION}], options={"temperature": 0})
    assert "Paris" in c.message.content
    parts = [p.message.content for p in client.chat(model=model_name, messages=[{"role": "user", "content": QUESTION}],
                                                    stream=True, options={"temperature": 0})]
    assert "".join(parts) == c.message.content


def test_ollama_list_show_version(server):
    client = ollama.Client(host=server.url)
    names = [m.model for m in client.list().models]
    assert "smollm2:latest" in names
    shown = client.show("smollm2")
    assert shown.details.family == "llama"
    assert requests.get(server.url + "/api/version", timeout=5).json()["version"]


def test_eight_concurrent_greedy_requests_equal_sequential(server, model_name):
    client = oa(server)
    questions = [f"What is {a} plus {b}?" for a, b in [(1, 2), (3, 4), (10, 5), (7, 7), (2, 9), (6, 1), (8, 8), (4, 5)]]
    questions[3] = QUESTION
    def ask(q, max_tokens):
        r = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": q}],
                                           temperature=0, max_tokens=max_tokens)
        return r.choices[0].message.content
    lengths = [8, 16, 24, 32, 12, 20, 28, 10]
    alone = [ask(q, n) for q, n in zip(questions, lengths)]
    with cf.ThreadPoolExecutor(8) as ex:
        together = list(ex.map(ask, questions, lengths))
    assert together == alone


def test_openai_logprobs(server, model_name):
    import math
    client = oa(server)
    r = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": QUESTION}],
                                       temperature=0, max_tokens=10, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for t in content:
        assert t.logprob <= 0
        assert len(t.top_logprobs) == 3
        lps = [x.logprob for x in t.top_logprobs]
        assert lps == sorted(lps, reverse=True) and sum(math.exp(x) for x in lps) <= 1.0001
        assert t.top_logprobs[0].token == t.token and abs(t.top_logprobs[0].logprob - t.logprob) < 1e-5  # greedy
    assert "".join(t.token for t in content).startswith(r.choices[0].message.content[:5])
    c = client.completions.create(model=model_name, prompt="The capital of France is", temperature=0, max_tokens=4, logprobs=2)
    assert len(c.choices[0].logprobs.tokens) == 4 and len(c.choices[0].logprobs.top_logprobs[0]) == 2


def test_openai_prompt_logprobs(server, model_name):
    """vLLM's prompt_logprobs extra through the openai client: one entry per prompt
    token (the first null), each holding the token with its rank and the top
    alternatives; a prompt's entry at a position whose greedy choice is the next
    prompt token has rank 1; on chat at the top level; with stream, a 400."""
    import math
    client = oa(server)
    # the model's own greedy continuation, then that text as a prompt: teacher forcing
    prompt = "The capital of France is"
    answer = client.completions.create(model=model_name, prompt=prompt, temperature=0, max_tokens=6).choices[0].text
    c = client.completions.create(model=model_name, prompt=prompt + answer, temperature=0, max_tokens=1,
                                  extra_body={"prompt_logprobs": 2})
    lps = c.choices[0].model_extra["prompt_logprobs"]
    assert len(lps) == c.usage.prompt_tokens and lps[0] is None
    for e in lps[1:]:
        ranks = sorted(v["rank"] for v in e.values())
        assert ranks[:2] == [1, 2] and len(e) in (2, 3)  # the token, unless it is among the top 2
        assert all(v["logprob"] <= 0 for v in e.values())
        assert sum(math.exp(v["logprob"]) for v in e.values() if v["rank"] <= 2) <= 1.0001
    ids = requests.post(server.url + "/tokenize", json={"content": prompt + answer}, timeout=30).json()["tokens"]
    assert len(ids) == len(lps)
    for i in range(1, len(ids)):
        assert str(ids[i]) in lps[i]  # the prompt's own token, with its rank
    # the answer's tokens: each is what greedy picks after the tokens before it
    n_prompt = len(requests.post(server.url + "/tokenize", json={"content": prompt}, timeout=30).json()["tokens"])
    assert [lps[i][str(ids[i])]["rank"] for i in range(n_prompt, len(ids))] == [1] * (len(ids) - n_prompt)
    chat = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": QUESTION}],
                                          temperature=0, max_tokens=2, extra_body={"prompt_logprobs": 1})
    assert len(chat.model_extra["prompt_logprobs"]) == chat.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=model_name, prompt=prompt, max_tokens=1, stream=True,
                                  extra_body={"prompt_logprobs": 1})
    assert "prompt_logprobs" in str(bad.value)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model_name, prompt=prompt, max_tokens=1, extra_body={"prompt_logprobs": 21})


def test_ollama_logprobs(server, model_name):
    """Ollama's logprobs / top_logprobs through the ollama package: the same
    tokens and logprobs as OpenAI's chat for the same greedy conversation, one
    per generated token; streamed lines carry their own tokens', together the
    whole answer's; bad values are a 400."""
    client = ollama.Client(host=server.url)
    msgs = [{"role": "user", "content": QUESTION}]
    opts = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": 10}
    r = client.chat(model=model_name, messages=msgs, options=opts, logprobs=True, top_logprobs=3)
    assert len(r.logprobs) == r.eval_count
    o = oa(server).chat.completions.create(model=model_name, messages=msgs, temperature=0, max_tokens=10,
                                           logprobs=True, top_logprobs=3)
    want = o.choices[0].logprobs.content
    assert [(t.token, t.logprob) for t in r.logprobs] == [(t.token, t.logprob) for t in want]
    for got, w in zip(r.logprobs, want):
        assert [(x.token, x.logprob) for x in got.top_logprobs] == [(x.token, x.logprob) for x in w.top_logprobs]
    streamed = []
    for part in client.chat(model=model_name, messages=msgs, options=opts, logprobs=True, top_logprobs=3, stream=True):
        streamed += part.logprobs or []
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in r.logprobs]

    g = client.generate(model=model_name, prompt=QUESTION, options=opts, logprobs=True)
    assert len(g.logprobs) == g.eval_count
    assert all(t.logprob <= 0 and not t.top_logprobs for t in g.logprobs)
    assert "".join(t.token for t in g.logprobs).startswith(g.response[:8])
    assert client.generate(model=model_name, prompt=QUESTION, options=opts).logprobs is None
    for bad in ({"logprobs": True, "top_logprobs": 21}, {"top_logprobs": 2}):
        resp = requests.post(server.url + "/api/generate", json={"model": model_name, "prompt": "x", **bad}, timeout=30)
        assert resp.status_code == 400 and "top_logprobs" in resp.json()["error"]
