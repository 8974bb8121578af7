"""A Granite model served end to end, through the `openai` and `ollama` packages.

spnl's default generator is IBM's granite3.2:2b. The model here is the tiny Granite fixture
(tests/fixtures/tiny-models/granite: HF transformers' reference logits) with its embedding
grown to the default model's vocabulary, written as llama.cpp lays Granite out by the `gguf`
package (tests/python/make_granite_gguf.py): the default model's tokenizer under Granite's
pre-tokenizer name (refact), and a Granite-style chat template with <|tool_call|> markup
(tests/templates/granite_tools.jinja). Random weights: the checks are the plumbing (the
architecture served, the tool format read from the template, a forced call parsed), not what
the model says.
"""
import json
import os
import sys

import jsonschema
import ollama
import pytest
import requests

from conftest import MODEL, Server, oa, skip_or_fail

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from make_granite_gguf import write_granite_gguf  # noqa: E402

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "number"}},
                                      "required": ["a"]}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def granite(tmp_path_factory):
    if not os.path.exists(MODEL):
        skip_or_fail(f"model missing: {MODEL}")
    path = str(tmp_path_factory.mktemp("granite") / "granite-tiny.gguf")
    template = open(os.path.join(HERE, "..", "templates", "granite_tools.jinja")).read()
    write_granite_gguf(os.path.join(HERE, "..", "fixtures", "tiny-models", "granite"), path,
                       tokenizer_from=MODEL, chat_template=template)
    s = Server(model=path)
    yield s, path  # the operator's --model: clients name it by the same string
    s.stop()


def test_show_names_granite_and_its_tool_format(granite):
    server, name = granite
    shown = requests.post(server.url + "/api/show", json={"model": name}, timeout=10).json()
    assert shown["details"]["family"] == "granite"
    assert shown["model_info"]["general.architecture"] == "granite"
    assert shown["tool_format"] == "granite"
    assert "tools" in shown["capabilities"]


@pytest.mark.parametrize("stream", [False, True])
def test_forced_call_comes_back_as_tool_calls(granite, stream):
    """tool_choice "required" constrains the output to <|tool_call|>[...] (Granite's markup),
    which the server reads back into tool_calls; arguments valid for the function's schema."""
    server, name = granite
    kw = dict(model=name, messages=[{"role": "user", "content": "What is the weather in Paris?"}],
              tools=TOOLS, tool_choice="required", temperature=0, max_tokens=120)
    client = oa(server)
    if stream:
        calls, finish = {}, None
        for chunk in client.chat.completions.create(stream=True, **kw):
            for c in chunk.choices:
                assert not c.delta.content, c.delta.content  # no markup leaks into content
                for d in c.delta.tool_calls or []:
                    calls.setdefault(d.index, {"name": d.function.name, "arguments": ""})
                    calls[d.index]["arguments"] += d.function.arguments or ""
                finish = c.finish_reason or finish
        got = [calls[i] for i in sorted(calls)]
    else:
        ch = client.chat.completions.create(**kw).choices[0]
        assert not ch.message.content
        got = [{"name": c.function.name, "arguments": c.function.arguments} for c in ch.message.tool_calls]
        finish = ch.finish_reason
    assert finish == "tool_calls" and got, (finish, got)
    for c in got:
        jsonschema.validate(json.loads(c["arguments"]), SCHEMAS[c["name"]])


def test_answers_on_both_apis(granite):
    """Plain generation through Ollama's client and OpenAI's: the same greedy text."""
    server, name = granite
    msgs = [{"role": "user", "content": "Say something."}]
    via_ollama = ollama.Client(host=server.url).chat(model=name, messages=msgs,
                                                      options={"temperature": 0, "num_predict": 12})
    via_openai = oa(server).chat.completions.create(model=name, messages=msgs, temperature=0, max_tokens=12)
    assert via_ollama.message.content == via_openai.choices[0].message.content
    assert via_openai.usage.completion_tokens == 12 or via_openai.choices[0].finish_reason == "stop"
