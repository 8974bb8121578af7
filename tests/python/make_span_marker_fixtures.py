#!/usr/bin/env python3
"""spnl's marker layout, as the reference tokenizes it, for wick's tests.

Runs spnl.tokenize_query (PyPI spnl, the tokenization of spnl's span-enabled
vLLM server) on span queries with Qwen3's tokenizer and writes
OUT/span_markers.json: the markers, the chat template spnl uses for Qwen
models written as Jinja (wick renders through the model's template), and per
query the ids spnl lays out. spnl loads tokenizers through the HF hub cache:
a temporary HF_HOME holds Qwen3's tokenizer.json (no network).

usage: make_span_marker_fixtures.py SHARED_DIR OUT_DIR
"""
import json
import os
import shutil
import sys
import tempfile

PLUS, CROSS, PAD, BLOCK = 10, 13, 27, 16
MODEL = "Qwen/Qwen3-0.6B"  # "Qwen" in the name: spnl picks ChatML
# spnl's ChatML: each message alone, no newline between messages, and the
# generation prompt without its newline.
TEMPLATE = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>"
            "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant{%- endif %}")


def g(inp, **kw):
    return {"g": {"model": MODEL, "input": inp, "max_tokens": 8, "temperature": 0, **kw}}


def u(t):
    return {"user": t}


def queries():
    # Documents of 1-16 words: some end exactly on a block boundary (no PAD).
    words = [u(" ".join(["word"] * k)) for k in range(1, 17)]
    return {
        "rag": g({"cross": [{"system": "S"}, {"plus": [u("doc A"), u("doc B")]}, u("Q")]}),
        # no cross after the documents: the question runs on in the last
        # document's part, and a PLUS opens the generation prompt
        "plus_then_question": g({"seq": [{"system": "You answer"},
                                          {"plus": [u("first document here"), u("second one")]},
                                          u("what do they say")]}),
        "plus_at_the_end": g({"seq": [{"system": "S"}, {"plus": [u("alpha"), u("beta gamma")]}]}),
        "aligned_documents": g({"cross": [{"system": "Read these"}, {"plus": words},
                                          u("How many words")]}),
        "no_system": g({"cross": [{"plus": [u("doc one"), u("doc two")]}, u("which")]}),
        "cross_inside_plus": g({"cross": [{"system": "S"},
                                          {"plus": [{"cross": [u("x part"), u("y part")]},
                                                    u("z doc")]},
                                          u("Q")]}),
        "two_systems_and_par": g({"seq": [{"system": "one"}, {"system": "two"},
                                          {"par": [u("p1"), u("p2")]},
                                          {"cross": [{"plus": [u("d1"), u("d2")]}, u("q")]}]}),
        "unicode": g({"cross": [{"system": "Réponds"},
                                {"plus": [u("Ceci est un document où l'on parle de café"),
                                          u("日本語の文書です")]},
                                u("Qu'en dis-tu")]}),
        "nested_plus": g({"cross": [{"plus": [{"seq": [u("a1"), {"plus": [u("n1"), u("n2")]}]},
                                              u("b1")]}, u("q")]}),
        "repeat": {"repeat": {"n": 2, "g": g({"cross": [{"system": "S"},
                                                        {"plus": [u("doc A"), u("doc B")]},
                                                        u("Q")]})["g"]}},
        "map": {"map": {"metadata": {"model": MODEL, "max_tokens": 4},
                        "inputs": ["first input", "a second, longer input of more words"]}},
    }


def main(shared, out):
    import spnl
    os.makedirs(out, exist_ok=True)
    home = tempfile.mkdtemp()
    try:
        org, name = MODEL.split("/")
        repo = f"{home}/hub/models--{org}--{name}"
        os.makedirs(f"{repo}/snapshots/wick", exist_ok=True)
        os.makedirs(f"{repo}/refs", exist_ok=True)
        open(f"{repo}/refs/main", "w").write("wick")
        shutil.copy(f"{shared}/tokenizers/qwen3/tokenizer.json", f"{repo}/snapshots/wick/")
        os.environ["HF_HOME"] = home
        os.environ["HF_HUB_OFFLINE"] = "1"
        state = spnl.init(4)
        cases = []
        for name, q in queries().items():
            r = spnl.tokenize_query(state, json.dumps(q), PAD, CROSS, PLUS, BLOCK)._0
            if hasattr(r, "inputs"):
                cases.append({"name": name, "query": q, "inputs": [list(x) for x in r.inputs]})
            else:
                cases.append({"name": name, "query": q, "ids": list(r.messages)})
    finally:
        shutil.rmtree(home, ignore_errors=True)
    doc = {"markers": [PLUS, CROSS, PAD, BLOCK], "template": TEMPLATE, "cases": cases}
    json.dump(doc, open(f"{out}/span_markers.json", "w"), ensure_ascii=False, indent=1)
    print(f"{len(cases)} span queries laid out by spnl {getattr(spnl, '__version__', '')}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
