"""OpenAI's Responses API (POST /v1/responses, GET and DELETE /v1/responses/ID) through the `openai`
package against a real `wick serve` with the default model.

The Responses API is read onto the chat path, so each answer is checked against chat completions'
answer to the same conversation (greedy, the same text and token counts); streams against the
non-streaming answer, and through the SDK's own stream helper, which checks the events' order
and identities as it assembles the response.
"""
import json
import time

import jsonschema
import openai
import pytest
import requests

from conftest import TIME_SCALE, oa, serving

TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


def chat_text(client, model, messages, **kw):
    c = client.chat.completions.create(model=model, messages=messages, temperature=0, **kw)
    return c.choices[0].message.content, c.usage


def events_of(client, **kw):
    """The raw events of a streamed response, checked for order and numbering."""
    events = list(client.responses.create(stream=True, **kw))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"], types
    assert types[-1] in ("response.completed", "response.incomplete"), types
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events


def items(response):
    """A response's output items without their ids (which differ from response to response)."""
    out = []
    for it in response.output:
        d = it.model_dump(exclude_none=True)
        d.pop("id", None)
        if d["type"] == "function_call":
            d.pop("call_id")
        out.append(d)
    return out


def test_text_equals_chat_completions(server, model_name):
    client = oa(server)
    r = client.responses.create(model=model_name, instructions="Answer in one short sentence.",
                                input="What is the capital of France?", temperature=0, max_output_tokens=40)
    assert r.object == "response" and r.status == "completed" and r.id.startswith("resp_")
    assert r.output[0].type == "message" and r.output[0].role == "assistant"
    text, usage = chat_text(client, model_name, [{"role": "system", "content": "Answer in one short sentence."},
                                                 {"role": "user", "content": "What is the capital of France?"}],
                            max_tokens=40)
    assert r.output_text == text and "Paris" in text
    assert (r.usage.input_tokens, r.usage.output_tokens) == (usage.prompt_tokens, usage.completion_tokens)
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    # the settings come back as asked
    assert r.instructions == "Answer in one short sentence." and r.max_output_tokens == 40
    assert r.temperature == 0 and r.store is True and r.previous_response_id is None


def test_input_items_equal_messages(server, model_name):
    """Typed items and content parts render as the chat messages they stand for."""
    client = oa(server)
    r = client.responses.create(model=model_name, temperature=0, max_output_tokens=24, input=[
        {"role": "developer", "content": "You are terse."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Name a "},
                                                         {"type": "input_text", "text": "colour."}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Blue."}]},
        {"role": "user", "content": "Another one."}])
    text, _ = chat_text(client, model_name, [{"role": "system", "content": "You are terse."},
                                             {"role": "user", "content": "Name a colour."},
                                             {"role": "assistant", "content": "Blue."},
                                             {"role": "user", "content": "Another one."}], max_tokens=24)
    assert r.output_text == text


def test_stream_equals_non_stream(server, model_name):
    client = oa(server)
    # room to finish: the SDK's helper wants response.completed, not response.incomplete
    kw = dict(model=model_name, input="Write one sentence about rivers.", temperature=0, max_output_tokens=200)
    whole = client.responses.create(**kw)
    events = events_of(client, **kw)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text
    done = [e for e in events if e.type == "response.output_text.done"]
    assert len(done) == 1 and done[0].text == whole.output_text
    final = events[-1].response
    assert items(final) == items(whole)
    assert (final.usage.input_tokens, final.usage.output_tokens) == (whole.usage.input_tokens,
                                                                     whole.usage.output_tokens)
    # every delta names the item that output_item.added opened
    added = [e for e in events if e.type == "response.output_item.added"]
    assert len(added) == 1 and all(e.item_id == added[0].item.id for e in events if e.type.endswith(".delta"))
    # the SDK's stream helper assembles the same response
    with client.responses.stream(**kw) as s:
        assembled = s.get_final_response()
    assert assembled.output_text == whole.output_text


def test_previous_response_id_continues_the_conversation(server, model_name):
    client = oa(server)
    first = client.responses.create(model=model_name, input="My name is Ada. Say hello to me.",
                                    instructions="Be brief.", temperature=0, max_output_tokens=24)
    second = client.responses.create(model=model_name, previous_response_id=first.id,
                                     input="What is my name?", temperature=0, max_output_tokens=24)
    assert second.previous_response_id == first.id and second.instructions is None
    # instructions are not carried over (OpenAI's rule): the history is the two turns alone
    text, usage = chat_text(client, model_name, [{"role": "user", "content": "My name is Ada. Say hello to me."},
                                                 {"role": "assistant", "content": first.output_text},
                                                 {"role": "user", "content": "What is my name?"}], max_tokens=24)
    assert second.output_text == text and second.usage.input_tokens == usage.prompt_tokens
    third = client.responses.create(model=model_name, previous_response_id=second.id,
                                    input="Thanks.", temperature=0, max_output_tokens=8)
    # the stored conversation's prefix is in the prefix cache
    assert third.usage.input_tokens_details.cached_tokens > 0


def test_retrieve_and_delete(server, model_name):
    client = oa(server)
    r = client.responses.create(model=model_name, input="Say yes.", temperature=0, max_output_tokens=8)
    got = client.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump()
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model=model_name, input="Hi", previous_response_id=r.id)
    assert e.value.body["param"] == "previous_response_id"
    assert e.value.body["code"] == "previous_response_not_found"
    unstored = client.responses.create(model=model_name, input="Say no.", store=False, max_output_tokens=4)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_streamed_response_is_stored(server, model_name):
    client = oa(server)
    events = events_of(client, model=model_name, input="Count to three.", temperature=0, max_output_tokens=16)
    final = events[-1].response
    assert client.responses.retrieve(final.id).model_dump() == final.model_dump()


def few_shot_input():
    def turn(city):
        return [{"role": "user", "content": f"What is the weather in {city}?"},
                {"role": "assistant", "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n'
                                                 '</tool_call>' % city}]
    return turn("Rome") + turn("Berlin") + [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.mark.parametrize("tool_choice", ["auto", "required", {"type": "function", "name": "get_weather"}])
def test_function_call_items(server, model_name, tool_choice):
    client = oa(server)
    kw = dict(model=model_name, tools=TOOLS, tool_choice=tool_choice, temperature=0, max_output_tokens=64,
              instructions="You answer with get_weather tool calls in <tool_call></tool_call> tags.",
              input=few_shot_input())
    r = client.responses.create(**kw)
    calls = [it for it in r.output if it.type == "function_call"]
    assert len(calls) == 1, r.output
    assert calls[0].name == "get_weather" and calls[0].status == "completed"
    assert json.loads(calls[0].arguments)["city"] == "Paris" and calls[0].call_id.startswith("call_")
    events = events_of(client, **kw)
    assert items(events[-1].response) == items(r)
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert args == calls[0].arguments
    with client.responses.stream(**kw) as s:
        assert items(s.get_final_response()) == items(r)


def test_function_call_output_continues_like_chat(server, model_name):
    client = oa(server)
    # one call and nothing else (in parallel, the model would go on to a second call)
    first = client.responses.create(model=model_name, tools=TOOLS, tool_choice="required", temperature=0,
                                    parallel_tool_calls=False, input="What is the weather in Paris?",
                                    max_output_tokens=64)
    assert [it.type for it in first.output] == ["function_call"] and first.status == "completed"
    call = first.output[0]
    second = client.responses.create(model=model_name, tools=TOOLS, previous_response_id=first.id, temperature=0,
                                     max_output_tokens=32, input=[{"type": "function_call_output",
                                                                   "call_id": call.call_id,
                                                                   "output": "Sunny, 24 C"}])
    assert second.status in ("completed", "incomplete") and second.output_text
    chat_tools = [{"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}]
    messages = [{"role": "user", "content": "What is the weather in Paris?"},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": call.call_id, "type": "function",
                                 "function": {"name": call.name, "arguments": call.arguments}}]},
                {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 24 C"}]
    text, _ = chat_text(client, model_name, messages, tools=chat_tools, max_tokens=32)
    assert second.output_text == text
    # the same conversation sent whole, the call as an input item
    whole = client.responses.create(model=model_name, tools=TOOLS, temperature=0, max_output_tokens=32, input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 C"}])
    assert whole.output_text == text


def test_input_items_list_the_conversation(server, model_name):
    """GET /v1/responses/ID/input_items through the SDK: the chain's earlier inputs and
    answers, then this request's input (not the instructions), newest first by default,
    paged by limit and after (the SDK's auto-pagination walks every page)."""
    client = oa(server)
    first = client.responses.create(model=model_name, tools=TOOLS, tool_choice="required", temperature=0,
                                    parallel_tool_calls=False, input="What is the weather in Paris?",
                                    instructions="Be brief.", max_output_tokens=64)
    call = first.output[0]
    second = client.responses.create(model=model_name, previous_response_id=first.id, temperature=0,
                                     max_output_tokens=8, input=[
                                         {"type": "function_call_output", "call_id": call.call_id,
                                          "output": "Sunny"},
                                         {"role": "user", "content": [{"type": "input_text", "text": "And Rome?"}]}])
    got = client.responses.input_items.list(second.id, order="asc")
    shape = [(it.type, getattr(it, "role", None)) for it in got.data]
    assert shape == [("message", "user"), ("function_call", None), ("function_call_output", None),
                     ("message", "user")]
    assert got.data[0].content[0].text == "What is the weather in Paris?"
    assert (got.data[1].call_id, got.data[1].name, got.data[1].arguments) == (call.call_id, call.name,
                                                                               call.arguments)
    assert got.data[2].call_id == call.call_id and got.data[2].output == "Sunny"
    assert got.data[3].content[0].text == "And Rome?"
    assert got.first_id == got.data[0].id and got.last_id == got.data[-1].id and not got.has_more
    ids = [it.id for it in got.data]
    assert len(set(ids)) == 4
    newest_first = client.responses.input_items.list(second.id)
    assert [it.id for it in newest_first.data] == ids[::-1]
    page = client.responses.input_items.list(second.id, order="asc", limit=3)
    assert [it.id for it in page.data] == ids[:3] and page.has_more
    assert [it.id for it in client.responses.input_items.list(second.id, order="asc", limit=1)] == ids
    rest = client.responses.input_items.list(second.id, order="asc", after=ids[1])
    assert [it.id for it in rest.data] == ids[2:]
    assert [it.id for it in client.responses.input_items.list(first.id).data] == \
        [client.responses.input_items.list(first.id).data[0].id]  # one user message
    for bad in ({"limit": 0}, {"limit": 101}, {"order": "up"}, {"after": "msg_nope"}):
        r = requests.get(f"{server.url}/v1/responses/{second.id}/input_items", params=bad, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["param"] == next(iter(bad)), bad
    r = requests.get(server.url + "/v1/responses/resp_0000/input_items", timeout=10)
    assert r.status_code == 404


def test_json_schema_format(server, model_name):
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
              "required": ["city", "population"], "additionalProperties": False}
    r = oa(server).responses.create(model=model_name, input="Describe Paris as JSON.", temperature=0,
                                    max_output_tokens=64, text={"format": {"type": "json_schema", "name": "city",
                                                                           "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"


def test_max_output_tokens_is_incomplete(server, model_name):
    client = oa(server)
    kw = dict(model=model_name, input="Tell me a long story.", temperature=0, max_output_tokens=3)
    r = client.responses.create(**kw)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[0].status == "incomplete"
    events = events_of(client, **kw)
    assert events[-1].type == "response.incomplete" and items(events[-1].response) == items(r)


def test_logprobs_equal_chat(server, model_name):
    client = oa(server)
    kw = dict(model=model_name, input="Name a fruit.", temperature=0, max_output_tokens=12,
              include=["message.output_text.logprobs"], top_logprobs=2)
    r = client.responses.create(**kw)
    lps = r.output[0].content[0].logprobs
    chat = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Name a fruit."}],
                                          temperature=0, max_tokens=12, logprobs=True, top_logprobs=2)
    want = chat.choices[0].logprobs.content
    assert [(t.token, t.logprob) for t in lps] == [(t.token, t.logprob) for t in want]
    assert all(len(t.top_logprobs) == 2 for t in lps)
    events = events_of(client, **kw)
    streamed = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    done = next(e for e in events if e.type == "response.output_text.done")
    assert [t.token for t in streamed] == [t.token for t in lps][:len(streamed)]
    assert [(t.token, t.logprob) for t in done.logprobs] == [(t.token, t.logprob) for t in lps]


@pytest.mark.parametrize("body,param", [
    ({}, "input"),
    ({"input": 5}, "input"),
    ({"input": []}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].type"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "hi", "tools": [{"type": "function"}]}, "tools[0].name"),
    ({"input": "hi", "tool_choice": "sometimes"}, "tool_choice"),
    ({"input": "hi", "tool_choice": {"type": "function", "name": "nope"}, "tools": TOOLS}, "tool_choice"),
    ({"input": "hi", "background": True}, "background"),
    ({"input": "hi", "conversation": "conv_1"}, "conversation"),
    ({"input": "hi", "truncation": "sometimes"}, "truncation"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "top_logprobs": 21}, "top_logprobs"),
    ({"input": "hi", "include": "all"}, "include"),
    ({"input": "hi", "metadata": {"k": 1}}, "metadata"),
    ({"input": "hi", "text": {"format": {"type": "json_schema"}}}, "text.format.schema"),
    ({"input": "hi", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"input": "hi", "temperature": 3}, "temperature"),
    ({"input": "hi", "previous_response_id": 7}, "previous_response_id"),
])
def test_bad_requests_name_the_field(server, body, param):
    r = requests.post(server.url + "/v1/responses", json=body, timeout=30)
    assert r.status_code == 400, (body, r.text)
    err = r.json()["error"]
    assert err["param"] == param, (body, err)
    assert err["type"] == "invalid_request_error" and err["message"]


def test_unknown_ids_are_404(server):
    for method in (requests.get, requests.delete):
        r = method(server.url + "/v1/responses/resp_0000", timeout=10)
        assert r.status_code == 404 and "resp_0000" in r.json()["error"]["message"]


def test_hang_up_mid_stream_frees_the_kv_cache(server, model_name):
    with requests.post(server.url + "/v1/responses", stream=True, timeout=60,
                       json={"model": model_name, "input": "Tell me a very long story.", "stream": True,
                             "max_output_tokens": 2000}) as r:
        # hang up once text is streaming: the opening events come before the
        # request has its cache blocks (on a loaded machine, before its prefill)
        n_deltas = 0
        for line in r.iter_lines():
            n_deltas += b'"response.output_text.delta"' in line
            if n_deltas == 3:
                break
        assert n_deltas == 3
    deadline = time.time() + 10 * TIME_SCALE
    while time.time() < deadline and (server.metric("wick_kv_blocks_used") > 0
                                      or server.metric("wick_running_sequences") > 0):
        time.sleep(0.1)
    assert server.metric("wick_kv_blocks_used") == 0
    assert server.metric("wick_running_sequences") == 0
    assert requests.get(server.url + "/health", timeout=5).status_code == 200


@pytest.fixture(scope="module")
def small_server():
    yield from serving("--ctx-size", "160", "--responses-store", "2")


def test_truncation_auto_drops_the_oldest_turns(small_server, model_name):
    client = oa(small_server)
    history = []
    for i in range(8):
        history += [{"role": "user", "content": f"Tell me fact number {i} about the sea, in a sentence or two."},
                    {"role": "assistant", "content": f"Fact {i}: the sea covers much of the planet and is deep."}]
    history.append({"role": "user", "content": "And one more?"})
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=model_name, input=history, max_output_tokens=8)
    assert e.value.body["param"] == "input" and e.value.body["code"] == "context_length_exceeded"
    r = client.responses.create(model=model_name, input=history, truncation="auto", max_output_tokens=8,
                                temperature=0)
    assert r.status in ("completed", "incomplete") and r.usage.input_tokens < 160
    # no more was dropped than needed: one more turn would not fit
    kept = r.usage.input_tokens
    assert kept > 160 - 60, kept


def test_store_keeps_the_newest(small_server, model_name):
    client = oa(small_server)
    ids = [client.responses.create(model=model_name, input=f"Say {w}.", max_output_tokens=2).id
           for w in ("one", "two", "three")]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(ids[0])
    assert [client.responses.retrieve(i).id for i in ids[1:]] == ids[1:]
