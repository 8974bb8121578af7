#!/usr/bin/env python3
"""Chat-template conformance cases rendered by transformers' apply_chat_template.

Writes OUT/templates.json: a list of {template, file, vars, expect | error}.
usage: make_template_fixtures.py SHARED_DIR SMOLLM2_GGUF TEMPLATES_DIR OUT"""
import copy
import json
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
from transformers import AutoTokenizer  # noqa: E402

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Get the weather in a city. ",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City, e.g. Paris"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties":
     {"a": {"type": "number"}, "b": {"type": "number", "default": 1.5}}}}},
]


def skip(msg):
    """A missing input: a printed skip, or under CI (CI=true or CI=1) an error, exit 1."""
    if os.environ.get("CI", "").lower() in ("true", "1"):
        sys.exit(f"error: {msg} (CI={os.environ['CI']}: under CI a skipped reference fails)")
    print(f"skip: {msg}")


def conversations():
    u = lambda c: {"role": "user", "content": c}
    a = lambda c: {"role": "assistant", "content": c}
    s = lambda c: {"role": "system", "content": c}
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]}
    call_str = {"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"type": "function", "function": {"name": "add", "arguments": "{\"a\": 1, \"b\": 2}"}},
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]}
    tool = lambda c: {"role": "tool", "content": c}
    # as OpenAI clients send a call back: with an id, the result naming it
    call_ids = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    return [
        ("plain", [u("What is the capital of France?")], {}),
        ("system", [s("You are terse."), u("Hi!"), a("Hello."), u("  Tell me a joke.  ")], {}),
        ("multi", [u("one"), a("two"), u("three"), a("four"), u("five")], {}),
        ("unicode", [s("Réponds en français 🇫🇷"), u("你好，世界！ 😀\n\tnew line"), a("Bonjour — ça va?")], {}),
        ("think", [u("2+2?"), a("<think>\nadd them\n</think>\n\n4"), u("and 3+3?")], {}),
        ("reasoning", [u("Why?"), {"role": "assistant", "content": "Because.", "reasoning_content": "thinking hard"}, u("ok")], {}),
        ("tools", [s("Use tools."), u("Weather in Paris?")], {"tools": TOOLS}),
        ("tool_calls", [u("Weather in Paris?"), call, tool("{\"temp\": 21}"), tool("sunny")], {"tools": TOOLS}),
        ("tool_calls_str", [u("Add 1 and 2, and Zürich weather"), call_str, tool("3"), tool("cold"), a("3, and cold.")], {"tools": TOOLS}),
        ("tool_call_ids", [u("Weather in Paris?"), call_ids, {"role": "tool", "tool_call_id": "call_7", "content": "sunny"}],
         {"tools": TOOLS}),
        ("no_thinking", [u("Quick answer please")], {"enable_thinking": False}),
        ("empty_content", [u(""), a(""), u("#  Heading here")], {}),
        ("long", [u("word " * 200)], {}),
    ]


def main(shared, smollm2, tdir, out):
    import gguf_meta
    if not os.path.isdir(f"{shared}/tokenizers"):
        return skip(f"{shared}/tokenizers not found: no chat template expectations")
    if not os.path.exists(smollm2):
        skip(f"default model {smollm2} not found (scripts/fetch_model): no SmolLM2 template cases")
    toks = {n: AutoTokenizer.from_pretrained(f"{shared}/tokenizers/{n}") for n in ("qwen3", "llama3", "llama2")}
    smol_tmpl = gguf_meta.read(smollm2).fields["tokenizer.chat_template"] if os.path.exists(smollm2) else None
    templates = {
        "qwen3": (toks["qwen3"], None, "qwen3"),
        "llama3": (toks["llama3"], None, "llama3"),
        "llama2": (toks["llama2"], open(f"{tdir}/llama2.jinja").read(), "llama2.jinja"),
        "mistral": (toks["llama2"], open(f"{tdir}/mistral.jinja").read(), "mistral.jinja"),
        "features": (toks["llama2"], open(f"{tdir}/features.jinja").read(), "features.jinja"),
        # tool markup of the formats ../shared has no template for (written for wick's tests)
        "llama31_tools": (toks["llama3"], open(f"{tdir}/llama31_tools.jinja").read(), "llama31_tools.jinja"),
        "mistral_tools": (toks["llama2"], open(f"{tdir}/mistral_tools.jinja").read(), "mistral_tools.jinja"),
        "granite_tools": (toks["llama2"], open(f"{tdir}/granite_tools.jinja").read(), "granite_tools.jinja"),
    }
    if smol_tmpl:
        templates["smollm2"] = (toks["llama2"], smol_tmpl, "smollm2")
    cases = []
    for name, (tok, tmpl, file) in templates.items():
        for conv_name, msgs, extra in conversations():
            for gen in (True, False):
                kwargs = dict(extra)
                tools = kwargs.pop("tools", None)
                vars_ = {"messages": copy.deepcopy(msgs), "add_generation_prompt": gen,
                         "bos_token": tok.bos_token or "", "eos_token": tok.eos_token or "", **kwargs}
                if tools is not None:
                    vars_["tools"] = tools
                case = {"template": name, "file": file, "conversation": conv_name, "vars": vars_}
                if smol_tmpl and name == "smollm2":
                    case["source"] = smol_tmpl
                elif tmpl is not None:
                    case["source"] = tmpl
                try:
                    case["expect"] = tok.apply_chat_template(msgs, tools=tools, chat_template=tmpl, tokenize=False,
                                                             add_generation_prompt=gen, **kwargs)
                except Exception as e:  # the template raised (e.g. roles must alternate)
                    case["error"] = str(e)
                cases.append(case)
    os.makedirs(out, exist_ok=True)
    json.dump(cases, open(f"{out}/templates.json", "w"), ensure_ascii=False, indent=0)
    print(f"{len(cases)} template cases over {len(templates)} templates")


if __name__ == "__main__":
    main(*sys.argv[1:5])
