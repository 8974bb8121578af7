"""The <think> reasoning split end to end: a random-weight Qwen3-shaped model with the real
Qwen3 tokenizer and chat template (which names <think>), forced by a grammar to answer
"<think>REASONING</think>CONTENT", served by `wick serve`; OpenAI chat (whole and streamed),
Ollama chat (`think`), the Responses API's reasoning item, /api/show's capability and
--reasoning-format none, through the `openai` and `ollama` packages."""
import json

import ollama
import pytest
import requests

from conftest import Server, oa, qwen3_vocab_model, serving

# the answer the grammar forces: reasoning in tags, then the content
GRAMMAR = 'root ::= "<think>" [a-z]{2,6} " " [a-z]{2,6} "</think>" [a-z]{3,8}'
MSGS = [{"role": "user", "content": "Why is the sky blue?"}]


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory):
    """The Qwen3-vocabulary model (conftest): its template thinks in <think> tags."""
    return qwen3_vocab_model(tmp_path_factory.mktemp("thinking-qwen3"))


@pytest.fixture(scope="module")
def server(thinking_model):
    yield from serving(model=thinking_model)


def split(text):
    """What the answer's text holds: (reasoning, content)."""
    assert text.startswith("<think>") and "</think>" in text, text
    reasoning, content = text[len("<think>"):].split("</think>", 1)
    return reasoning, content


def test_openai_chat_splits_the_reasoning(server):
    client = oa(server)
    kw = dict(model="", messages=MSGS, temperature=0, max_tokens=64, extra_body={"grammar": GRAMMAR})
    r = client.chat.completions.create(**kw)
    m = r.choices[0].message
    reasoning = m.model_extra["reasoning_content"]
    assert reasoning and " " in reasoning and "<think>" not in reasoning and "</think>" not in reasoning
    assert m.content and m.content.isalpha() and r.choices[0].finish_reason == "stop"
    # the raw answer, as --reasoning-format none would leave it, is the two joined
    raw = client.completions.create(model="", prompt=chat_prompt_ids(server), temperature=0, max_tokens=64,
                                    extra_body={"grammar": GRAMMAR}).choices[0].text
    assert split(raw) == (reasoning, m.content)
    # streamed: the reasoning deltas, then the content deltas, equal the whole
    parts = {"reasoning_content": "", "content": ""}
    order = []
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            for key in parts:
                piece = c.delta.content if key == "content" else (c.delta.model_extra or {}).get(key)
                if piece:
                    parts[key] += piece
                    if not order or order[-1] != key:
                        order.append(key)
    assert parts == {"reasoning_content": reasoning, "content": m.content}
    assert order == ["reasoning_content", "content"]


def chat_prompt_ids(server):
    """The chat endpoint's prompt as token ids (its special tokens parsed)."""
    r = requests.post(server.url + "/apply-template", json={"messages": MSGS}, timeout=30)
    r.raise_for_status()
    ids = requests.post(server.url + "/tokenize", json={"content": r.json()["prompt"]}, timeout=30)
    return ids.json()["tokens"]


def test_thinking_off_leaves_the_content_alone(server):
    """enable_thinking false: the template closes an empty <think> itself; the answer is content."""
    r = oa(server).chat.completions.create(
        model="", messages=MSGS, temperature=0, max_tokens=16, extra_body={
            "grammar": 'root ::= [a-z]{3,8}', "chat_template_kwargs": {"enable_thinking": False}})
    m = r.choices[0].message
    assert m.content.isalpha() and not (m.model_extra or {}).get("reasoning_content")


def test_ollama_think(server, thinking_model):
    assert "thinking" in ollama.Client(host=server.url).show(thinking_model).capabilities
    body = {"model": thinking_model, "messages": MSGS, "stream": False, "think": True, "grammar": GRAMMAR,
            "options": {"temperature": 0, "num_predict": 64}}
    j = requests.post(server.url + "/api/chat", json=body, timeout=60).json()
    chat = oa(server).chat.completions.create(model="", messages=MSGS, temperature=0, max_tokens=64,
                                              extra_body={"grammar": GRAMMAR}).choices[0].message
    assert j["message"]["thinking"] == chat.model_extra["reasoning_content"]
    assert j["message"]["content"] == chat.content
    # streamed as NDJSON: thinking lines, then content lines
    lines = [json.loads(x) for x in requests.post(server.url + "/api/chat", json={**body, "stream": True},
                                                  timeout=60).text.splitlines() if x]
    assert "".join(x["message"].get("thinking", "") for x in lines) == j["message"]["thinking"]
    assert "".join(x["message"]["content"] for x in lines) == j["message"]["content"]
    # logprobs: one per token of the raw answer, thinking lines carrying theirs
    lp = {**body, "logprobs": True, "top_logprobs": 2}
    whole = requests.post(server.url + "/api/chat", json=lp, timeout=60).json()
    raw = "".join(t["token"] for t in whole["logprobs"])
    assert len(whole["logprobs"]) == whole["eval_count"]
    assert raw.startswith("<think>" + j["message"]["thinking"] + "</think>" + j["message"]["content"]), raw
    lines = [json.loads(x) for x in requests.post(server.url + "/api/chat", json={**lp, "stream": True},
                                                  timeout=60).text.splitlines() if x]
    assert any("thinking" in x["message"] and x.get("logprobs") for x in lines)
    assert [t for x in lines for t in x.get("logprobs", [])] == whole["logprobs"]
    # think false renders the template with enable_thinking false: no reasoning comes back
    body.update(think=False, grammar="root ::= [a-z]{3,8}")
    j = requests.post(server.url + "/api/chat", json=body, timeout=60).json()
    assert j["message"]["content"].isalpha() and not j["message"].get("thinking")


def test_responses_reasoning_item(server):
    client = oa(server)
    chat = client.chat.completions.create(model="", messages=MSGS, temperature=0, max_tokens=64,
                                          extra_body={"grammar": GRAMMAR}).choices[0].message
    r = client.responses.create(model="", input=MSGS[0]["content"], temperature=0, max_output_tokens=64,
                                extra_body={"grammar": GRAMMAR})
    assert [it.type for it in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == chat.model_extra["reasoning_content"]
    assert r.output_text == chat.content


def test_reasoning_format_none_keeps_the_tags(thinking_model):
    s = Server("--reasoning-format", "none", model=thinking_model)
    try:
        r = oa(s).chat.completions.create(model="", messages=MSGS, temperature=0, max_tokens=64,
                                          extra_body={"grammar": GRAMMAR})
        m = r.choices[0].message
        assert not (m.model_extra or {}).get("reasoning_content")
        reasoning, content = split(m.content)
        assert reasoning and content.isalpha()
    finally:
        s.stop()
