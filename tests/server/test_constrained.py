"""Constrained decoding end to end: OpenAI response_format (json_object,
json_schema), Ollama format ("json", a schema) and the GBNF `grammar` extra,
with the `openai` and `ollama` packages against a real `wick serve` and the
default model. Every answer that ends by itself (finish_reason "stop") must
validate with the `jsonschema` package;
unsupported keywords are a 400 that names them;
a max_tokens cut says "length"."""
import concurrent.futures as cf
import json

import ollama
import openai
import pytest
import requests

from conftest import oa, skip_or_fail

try:
    import jsonschema
except ImportError:  # requirements-dev.txt pins it
    jsonschema = None


STR = {"type": "string", "maxLength": 24}  # bounded, so that every answer ends
# 20 schemas, from one value to nested, referenced and alternative structures.
SCHEMAS = [
    ("boolean", {"type": "boolean"}),
    ("integer", {"type": "integer"}),
    ("enum", {"enum": ["red", "green", "blue"]}),
    ("string_len", {"type": "string", "minLength": 3, "maxLength": 12}),
    ("nullable_number", {"type": ["number", "null"]}),
    ("one_property", {"type": "object", "properties": {"name": STR}, "required": ["name"]}),
    ("flat_object", {"type": "object", "properties": {"name": STR, "age": {"type": "integer"},
                                                      "student": {"type": "boolean"}},
                     "required": ["name", "age", "student"]}),
    ("optional_properties", {"type": "object", "properties": {"city": STR, "country": STR,
                                                              "population": {"type": "integer"}},
                             "required": ["city"]}),
    ("const_and_enum", {"type": "object", "properties": {"kind": {"const": "point"},
                                                         "unit": {"enum": ["cm", "m", "km"]},
                                                         "x": {"type": "number"}},
                        "required": ["kind", "unit", "x"]}),
    ("int_array", {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 5}),
    ("string_array_in_object", {"type": "object", "properties": {
        "colors": {"type": "array", "items": {"enum": ["red", "green", "blue", "black"]}, "minItems": 1,
                   "maxItems": 3}}, "required": ["colors"]}),
    ("pattern", {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}},
                 "required": ["code"]}),
    ("formats", {"type": "object", "properties": {"day": {"type": "string", "format": "date"},
                                                  "id": {"type": "string", "format": "uuid"}},
                 "required": ["day", "id"]}),
    ("nested_object", {"type": "object", "properties": {
        "person": {"type": "object", "properties": {"name": STR, "email": {"type": "string", "format": "email"}},
                   "required": ["name", "email"]},
        "active": {"type": "boolean"}}, "required": ["person", "active"]}),
    ("array_of_objects", {"type": "object", "properties": {"items": {
        "type": "array", "maxItems": 3, "items": {"type": "object", "properties": {
            "sku": {"type": "string", "pattern": "^[a-z]{2}[0-9]{2}$"}, "qty": {"type": "integer"}},
            "required": ["sku", "qty"]}}}, "required": ["items"]}),
    ("any_of", {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer"}, STR, {"type": "null"}]}},
                "required": ["value"]}),
    ("one_of_objects", {"oneOf": [
        {"type": "object", "properties": {"circle": {"type": "number"}}, "required": ["circle"]},
        {"type": "object", "properties": {"square": {"type": "number"}}, "required": ["square"]}]}),
    ("defs_ref", {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                                      "required": ["x", "y"]}},
                  "type": "object", "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
                  "required": ["start", "end"]}),
    # recursive: nothing bounds the depth but the model (this layout ends; a
    # linked list or a folder tree ran to max_tokens with the default model)
    ("recursive_tree", {"$defs": {"node": {"type": "object", "properties": {
        "children": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/node"}},
        "label": {"type": "string", "maxLength": 8}}, "required": ["label"]}},
        "$ref": "#/$defs/node"}),
    ("everything", {"$defs": {"tag": {"type": "string", "pattern": "^#[a-z]{1,8}$"}},
                    "type": "object", "properties": {
                        "title": STR, "when": {"type": "string", "format": "date-time"},
                        "priority": {"enum": [1, 2, 3]}, "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"},
                                                                 "maxItems": 4},
                        "owner": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"name": STR},
                                                               "required": ["name"]}]},
                        "done": {"type": "boolean"}},
                    "required": ["title", "when", "priority", "tags", "owner", "done"],
                    "additionalProperties": False}),
]


@pytest.fixture(scope="module")
def validator():
    if jsonschema is None:
        skip_or_fail("the jsonschema package is missing (pip install -r requirements-dev.txt)")
    return lambda schema, text: jsonschema.validate(json.loads(text), schema)


def ask(name, schema):
    return [{"role": "system", "content": "Answer with JSON only."},
            {"role": "user", "content": f"Give an example of {name.replace('_', ' ')} as JSON for this schema: "
                                        f"{json.dumps(schema)}"}]


def response_format(name, schema):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


@pytest.mark.parametrize("name,schema", SCHEMAS, ids=[n for n, _ in SCHEMAS])
def test_schema_answers_validate(server, model_name, validator, name, schema):
    client = oa(server)
    r = client.chat.completions.create(model=model_name, messages=ask(name, schema), temperature=0, max_tokens=400,
                                       response_format=response_format(name, schema))
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop", text
    validator(schema, text)
    # streamed and sampled: another answer, valid too
    parts, finish = [], None
    for chunk in client.chat.completions.create(model=model_name, messages=ask(name, schema), temperature=0.9,
                                                seed=7, max_tokens=400, stream=True,
                                                response_format=response_format(name, schema)):
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert finish == "stop", "".join(parts)
    validator(schema, "".join(parts))


def test_streamed_greedy_equals_non_streamed(server, model_name):
    client = oa(server)
    name, schema = SCHEMAS[6]
    full = client.chat.completions.create(model=model_name, messages=ask(name, schema), temperature=0, max_tokens=200,
                                          response_format=response_format(name, schema))
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model_name, messages=ask(name, schema), temperature=0, max_tokens=200, stream=True,
        response_format=response_format(name, schema)) if c.choices)
    assert streamed == full.choices[0].message.content


def test_json_object_and_completions(server, model_name, validator):
    client = oa(server)
    r = client.chat.completions.create(model=model_name, temperature=0, max_tokens=300,
                                       messages=[{"role": "user", "content": "Describe a cat as JSON."}],
                                       response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # a free-form object may go on until the limit; what came is an object's start
        assert r.choices[0].finish_reason == "length" and r.choices[0].message.content.startswith("{")
    name, schema = SCHEMAS[7]
    c = client.completions.create(model=model_name, prompt="A city as JSON:", temperature=0, max_tokens=200,
                                  extra_body={"response_format": response_format(name, schema)})
    assert c.choices[0].finish_reason == "stop"
    validator(schema, c.choices[0].text)


def test_n_choices_and_concurrent_requests_keep_their_own_grammar(server, model_name, validator):
    client = oa(server)
    name, schema = SCHEMAS[6]
    r = client.chat.completions.create(model=model_name, messages=ask(name, schema), temperature=1.0, seed=3, n=3,
                                       max_tokens=300, response_format=response_format(name, schema))
    assert len(r.choices) == 3
    for c in r.choices:
        assert c.finish_reason == "stop"
        validator(schema, c.message.content)
    picks = [SCHEMAS[i] for i in (2, 9, 11, 13, 17, 5)]

    def one(ns):
        n, s = ns
        out = client.chat.completions.create(model=model_name, messages=ask(n, s), temperature=0.7, seed=1,
                                             max_tokens=300, response_format=response_format(n, s))
        return s, out.choices[0]

    with cf.ThreadPoolExecutor(len(picks)) as ex:
        for s, choice in ex.map(one, picks):
            assert choice.finish_reason == "stop"
            validator(s, choice.message.content)


def test_ollama_format(server, model_name, validator):
    client = ollama.Client(host=server.url)
    name, schema = SCHEMAS[6]
    c = client.chat(model=model_name, messages=ask(name, schema), format=schema, options={"temperature": 0})
    assert c.done_reason == "stop"
    validator(schema, c.message.content)
    parts = [p.message.content for p in client.chat(model=model_name, messages=ask(name, schema), format=schema,
                                                    stream=True, options={"temperature": 0})]
    assert "".join(parts) == c.message.content
    g = client.generate(model=model_name, prompt="A dog as JSON with a name and an age.", format="json",
                        options={"temperature": 0, "num_predict": 300})
    if g.done_reason == "stop":
        assert isinstance(json.loads(g.response), dict)
    name, schema = SCHEMAS[2]
    g = client.generate(model=model_name, prompt="Pick a color.", format=schema, options={"temperature": 0})
    assert json.loads(g.response) in schema["enum"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/api/chat", "/api/generate"])
def test_gbnf_grammar_extra(server, path):
    body = {"model": "smollm2", "grammar": 'root ::= ("yes" | "no") "!"', "stream": False}
    if path in ("/v1/chat/completions", "/api/chat"):
        body["messages"] = [{"role": "user", "content": "Is the sky blue?"}]
    else:
        body["prompt"] = "Is the sky blue? Answer:"
    r = requests.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    j = r.json()
    text = (j["choices"][0]["message"]["content"] if path == "/v1/chat/completions" else
            j["choices"][0]["text"] if path == "/v1/completions" else
            j["message"]["content"] if path == "/api/chat" else j["response"])
    assert text in ("yes!", "no!")
    reason = j["choices"][0]["finish_reason"] if path.startswith("/v1") else j["done_reason"]
    assert reason == "stop"


def test_vllm_structured_outputs(server, model_name, validator):
    """vLLM's guided_choice, guided_regex, guided_json and structured_outputs through the
    openai package (extra_body, as vLLM's clients send them), streamed and whole, and the
    Responses API's pass-through; each answer is one its constraint allows."""
    import re
    client = oa(server)
    msgs = [{"role": "user", "content": "Is the sky blue? Answer in one word."}]
    choices = ["yes", "no", "it depends"]
    for seed in range(4):
        r = client.chat.completions.create(model=model_name, messages=msgs, temperature=1.0, seed=seed, max_tokens=16,
                                           extra_body={"guided_choice": choices})
        assert r.choices[0].message.content in choices and r.choices[0].finish_reason == "stop"
    phone = r"\(\d{3}\) \d{3}-\d{4}"
    for seed in range(3):
        r = client.completions.create(model=model_name, prompt="Call me at", temperature=0.8, seed=seed, max_tokens=24,
                                      extra_body={"guided_regex": phone})
        assert re.fullmatch(phone, r.choices[0].text), r.choices[0].text
    parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model_name, messages=msgs, temperature=0, max_tokens=16, stream=True,
        extra_body={"structured_outputs": {"choice": choices}}) if c.choices]
    assert "".join(parts) in choices
    name, schema = SCHEMAS[6]
    for body in ({"guided_json": schema}, {"guided_json": json.dumps(schema)}, {"structured_outputs": {"json": schema}}):
        r = client.chat.completions.create(model=model_name, messages=ask(name, schema), temperature=0,
                                           max_tokens=300, extra_body=body)
        assert r.choices[0].finish_reason == "stop"
        validator(schema, r.choices[0].message.content)
    resp = client.responses.create(model=model_name, input="Is the sky blue?", max_output_tokens=16,
                                   extra_body={"guided_choice": choices})
    assert resp.output_text in choices
    for body, param in (({"guided_choice": []}, "guided_choice"), ({"guided_regex": "(?=x)"}, "guided_regex"),
                        ({"guided_json": "{nope"}, "guided_json"),
                        ({"guided_choice": ["a"], "response_format": {"type": "json_object"}}, "guided_choice"),
                        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs.choice"),
                        ({"structured_outputs": "json"}, "structured_outputs")):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model_name, messages=msgs, max_tokens=4, extra_body=body)
        assert e.value.body["param"] == param, body


def test_max_tokens_cut_says_length(server, model_name):
    name, schema = SCHEMAS[19]
    r = oa(server).chat.completions.create(model=model_name, messages=ask(name, schema), temperature=0, max_tokens=6,
                                           response_format=response_format(name, schema))
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 6
    assert r.choices[0].message.content.startswith("{")


BAD_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0},
                                               "l": {"type": "array", "uniqueItems": True}}}


@pytest.mark.parametrize("path,body,needles", [
    ("/v1/chat/completions", {"response_format": response_format("bad", BAD_SCHEMA)},
     ["minimum (at /properties/n)", "uniqueItems (at /properties/l)", "param=response_format.json_schema.schema"]),
    ("/v1/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     ["response_format.json_schema.schema"]),
    ("/v1/chat/completions", {"response_format": {"type": "yaml"}}, ["response_format.type must be"]),
    ("/v1/chat/completions", {"grammar": "root ::= missing"}, ["undefined rule 'missing'", "param=grammar"]),
    ("/v1/chat/completions", {"grammar": "root ::= \"a", "response_format": {"type": "json_object"}},
     ["use either 'grammar' or 'response_format'"]),
    ("/api/chat", {"format": BAD_SCHEMA}, ["minimum (at /properties/n)", "uniqueItems"]),
    ("/api/generate", {"format": "yaml"}, ["'format' must be \"json\" or a JSON schema object"]),
    ("/api/generate", {"grammar": "root ::= [z-a]"}, ["line 1, column 14", "reversed"]),
])
def test_bad_constraints_are_400(server, path, body, needles):
    body = {"model": "smollm2", "stream": False, **body}
    if path in ("/v1/chat/completions", "/api/chat"):
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    r = requests.post(server.url + path, json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    msg = err if isinstance(err, str) else err["message"] + " param=" + str(err.get("param"))
    for n in needles:
        assert n in msg, msg


def test_openai_client_sees_the_400(server, model_name):
    with pytest.raises(openai.BadRequestError) as e:
        oa(server).chat.completions.create(model=model_name, messages=[{"role": "user", "content": "hi"}],
                                           response_format=response_format("bad", BAD_SCHEMA))
    assert "minimum" in str(e.value)
    assert requests.get(server.url + "/health", timeout=5).json() == {"status": "ok"}
