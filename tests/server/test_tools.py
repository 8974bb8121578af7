"""Tool calls, tool_choice, parallel_tool_calls and streaming logprobs through the `openai` and
`ollama` packages against a real `wick serve` with the default model.

SmolLM2's chat template renders no tools, so wick reads its output for Hermes-style
<tool_call>{...}</tool_call> markup (the format for templates without tool markup). A 135M model
does not call tools on its own: a few-shot conversation (earlier assistant turns that answered
with calls) makes it write them, greedily. "required" and a named tool_choice constrain the
output to a call whose arguments follow the function's parameters schema.
"""
import json

import jsonschema
import ollama
import openai
import pytest
import requests

from conftest import oa

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}},
]
NAMES = {t["function"]["name"] for t in TOOLS}


def call_text(*cities):
    return "\n".join('<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>' % c
                     for c in cities)


def fewshot(*cities):
    """Worked examples, then the question about `cities` (one, or several: a call each)."""
    several = len(cities) > 1
    ask = lambda cs: "What is the weather in " + " and ".join(cs) + "?" + (" Call get_weather once per city."
                                                                           if several else "")
    examples = [("Rome", "Oslo"), ("Berlin", "Lima"), ("Vienna", "Quito")] if several else [("Rome",), ("Berlin",)]
    msgs = [{"role": "system", "content": "You answer every question with get_weather tool calls in "
                                          "<tool_call></tool_call> tags" + (", one per city." if several else ".")}]
    for ex in examples:
        msgs += [{"role": "user", "content": ask(ex)}, {"role": "assistant", "content": call_text(*ex)}]
    return msgs + [{"role": "user", "content": ask(cities)}]


def stream_chat(client, **kw):
    """Content, calls (as OpenAI clients assemble them from deltas) and finish reason of a stream."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            if c.delta.content:
                content += c.delta.content
            for d in c.delta.tool_calls or []:
                if d.index not in calls:  # the first delta of a call: id, type and name
                    assert d.id and d.type == "function" and d.function.name, d
                    assert d.function.arguments == ""
                    calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
                elif d.function.arguments:
                    calls[d.index]["arguments"] += d.function.arguments
            finish = c.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("city", ["Paris", "Tokyo"])
def test_openai_tool_call(server, model_name, city):
    r = oa(server).chat.completions.create(model=model_name, messages=fewshot(city), tools=TOOLS,
                                           temperature=0, max_tokens=60)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.content is None  # only a call: no content, and no markup
    assert len(ch.message.tool_calls) == 1
    call = ch.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": city}  # arguments: a JSON string


def test_openai_tool_call_streaming_equals_non_streaming(server, model_name):
    client = oa(server)
    kw = dict(model=model_name, messages=fewshot("Madrid"), tools=TOOLS, temperature=0, max_tokens=60)
    full = client.chat.completions.create(**kw).choices[0]
    content, calls, finish = stream_chat(client, **kw)
    assert "<tool_call" not in content and "</tool_call" not in content
    assert content == (full.message.content or "")
    assert finish == full.finish_reason == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == \
        [(c.function.name, json.loads(c.function.arguments)) for c in full.message.tool_calls]


def test_parallel_tool_calls(server, model_name):
    client = oa(server)
    kw = dict(model=model_name, messages=fewshot("Paris", "London"), tools=TOOLS, temperature=0, max_tokens=100)
    both = client.chat.completions.create(**kw).choices[0].message.tool_calls
    assert [json.loads(c.function.arguments)["city"] for c in both] == ["Paris", "London"]
    assert len({c.id for c in both}) == 2
    first = client.chat.completions.create(parallel_tool_calls=False, **kw).choices[0].message.tool_calls
    assert [json.loads(c.function.arguments)["city"] for c in first] == ["Paris"]
    _, streamed, _ = stream_chat(client, parallel_tool_calls=False, **kw)
    assert [json.loads(c["arguments"])["city"] for c in streamed] == ["Paris"]


def test_tool_choice_none_parses_nothing(server, model_name):
    r = oa(server).chat.completions.create(model=model_name, messages=fewshot("Paris"), tools=TOOLS,
                                           tool_choice="none", temperature=0, max_tokens=60)
    ch = r.choices[0]
    assert not ch.message.tool_calls
    assert ch.finish_reason == "stop"
    assert "<tool_call>" in ch.message.content  # the model's text as it wrote it


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_tool_choice_required_and_named(server, model_name, choice):
    client = oa(server)
    for city in ("Paris", "Cairo"):
        kw = dict(model=model_name, messages=fewshot(city), tools=TOOLS, tool_choice=choice, temperature=0,
                  max_tokens=60)
        calls = client.chat.completions.create(**kw).choices[0].message.tool_calls
        assert calls and all(c.function.name in NAMES and isinstance(json.loads(c.function.arguments), dict)
                             for c in calls)
        _, streamed, finish = stream_chat(client, **kw)
        assert streamed and finish == "tool_calls"
        assert all(c["name"] in NAMES and isinstance(json.loads(c["arguments"]), dict) for c in streamed)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("question", ["What is the capital of France?", "Add 2 and 3.", "Tell me a joke."])
def test_tool_choice_required_forces_a_call(server, model_name, stream, question):
    """Without worked examples the model answers in text; the forcing grammar must make it a call
    to a declared function whose arguments are valid for that function's parameters schema."""
    client = oa(server)
    kw = dict(model=model_name, messages=[{"role": "user", "content": question}],
              tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=200)
    if stream:
        _, calls, finish = stream_chat(client, **kw)
    else:
        ch = client.chat.completions.create(**kw).choices[0]
        calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in ch.message.tool_calls or []]
        finish = ch.finish_reason
    assert len(calls) == 1 and finish == "tool_calls", (calls, finish)
    schema = {t["function"]["name"]: t["function"].get("parameters", {}) for t in TOOLS}
    assert calls[0]["name"] in NAMES
    jsonschema.validate(json.loads(calls[0]["arguments"]), schema[calls[0]["name"]])


def test_tool_choice_errors(server, model_name):
    client = oa(server)
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError, match="not in 'tools'"):
        client.chat.completions.create(model=model_name, messages=msgs, tools=TOOLS, max_tokens=4,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(openai.BadRequestError, match="needs 'tools'"):
        client.chat.completions.create(model=model_name, messages=msgs, tool_choice="required", max_tokens=4)
    with pytest.raises(openai.BadRequestError, match=r"tools\[0\].function"):
        client.chat.completions.create(model=model_name, messages=msgs, tools=[{"type": "function"}],
                                       max_tokens=4)


def test_plain_answer_with_tools_offered(server, model_name):
    r = oa(server).chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "What is the capital of France?"}],
        tools=TOOLS, temperature=0, max_tokens=32)
    ch = r.choices[0]
    assert not ch.message.tool_calls and ch.finish_reason in ("stop", "length")
    assert "Paris" in ch.message.content


def test_history_with_calls_and_results(server, model_name):
    """An assistant turn with tool_calls (arguments as a JSON string) and a tool result render."""
    msgs = [{"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    r = oa(server).chat.completions.create(model=model_name, messages=msgs, tools=TOOLS, temperature=0,
                                           max_tokens=16)
    assert r.usage.prompt_tokens > 0 and r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_ollama_tool_calls(server, model_name):
    client = ollama.Client(host=server.url)
    opts = {"temperature": 0, "num_predict": 60}
    r = client.chat(model=model_name, messages=fewshot("Paris"), tools=TOOLS, options=opts)
    assert r.message.content == ""
    assert [(c.function.name, dict(c.function.arguments)) for c in r.message.tool_calls] == \
        [("get_weather", {"city": "Paris"})]  # arguments: an object
    content, calls = "", []
    for part in client.chat(model=model_name, messages=fewshot("Paris"), tools=TOOLS, options=opts, stream=True):
        content += part.message.content or ""
        calls += [(c.function.name, dict(c.function.arguments)) for c in part.message.tool_calls or []]
    assert "<tool_call" not in content
    assert calls == [("get_weather", {"city": "Paris"})]


def test_streaming_logprobs_equal_non_streaming(server, model_name):
    client = oa(server)
    msgs = [{"role": "user", "content": "Name three colours."}]
    kw = dict(model=model_name, messages=msgs, temperature=0, max_tokens=24, logprobs=True, top_logprobs=3)
    full = client.chat.completions.create(**kw).choices[0].logprobs.content
    streamed = []
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            if c.logprobs and c.logprobs.content:
                streamed += c.logprobs.content
    assert len(full) > 0
    assert [t.token for t in streamed] == [t.token for t in full]
    assert [t.bytes for t in streamed] == [t.bytes for t in full]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in full], abs=1e-5)
    for s, f in zip(streamed, full):
        assert [x.token for x in s.top_logprobs] == [x.token for x in f.top_logprobs]
        assert [x.logprob for x in s.top_logprobs] == pytest.approx([x.logprob for x in f.top_logprobs], abs=1e-5)


def test_completions_streaming_logprobs_equal_non_streaming(server, model_name):
    client = oa(server)
    kw = dict(model=model_name, prompt="The capital of France is", temperature=0, max_tokens=12, logprobs=3)
    full = client.completions.create(**kw).choices[0].logprobs
    tokens, lps, tops, offsets = [], [], [], []
    for chunk in client.completions.create(stream=True, **kw):
        for c in chunk.choices:
            if c.logprobs:
                tokens += c.logprobs.tokens
                lps += c.logprobs.token_logprobs
                tops += c.logprobs.top_logprobs
                offsets += c.logprobs.text_offset
    assert tokens == full.tokens and offsets == full.text_offset and len(tokens) == 12
    assert lps == pytest.approx(full.token_logprobs, abs=1e-5)
    assert [sorted(t) for t in tops] == [sorted(t) for t in full.top_logprobs]


def test_cached_tokens_on_repeated_system_prompt(server, model_name):
    client = oa(server)
    system = "You are a careful assistant for a travel agency. " + " ".join(
        f"Rule {i}: answer politely and mention the city name {i} times." for i in range(60))
    ask = lambda q, **kw: client.chat.completions.create(
        model=model_name, messages=[{"role": "system", "content": system}, {"role": "user", "content": q}],
        temperature=0, max_tokens=4, **kw)
    first = ask("Where is Paris?")
    assert first.usage.prompt_tokens > 500
    again = ask("Where is Rome?")
    assert again.usage.prompt_tokens_details.cached_tokens > 400
    usage = None
    for chunk in ask("Where is Oslo?", stream=True, stream_options={"include_usage": True}):
        usage = chunk.usage or usage
    assert usage is not None and usage.prompt_tokens_details.cached_tokens > 400


def test_show_lists_tool_capability(server):
    """SmolLM2's template has no tool markup: no "tools" capability (Ollama's key), format "none"."""
    shown = requests.post(server.url + "/api/show", json={"model": "smollm2"}, timeout=10).json()
    assert shown["capabilities"] == ["completion"]
    assert shown["tool_format"] == "none"
