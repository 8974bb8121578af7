"""Token controls and echo through the `openai` client against a real `wick serve`:
logit_bias, vLLM's min_tokens and ignore_eos, completions' echo (the prompt's
text and its tokens' logprobs, as lm-evaluation-harness scores with them), and
vLLM's chat echo and add_generation_prompt."""
import openai
import pytest
import requests

from conftest import oa

PROMPT = "The capital of France is"


def tokenize(server, text):
    r = requests.post(server.url + "/tokenize", json={"content": text, "add_special": True}, timeout=30)
    r.raise_for_status()
    return r.json()["tokens"]


def token_id(server, piece):
    ids = requests.post(server.url + "/tokenize", json={"content": piece}, timeout=30).json()["tokens"]
    assert len(ids) == 1, f"{piece!r} is {len(ids)} tokens"
    return ids[0]


def first_token(c):
    return c.choices[0].logprobs.tokens[0], c.choices[0].logprobs.top_logprobs[0]


def test_a_ban_gives_the_next_best_token(server, model_name):
    """-100 on the greedy token: the answer starts with the runner-up of the plain
    answer's distribution, and the logprobs stay the model's (before the bias)."""
    client = oa(server)
    plain = client.completions.create(model=model_name, prompt=PROMPT, temperature=0, max_tokens=4, logprobs=3)
    tok, top = first_token(plain)
    ranked = sorted(top.items(), key=lambda kv: -kv[1])
    assert ranked[0][0] == tok
    banned = token_id(server, tok)
    biased = client.completions.create(model=model_name, prompt=PROMPT, temperature=0, max_tokens=4, logprobs=3,
                                       logit_bias={str(banned): -100})
    tok2, top2 = first_token(biased)
    assert tok2 == ranked[1][0]
    assert biased.choices[0].logprobs.token_logprobs[0] == pytest.approx(ranked[1][1], abs=1e-5)
    assert top2 == pytest.approx(top)  # the same distribution: the bias is the sampler's
    assert tok not in biased.choices[0].logprobs.tokens
    # sampled too: never drawn
    many = client.completions.create(model=model_name, prompt=PROMPT, temperature=1.0, max_tokens=1, n=8, seed=3,
                                     logit_bias={str(banned): -100})
    assert all(c.text != tok for c in many.choices)


def test_a_plus_hundred_bias_forces_its_token(server, model_name):
    forced = token_id(server, " Paris")
    c = oa(server).chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Count to 5."}],
                                           temperature=0, max_tokens=6, logit_bias={str(forced): 100})
    assert c.choices[0].message.content == " Paris" * 6
    assert c.choices[0].finish_reason == "length"


def test_min_tokens_and_ignore_eos(server, model_name):
    """min_tokens holds the end back (the answer runs on from the plain one's text);
    ignore_eos runs to max_tokens; streamed alike."""
    client = oa(server)
    msgs = [{"role": "user", "content": "Reply with the single word OK."}]
    plain = client.chat.completions.create(model=model_name, messages=msgs, temperature=0, max_tokens=64)
    assert plain.choices[0].finish_reason == "stop"
    n = plain.usage.completion_tokens  # the end-of-turn token included
    held = client.chat.completions.create(model=model_name, messages=msgs, temperature=0, max_tokens=64,
                                          extra_body={"min_tokens": n + 4})
    assert held.usage.completion_tokens >= n + 4
    assert held.choices[0].message.content.startswith(plain.choices[0].message.content)
    parts = []
    for chunk in client.chat.completions.create(model=model_name, messages=msgs, temperature=0, max_tokens=64,
                                                stream=True, extra_body={"min_tokens": n + 4}):
        parts += [c.delta.content for c in chunk.choices if c.delta.content]
    assert "".join(parts) == held.choices[0].message.content
    run_on = client.chat.completions.create(model=model_name, messages=msgs, temperature=0, max_tokens=24,
                                            extra_body={"ignore_eos": True})
    assert run_on.usage.completion_tokens == 24 and run_on.choices[0].finish_reason == "length"


def test_bad_token_controls_name_the_field(server, model_name):
    client = oa(server)
    cases = [({"logit_bias": {"x": 1}}, "logit_bias"), ({"logit_bias": {"5": 101}}, "logit_bias"),
             ({"logit_bias": {"99999999": 1}}, "logit_bias"), ({"extra_body": {"min_tokens": 9}}, "min_tokens"),
             ({"extra_body": {"ignore_eos": "yes"}}, "ignore_eos")]
    for kwargs, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=model_name, prompt=PROMPT, max_tokens=4, **kwargs)
        assert e.value.body["param"] == param, kwargs


def test_echo_scores_the_prompt(server, model_name):
    """max_tokens 0 with echo and logprobs: the prompt's text and one entry per prompt
    token (the first null), equal to vLLM's prompt_logprobs; no completion tokens."""
    ids = tokenize(server, PROMPT)
    client = oa(server)
    c = client.completions.create(model=model_name, prompt=ids, max_tokens=0, echo=True, logprobs=2)
    ch = c.choices[0]
    assert ch.text == PROMPT and ch.finish_reason == "length"
    assert c.usage.prompt_tokens == len(ids) and c.usage.completion_tokens == 0
    lp = ch.logprobs
    assert len(lp.tokens) == len(ids) and "".join(lp.tokens) == PROMPT
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:j]) for j in range(len(ids))]
    ref = client.completions.create(model=model_name, prompt=ids, max_tokens=1,
                                    extra_body={"prompt_logprobs": 2}).choices[0].model_extra["prompt_logprobs"]
    for j in range(1, len(ids)):
        assert lp.token_logprobs[j] == pytest.approx(ref[j][str(ids[j])]["logprob"], abs=1e-6)
        want_top = {e["decoded_token"]: e["logprob"] for e in ref[j].values() if e["rank"] <= 2}
        assert lp.top_logprobs[j] == pytest.approx(want_top, abs=1e-6)
    # each prompt token's entry is the distribution a generation from the prefix before it sees
    for j in (1, len(ids) - 1):
        step = client.completions.create(model=model_name, prompt=ids[:j], max_tokens=1, temperature=0, logprobs=2)
        assert step.choices[0].logprobs.top_logprobs[0] == pytest.approx(lp.top_logprobs[j], abs=1e-4)


def test_echo_as_lm_eval_harness_asks(server, model_name):
    """lm-evaluation-harness's loglikelihood request (local-completions): token-id
    prompts (context + continuation) in one batch, max_tokens 1, logprobs 1, echo; it
    sums token_logprobs[ctxlen:-1] and calls a continuation greedy when each of its
    tokens' logprob is the top one."""
    client = oa(server)
    ctx = tokenize(server, PROMPT)
    greedy = client.completions.create(model=model_name, prompt=ctx, max_tokens=3, temperature=0, logprobs=0)
    greedy_ids = tokenize(server, PROMPT + greedy.choices[0].text)[len(ctx):]
    other_ids = tokenize(server, PROMPT + " a banana")[len(ctx):]
    batch = [ctx + greedy_ids, ctx + other_ids]
    out = client.completions.create(model=model_name, prompt=batch, max_tokens=1, logprobs=1, echo=True,
                                    temperature=0, seed=1234)
    assert len(out.choices) == 2
    verdicts = []
    for choice, ids in zip(sorted(out.choices, key=lambda c: c.index), batch):
        lps, tops = choice.logprobs.token_logprobs, choice.logprobs.top_logprobs
        assert len(lps) == len(ids) + 1  # the prompt, then the one generated token
        cont = lps[len(ctx):-1]
        assert all(x is not None and x <= 0 for x in cont)
        verdicts.append(all(t == pytest.approx(max(top.values()), abs=1e-6)
                            for t, top in zip(cont, tops[len(ctx):-1])))
    assert verdicts == [True, False]
    assert out.usage.prompt_tokens == len(batch[0]) + len(batch[1])


def test_echo_text_streamed_and_per_choice(server, model_name):
    client = oa(server)
    whole = client.completions.create(model=model_name, prompt=["One two", "Red green"], max_tokens=4,
                                      temperature=0, echo=True, n=2)
    texts = [c.text for c in sorted(whole.choices, key=lambda c: c.index)]
    assert texts[0].startswith("One two") and texts[2].startswith("Red green")
    assert texts[0] == texts[1] and texts[2] == texts[3]
    parts = {}
    for chunk in client.completions.create(model=model_name, prompt=["One two", "Red green"], max_tokens=4,
                                           temperature=0, echo=True, n=2, stream=True):
        for c in chunk.choices:
            parts[c.index] = parts.get(c.index, "") + c.text
    assert [parts[i] for i in range(4)] == texts
    only = "".join(c.text for chunk in client.completions.create(model=model_name, prompt="One two", max_tokens=0,
                                                                 echo=True, stream=True) for c in chunk.choices)
    assert only == "One two"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_name, prompt="x", echo=True, logprobs=1, stream=True)
    assert e.value.body["param"] == "echo"
    with pytest.raises(openai.BadRequestError) as e:  # max_tokens 0 needs echo
        client.completions.create(model=model_name, prompt="x", max_tokens=0)
    assert e.value.body["param"] == "max_tokens"


def rendered(server, msgs, **kw):
    r = requests.post(server.url + "/apply-template", json={"messages": msgs, **kw}, timeout=30)
    r.raise_for_status()
    return r.json()["prompt"]


def chat_text(client, model_name, msgs, stream=False, **extra):
    kw = dict(model=model_name, messages=msgs, temperature=0, max_tokens=12, extra_body=extra)
    if not stream:
        return client.chat.completions.create(**kw).choices[0].message.content
    return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw)
                   if c.choices)


def test_add_generation_prompt_false_renders_no_new_turn(server, model_name):
    """vLLM's add_generation_prompt: false renders the conversation without the
    assistant's turn header, and the answer is plain completion's of that text."""
    msgs = [{"role": "user", "content": "Name a colour."}]
    with_turn = rendered(server, msgs)
    without = rendered(server, msgs, add_generation_prompt=False)
    assert with_turn.startswith(without) and len(with_turn) > len(without)
    client = oa(server)
    got = chat_text(client, model_name, msgs, add_generation_prompt=False)
    want = client.completions.create(model=model_name, prompt=tokenize(server, without), temperature=0,
                                     max_tokens=12).choices[0].text
    assert got == want
    r = requests.post(server.url + "/v1/chat/completions", timeout=30, json={
        "model": model_name, "messages": msgs + [{"role": "assistant", "content": "Red"}],
        "continue_final_message": True, "add_generation_prompt": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"
    # a null add_generation_prompt is an absent one: the prefill is continued
    r = requests.post(server.url + "/v1/chat/completions", timeout=30, json={
        "model": model_name, "messages": msgs + [{"role": "assistant", "content": "Red"}], "max_tokens": 2,
        "continue_final_message": True, "add_generation_prompt": None})
    assert r.status_code == 200, r.text


def test_chat_echo_repeats_the_message_the_answer_continues(server, model_name):
    """vLLM's chat echo: the content starts with the final message's text when the
    answer continues its role (a prefilled assistant reply, or any message with
    add_generation_prompt false), streamed first too; after a user turn, nothing."""
    client = oa(server)
    prefill = [{"role": "user", "content": "What is the capital of France?"},
               {"role": "assistant", "content": "The capital of France is"}]
    plain = chat_text(client, model_name, prefill, continue_final_message=True)
    for stream in (False, True):
        got = chat_text(client, model_name, prefill, stream, continue_final_message=True, echo=True)
        assert got == "The capital of France is" + plain, (stream, got)
    user = [{"role": "user", "content": "Name a colour."}]
    assert chat_text(client, model_name, user, echo=True) == chat_text(client, model_name, user)
    as_rendered = chat_text(client, model_name, user, add_generation_prompt=False)
    assert chat_text(client, model_name, user, True, add_generation_prompt=False, echo=True) == \
        "Name a colour." + as_rendered
