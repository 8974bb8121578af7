"""LoRA adapters through `wick serve --lora`: a random-weight Qwen3-shaped model with the
real Qwen3 tokenizer and a PEFT adapter (adapter_config.json, adapter_model.safetensors)
answers, through the `openai` package, what the same model with scale * B @ A merged into
its weights (PEFT's merge_and_unload rule, done here in numpy) answers: the same greedy
tokens and logprobs. `--lora-scaled` at 0 answers as the plain model; /api/show names the
adapter through the `ollama` package. `--lora-modules NAME=PATH` (vLLM's) serves the adapter
under its own model name beside the plain model, both answering as above, also when their
requests share batches."""
import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import ollama
import openai
import pytest
import requests
from safetensors.numpy import load_file, save_file

from conftest import WICK, Server, free_port, oa, qwen3_vocab_model

TARGETS = ["self_attn.q_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"]
R, ALPHA = 4, 8


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    base = qwen3_vocab_model(tmp_path_factory.mktemp("lora-base"))
    tensors = load_file(os.path.join(base, "model.safetensors"))
    n_layer = json.load(open(os.path.join(base, "config.json")))["num_hidden_layers"]
    rng = np.random.default_rng(3)
    adapter, merged = {}, dict(tensors)
    for il in range(n_layer):
        for t in TARGETS:
            name = f"model.layers.{il}.{t}"
            n_out, n_in = tensors[name + ".weight"].shape
            a = rng.normal(0, 0.1, (R, n_in)).astype(np.float32)
            b = rng.normal(0, 0.1, (n_out, R)).astype(np.float32)
            adapter[f"base_model.model.{name}.lora_A.weight"] = a
            adapter[f"base_model.model.{name}.lora_B.weight"] = b
            merged[name + ".weight"] = (tensors[name + ".weight"].astype(np.float64)
                                        + ALPHA / R * (b.astype(np.float64) @ a)).astype(np.float32)
    d = tmp_path_factory.mktemp("lora-adapter") / "my-adapter"
    d.mkdir()
    save_file(adapter, str(d / "adapter_model.safetensors"))
    json.dump({"peft_type": "LORA", "r": R, "lora_alpha": ALPHA, "bias": "none",
               "target_modules": ["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"]},
              open(d / "adapter_config.json", "w"))
    m = tmp_path_factory.mktemp("lora-merged")
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(base, f), m / f)
    save_file(merged, str(m / "model.safetensors"))
    return base, str(d), str(m)


def answer(server, model):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Name three colours."}],
                                  max_tokens=12, temperature=0, logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    return [t.token for t in lp], np.array([[a.logprob for a in t.top_logprobs] for t in lp])


def ps_size(server):
    [m] = requests.get(server.url + "/api/ps", timeout=10).json()["models"]
    return m["size"]


def served(model, *extra):
    s = Server(*extra, model=model)
    try:
        return answer(s, model), s
    except Exception:
        s.stop()
        raise


def test_adapter_answers_as_the_merged_weights(models):
    base, adapter, merged = models
    (tokens, lps), s = served(base, "--lora", adapter)
    try:
        show = ollama.Client(host=s.url).show(base)
        assert show.modelinfo["wick.lora_adapters"] == ["my-adapter"]
    finally:
        s.stop()
    (want_tokens, want_lps), m = served(merged)
    m.stop()
    assert tokens == want_tokens
    assert np.abs(lps - want_lps).max() < 1e-3
    # the adapter changes the answer, and at scale 0 it is as good as absent
    (plain_tokens, plain_lps), p = served(base)
    p.stop()
    assert np.abs(plain_lps - want_lps).max() > 1e-2
    (zero_tokens, zero_lps), z = served(base, "--lora-scaled", adapter, "0")
    z.stop()
    assert zero_tokens == plain_tokens
    assert np.abs(zero_lps - plain_lps).max() < 1e-5


def test_named_adapter_is_a_model_beside_its_base(models):
    base, adapter, merged = models
    m = Server(model=merged)
    try:
        want = answer(m, merged)
        want_ollama = ollama.Client(host=m.url).generate(model=merged, prompt="Say hi.",
                                                         options={"temperature": 0, "num_predict": 8})
    finally:
        m.stop()
    p = Server(model=base)
    try:
        want_plain = answer(p, base)
    finally:
        p.stop()
    s = Server("--lora-modules", f"mine={adapter}", model=base)
    try:
        # both names, at once (their rows share batches) and one after another
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda name: answer(s, name), ["mine", base, "mine", base]))
        for (tokens, lps), (want_tokens, want_lps) in zip(got, [want, want_plain] * 2):
            assert tokens == want_tokens
            assert np.abs(lps - want_lps).max() < 1e-3
        # Ollama's names (":latest") reach it too
        r = ollama.Client(host=s.url).generate(model="mine:latest", prompt="Say hi.",
                                               options={"temperature": 0, "num_predict": 8})
        assert r.response == want_ollama.response
        assert r.model == "mine:latest"
        # listed as vLLM lists adapters: the base as parent, the adapter as root
        listed = {x.id: x for x in oa(s).models.list().data}
        assert listed["mine"].parent == base and listed["mine"].root == adapter
        assert oa(s).models.retrieve("mine").parent == base
        assert "mine:latest" in [x.model for x in ollama.Client(host=s.url).list().models]
        with pytest.raises(openai.NotFoundError):
            oa(s).chat.completions.create(model="yours", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=1)
        assert s.proc.poll() is None
    finally:
        s.stop()


def test_lora_modules_take_vllms_json_form(models):
    base, adapter, merged = models
    spec = json.dumps({"name": "mine", "path": adapter, "base_model_name": "some/hub-name"})
    s = Server("--lora-modules", spec, model=base)
    try:
        listed = {x.id: x for x in oa(s).models.list().data}
        assert listed["mine"].parent == base and listed["mine"].root == adapter
        # the adapter applies: its answer's logprobs are not the base's
        assert np.abs(answer(s, "mine")[1] - answer(s, base)[1]).max() > 1e-2
    finally:
        s.stop()


@pytest.mark.parametrize("flag, message", [("mine", "expected NAME=PATH"),
                                           ('{"name": "mine"}', 'expected {"name": NAME, "path": PATH}'),
                                           ("{not json", 'expected {"name": NAME, "path": PATH}'),
                                           ("mine=/nowhere", "no such adapter"),
                                           ("{model}=x", "is the name of --model")])
def test_bad_lora_modules_are_clear_errors(models, flag, message):
    base = models[0]
    r = subprocess.run([WICK, "serve", "--model", base, "--port", str(free_port()), "--lora-modules",
                        flag.replace("{model}", base)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert message in r.stdout + r.stderr


def stream_logprobs(server, model, on_first=None):
    """A greedy stream of 1000 tokens (EOS ignored: a second or more): its tokens' logprobs;
    on_first runs after its first chunk."""
    stream = oa(server).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=1000,
        temperature=0, stream=True, logprobs=True, extra_body={"ignore_eos": True})
    lps = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
            if on_first and not lps:
                on_first()
            lps += [t.logprob for t in chunk.choices[0].logprobs.content]
    return lps


def test_adapters_load_and_unload_while_serving(models):
    """vLLM's runtime LoRA updating (--allow-runtime-lora): an adapter loaded through
    /v1/load_lora_adapter answers as the merged weights and is listed beside its base; a
    stream that runs with it while it is unloaded finishes with the same text; then its name
    is gone. Bad requests get clear errors, and without the flag the endpoints answer 403."""
    base, adapter, merged = models
    with_merged = Server(model=merged)
    try:
        want = answer(with_merged, merged)
    finally:
        with_merged.stop()
    s = Server("--allow-runtime-lora", model=base)
    load, unload = s.url + "/v1/load_lora_adapter", s.url + "/v1/unload_lora_adapter"
    try:
        want_plain = answer(s, base)
        size0 = ps_size(s)
        r = requests.post(load, json={"lora_name": "live", "lora_path": adapter}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.text == "Success: LoRA adapter 'live' added successfully."
        # the pool's byte budget and /api/ps count the adapter's file
        adapter_bytes = os.path.getsize(os.path.join(adapter, "adapter_model.safetensors"))
        assert ps_size(s) == size0 + adapter_bytes
        for (tokens, lps), (want_tokens, want_lps) in zip([answer(s, "live"), answer(s, base)],
                                                          [want, want_plain]):
            assert tokens == want_tokens
            assert np.abs(lps - want_lps).max() < 1e-3
        listed = {x.id: x for x in oa(s).models.list().data}
        assert listed["live"].parent == base and listed["live"].root == adapter
        assert "live:latest" in [x.model for x in ollama.Client(host=s.url).list().models]

        def refused(url, body, status, text):
            r = requests.post(url, json=body, timeout=60)
            assert r.status_code == status, r.text
            assert text in r.json()["error"]["message"]

        refused(load, {"lora_name": "live", "lora_path": adapter}, 400, "has already been loaded")
        refused(load, {"lora_name": "x"}, 400, "'lora_path' must be provided")
        refused(load, {"lora_path": adapter}, 400, "'lora_name' must be provided")
        refused(load, {"lora_name": "x", "lora_path": "/nowhere"}, 404, "no such adapter")
        refused(load, {"lora_name": "x", "lora_path": os.path.join(base, "config.json")}, 400, "config.json")
        refused(load, {"lora_name": base, "lora_path": adapter}, 400, "names a model")
        refused(unload, {"lora_name": "yours"}, 404, "cannot be found")
        # loaded again in place: a new number, the same answer
        r = requests.post(load, json={"lora_name": "live", "lora_path": adapter, "load_inplace": True},
                          timeout=60)
        assert r.status_code == 200, r.text
        assert answer(s, "live")[0] == want[0]
        # a stream with the adapter outlives its unloading, bit for bit
        whole = stream_logprobs(s, "live")
        unloaded = []
        got = stream_logprobs(s, "live", on_first=lambda: unloaded.append(
            requests.post(unload, json={"lora_name": "live"}, timeout=60)))
        assert unloaded[0].status_code == 200, unloaded[0].text
        assert unloaded[0].text == "Success: LoRA adapter 'live' removed successfully."
        assert len(got) == len(whole) == 1000
        assert got == whole
        with pytest.raises(openai.NotFoundError):
            answer(s, "live")
        assert "live" not in [x.id for x in oa(s).models.list().data]
        assert ps_size(s) == size0
        refused(unload, {"lora_name": "live"}, 404, "cannot be found")
        assert answer(s, base)[0] == want_plain[0]
        assert s.proc.poll() is None
    finally:
        s.stop()
    s = Server(model=base)
    try:
        r = requests.post(s.url + "/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": adapter},
                          timeout=60)
        assert r.status_code == 403
        assert "--allow-runtime-lora" in r.json()["error"]["message"]
    finally:
        s.stop()


def test_adapter_names_do_not_shadow_stored_models(models, tmp_path):
    """A name that a model in the store has cannot name an adapter: not at start
    (--lora-modules), not through /v1/load_lora_adapter; and /api/copy cannot give a stored
    model an adapter's name. Otherwise requests naming it would silently get the other."""
    base, adapter, _ = models
    store = tmp_path / "store"
    store.mkdir()
    shutil.copytree(base, store / "shelf")
    env = {"WICK_MODELS": str(store)}
    p = subprocess.run([WICK, "serve", "--model", base, "--port", str(free_port()),
                        "--lora-modules", f"shelf={adapter}"],
                       capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert p.returncode != 0
    assert "shelf is the name of a model in the store" in p.stderr + p.stdout
    s = Server("--allow-runtime-lora", "--lora-modules", f"mine={adapter}", env=env, model=base)
    try:
        r = requests.post(s.url + "/v1/load_lora_adapter", json={"lora_name": "shelf", "lora_path": adapter},
                          timeout=60)
        assert r.status_code == 400, r.text
        assert "names a model in the store" in r.json()["error"]["message"]
        assert answer(s, "shelf")[0] == answer(s, base)[0]  # the stored copy of the base
        for dest in ("mine", "mine:latest"):
            r = requests.post(s.url + "/api/copy", json={"source": "shelf", "destination": dest}, timeout=60)
            assert r.status_code == 409, r.text
            assert "names a LoRA adapter" in r.json()["error"]
        assert sorted(os.listdir(store)) == ["shelf"]
        assert s.proc.poll() is None
    finally:
        s.stop()
