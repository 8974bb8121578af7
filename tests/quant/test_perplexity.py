"""`wick perplexity` on a licence text Debian ships, against a numpy
reference computed from `wick logits --all` on the same windows (the
llama-perplexity scheme: windows of --ctx tokens, second half scored)."""
import json
import os
import tempfile

import numpy as np
import pytest
from conftest import wick

TEXT = "/usr/share/common-licenses/GPL-3"
CTX, CHUNKS = 64, 3


@pytest.fixture(scope="module")
def text():
    if not os.path.exists(TEXT):
        pytest.skip(f"{TEXT} is missing")
    return TEXT


def log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def window_logits(model, ids):
    """`wick logits --all` as float32 rows, through --npy (a window's 64 x 49,152 logits
    are 58 MB of JSON: ~5 s to print and parse, where the .npy file takes ~0.1 s)."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "logits.npy")
        r = wick("logits", model, "--ids", ",".join(map(str, ids)), "--all", "--npy", out, "--device", "cpu")
        assert json.loads(r.stdout)["rows"] == len(ids)
        return np.load(out)


def window_logprobs(model, ids):
    return log_softmax(window_logits(model, ids))


def test_logits_npy_equals_json(model):
    ids = [100, 2000, 30000, 7]
    r = wick("logits", model, "--ids", ",".join(map(str, ids)), "--all", "--json", "--device", "cpu")
    rows = np.asarray(json.loads(r.stdout)["logits"], np.float32)
    assert rows.shape == (4, 49152)
    assert np.array_equal(window_logits(model, ids), rows)


def reference(model, text, base=None):
    ids = json.loads(wick("tokenize", model, "-", "--json", "--add-special", input=open(text).read()).stdout)
    first = CTX // 2
    nll, kld, same = [], [], []
    for c in range(CHUNKS):
        win = ids[c * CTX:(c + 1) * CTX]  # SmolLM2 adds no BOS: the window as is
        lp = window_logprobs(model, win)
        nxt = np.array(win[first + 1:])
        nll += list(-lp[np.arange(first, CTX - 1), nxt])
        if base:
            lb = window_logprobs(base, win)[first:CTX - 1]
            lq = lp[first:CTX - 1]
            kld += list((np.exp(lb) * (lb - lq)).sum(-1))
            same += list(lb.argmax(-1) == lq.argmax(-1))
    return np.array(nll), np.array(kld), np.array(same), len(ids)


def test_perplexity_equals_numpy_reference(model, text):
    r = json.loads(wick("perplexity", model, text, "--ctx", CTX, "--chunks", CHUNKS, "--json",
                        "--device", "cpu").stdout)
    nll, _, _, n_tokens = reference(model, text)
    ppl = float(np.exp(nll.mean()))
    err = ppl * float(np.sqrt(nll.var() / (len(nll) - 1)))
    assert np.isfinite(r["ppl"]) and r["ppl"] > 1
    assert r["n_tokens"] == n_tokens and r["n_scored"] == len(nll) == CHUNKS * (CTX // 2 - 1)
    assert r["ppl"] == pytest.approx(ppl, rel=1e-4), (r["ppl"], ppl)
    assert r["ppl_err"] == pytest.approx(err, rel=1e-3)
    assert r["running"][-1] == pytest.approx(r["ppl"])


def test_kl_divergence_equals_numpy_reference(tmp_path, model, text):
    q4 = tmp_path / "q4_0.gguf"
    wick("quantize", model, q4, "--type", "q4_0")
    r = json.loads(wick("perplexity", q4, text, "--ctx", CTX, "--chunks", CHUNKS, "--json",
                        "--kl-divergence", model, "--device", "cpu").stdout)
    nll, kld, same, _ = reference(str(q4), text, base=model)
    k = r["kl_divergence"]
    assert k["mean"] > 0
    assert k["mean"] == pytest.approx(kld.mean(), rel=1e-3, abs=1e-6)
    assert k["p99"] == pytest.approx(np.percentile(kld, 99), rel=1e-3)
    assert k["same_top"] == pytest.approx(same.mean())
    assert r["ppl"] == pytest.approx(float(np.exp(nll.mean())), rel=1e-4)


def test_self_kl_is_zero(model, text):
    r = json.loads(wick("perplexity", model, text, "--ctx", CTX, "--chunks", 1, "--json",
                        "--kl-divergence", model, "--device", "cpu").stdout)
    assert r["kl_divergence"]["mean"] < 1e-9 and r["kl_divergence"]["same_top"] == 1.0
    assert r["kl_divergence"]["ppl_base"] == pytest.approx(r["ppl"])


def test_text_too_short_is_a_clear_error(tmp_path, model):
    short = tmp_path / "short.txt"
    short.write_text("Just a few words.")
    r = wick("perplexity", model, short, "--ctx", CTX, check=False)
    assert r.returncode != 0 and "needs at least 128" in r.stderr
