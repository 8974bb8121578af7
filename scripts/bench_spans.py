#!/usr/bin/env python3
"""Span cache: TTFT cold vs warm, and answer quality against full prefill.

Runs `wick serve` on loopback and sends spnl span queries to
POST /v1/query/execute: a system message, N documents as `plus` children,
then a question. Documents are synthetic filler sentences (TTFT: about 500
tokens each, --doc-sentences; quality: about 130) with one fact planted
("The access code of NAME is NUMBER.").

  ttft     for N in --docs: cold (N new documents) and warm (the same
           documents in another order, another question), greedy, 1 token;
           time of the whole request, as a client sees its first token.
  quality  --queries RAG questions; the first --tokens greedy tokens with the
           span cache (each --recompute setting, then each --settings K:R, i.e.
           --span-recompute K --span-blend R) against a server without it
           (full prefill of the same messages): agreement per word (free-running),
           exact match, how often the planted number is in the answer, and
           the span tokens computed again per query; with --forced also the
           top-1 agreement per position on full prefill's answer, teacher-forced
           (the answer as the assistant's message; prompt_logprobs gives the
           greedy choice at each of its positions), with paired differences.

Standard library only (runs where `pip` is not available, e.g. a GPU box).
Example: scripts/bench_spans.py --wick build/bin/wick --model ~/.cache/wick/models/smollm2.gguf
"""
import argparse
import json
import os
import random
import shlex
import socket
import subprocess
import time
import urllib.request

WORDS = ("river mountain garden window silver market orange winter library engine paper signal "
         "forest harbor castle yellow planet circle bridge pocket").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, wick, model, *extra):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([wick, "serve", "--model", model, "--port", str(self.port),
                                      "--ctx-size", "16384", "--kv-memory", "2048", *extra],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        for _ in range(600):
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("wick serve did not start")

    def post(self, path, body):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())

    def query(self, q):
        req = urllib.request.Request(self.url + "/v1/query/execute?stream=false",
                                     data=json.dumps(q).encode(), method="POST",
                                     headers={"Content-Type": "text/plain"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=600) as r:
            out = json.loads(r.read())
        return out, time.perf_counter() - t0

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)


def document(rng, fact, n_sentences=40):
    sents = [f"The {rng.choice(WORDS)} near the {rng.choice(WORDS)} was {rng.choice(WORDS)}."
             for _ in range(n_sentences)]
    sents.insert(rng.randrange(len(sents) + 1), fact)
    return " ".join(sents)


def query(docs, question, max_tokens, model, answer_start="", prompt_logprobs=None):
    """answer_start: the assistant's answer so far, which the model continues."""
    parts = [{"system": "Answer the question from the documents, briefly."},
             {"plus": [{"user": d} for d in docs]},
             {"user": question}]
    g = {"model": model, "max_tokens": max_tokens, "temperature": 0, "input": {"cross": parts}}
    if answer_start:
        parts.append({"assistant": answer_start})
        g["continue_final_message"] = True
    if prompt_logprobs is not None:
        g["prompt_logprobs"] = prompt_logprobs
    return {"g": g}


def names(rng, n):
    first = "Ada Bo Cy Dee Eli Fay Gus Hal Ivy Jo Kai Lu Mo Ned Oz Pia Quin Rex Sue Tod".split()
    return [f"{rng.choice(first)}{i}" for i in range(n)]


def ttft(args, model):
    srv = Server(args.wick, args.model, "--span-cache", *args.serve_args)
    rows = []
    try:
        for n_docs in args.docs:
            rng = random.Random(n_docs)
            who = names(rng, n_docs)
            docs = [document(rng, f"The access code of {w} is {rng.randrange(1000, 9999)}.",
                             args.doc_sentences) for w in who]
            srv.query(query(["warm-up"], "Hi?", 1, model))
            cold, t_cold = srv.query(query(docs, f"What is the access code of {who[0]}?", 1, model))
            shuffled = docs[:]
            rng.shuffle(shuffled)
            warm, t_warm = srv.query(query(shuffled, f"What is the access code of {who[-1]}?", 1, model))
            rows.append((n_docs, cold["usage"]["prompt_tokens"], t_cold, t_warm,
                         cold["usage"]["span_cache"], warm["usage"]["span_cache"]))
            print(f"{n_docs} docs: prompt {rows[-1][1]} tokens, cold {t_cold * 1e3:.0f} ms, warm "
                  f"{t_warm * 1e3:.0f} ms ({t_cold / t_warm:.1f}x); warm span cache {rows[-1][5]}", flush=True)
    finally:
        srv.stop()
    print("\n| documents | prompt tokens | cold TTFT ms | warm TTFT ms | cold / warm | warm: tokens reused / recomputed |")
    print("|---|---|---|---|---|---|")
    for n, p, c, w, _, sw in rows:
        print(f"| {n} | {p} | {c * 1e3:.0f} | {w * 1e3:.0f} | {c / w:.1f}x | {sw['tokens_reused']} / {sw['tokens_recomputed']} |")


def quality(args, model):
    rng = random.Random(1)
    cases = []
    for i in range(args.queries):
        who = names(rng, args.quality_docs)
        codes = [rng.randrange(1000, 9999) for _ in who]
        docs = [document(rng, f"The access code of {w} is {c}.", 12) for w, c in zip(who, codes)]
        k = rng.randrange(len(who))
        cases.append((docs, f"What is the access code of {who[k]}? Answer with the number.", codes[k]))

    redone = []  # span tokens computed again, per query of the last setting

    def answers(extra, warm):
        srv = Server(args.wick, args.model, *extra, *args.serve_args)
        out = []
        redone.clear()
        try:
            for docs, q, _ in cases:
                if warm:  # the documents cached by an earlier query, in another order
                    srv.query(query(docs[::-1], "Summarise.", 1, model))
                r, _ = srv.query(query(docs, q, args.tokens, model))
                out.append(r["choices"][0]["message"]["content"])
                redone.append(r["usage"].get("span_cache", {}).get("tokens_recomputed", 0))
        finally:
            srv.stop()
        return out

    def tokens(text):
        return text.split()

    def predictions(srv, docs, q, answer, n_answer):
        """The greedy choice at each of the answer's n_answer positions, given the
        tokens before it (teacher forcing: prompt_logprobs over the answer as the
        assistant's message so far), then the next token after it (text, end)."""
        out, _ = srv.query(query(docs, q, 1, model, answer, prompt_logprobs=1))
        lps = out.get("prompt_logprobs") or out["choices"][0]["prompt_logprobs"]
        top1 = [min(e.items(), key=lambda kv: kv[1]["rank"])[0] for e in lps[len(lps) - n_answer:]]
        c = out["choices"][0]
        return top1 + [(c.get("message", {}).get("content", c.get("text")), c["finish_reason"])]

    forced_ref = []  # per query: answer text, its tokens counted, full prefill's predictions

    def forced(extra):
        """Top-1 agreement per position, teacher-forced: at each position of full
        prefill's greedy answer (its first --tokens tokens, and its end if it ended
        before), does the span cache pick full prefill's next token, given the answer
        before it? Positions after a difference still count, unlike exact match."""
        srv = Server(args.wick, args.model, *extra, *args.serve_args)
        try:
            if not forced_ref:  # full prefill: the same server options without the span cache
                for (docs, q, _), a in zip(cases, ref):
                    ids = srv.post("/tokenize", {"content": a})["tokens"]
                    # an answer that ended before --tokens also counts its end (the next
                    # token after the whole answer: the end of the turn)
                    ends = len(ids) < args.tokens
                    ids = ids[:args.tokens]
                    a = srv.post("/detokenize", {"tokens": ids})["content"]
                    want = predictions(srv, docs, q, a, len(ids))
                    forced_ref.append((a, len(ids), want if ends else want[:-1]))
                return [1.0] * len(cases)
            same = []
            for (docs, q, _), (a, n, want) in zip(cases, forced_ref):
                srv.query(query(docs[::-1], "Summarise.", 1, model))
                got = predictions(srv, docs, q, a, n)
                same.append(sum(g == w for g, w in zip(got, want)) / max(len(want), 1))
            return same
        finally:
            srv.stop()

    ref = answers([], False)
    acc_ref = sum(str(c) in a for a, (_, _, c) in zip(ref, cases)) / len(cases)
    print(f"full prefill: answer accuracy {acc_ref:.0%}", flush=True)
    if args.forced:
        forced([])
    col = " top-1 agreement, teacher-forced |" if args.forced else ""
    print(f"\n| setting | exact match | agreement per word (first words) | answer accuracy | "
          f"span tokens recomputed per query |{col}")
    print("|---|---|---|---|---|" + ("---|" if args.forced else ""))
    print(f"| full prefill (reference) | 100% | 100% | {acc_ref:.0%} | |" + (" 100% |" if args.forced else ""))
    settings = [(k, 0.0) for k in args.recompute]
    for st in args.settings:
        k, _, r = st.partition(":")
        settings.append((int(k), float(r or 0)))
    per_question = {}  # setting name: per question, teacher-forced agreement
    for k, blend in settings:
        got = answers(["--span-cache", "--span-recompute", str(k), "--span-blend", str(blend)], True)
        exact = sum(g == r for g, r in zip(got, ref)) / len(cases)
        agree = []
        for g, r in zip(got, ref):
            gw, rw = tokens(g), tokens(r)
            n = max(len(gw), len(rw), 1)
            agree.append(sum(1 for i in range(min(len(gw), len(rw))) if gw[i] == rw[i]) / n)
        acc = sum(str(c) in a for a, (_, _, c) in zip(got, cases)) / len(cases)
        name = f"recompute {k}" + (f", blend {blend:g}" if blend else "")
        n_redone = sum(redone) / len(redone)
        tf = ""
        if args.forced:
            same = forced(['--span-cache', '--span-recompute', str(k), '--span-blend', str(blend)])
            per_question[name] = same
            tf = f" {sum(same) / len(same):.1%} |"
        print(f"| span cache, {name} | {exact:.0%} | {sum(agree) / len(agree):.0%} | {acc:.0%} | "
              f"{n_redone:.0f} |{tf}", flush=True)
    if len(per_question) > 1:  # paired: the same questions, so compare per question
        names_ = list(per_question)
        print("\nteacher-forced agreement, paired differences (mean over questions ± standard error):")
        for i, a in enumerate(names_):
            for b in names_[i + 1:]:
                d = [x - y for x, y in zip(per_question[b], per_question[a])]
                mean = sum(d) / len(d)
                sd = (sum((x - mean) ** 2 for x in d) / max(len(d) - 1, 1)) ** 0.5
                print(f"  {b} minus {a}: {mean:+.2%} ± {sd / len(d) ** 0.5:.2%}")
    if args.save:
        with open(args.save, "w") as f:
            json.dump({"forced": per_question}, f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["ttft", "quality", "both"])
    ap.add_argument("--wick", default="build/bin/wick")
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/wick/models/smollm2.gguf"))
    ap.add_argument("--docs", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--quality-docs", type=int, default=4)
    ap.add_argument("--doc-sentences", type=int, default=60,
                    help="filler sentences per TTFT document (60: about 500 tokens)")
    ap.add_argument("--save", help="quality: write the per-question teacher-forced agreement here (JSON)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--recompute", type=int, nargs="*", default=[0, 16, 32])
    ap.add_argument("--settings", nargs="*", default=[],
                    help="more quality settings K:R (--span-recompute K --span-blend R), e.g. 0:0.15")
    ap.add_argument("--forced", action="store_true",
                    help="also top-1 agreement per position, teacher-forced on full prefill's answer "
                         "(--tokens requests per query and setting)")
    ap.add_argument("--serve", default="", help="more `wick serve` options, e.g. '--device cuda'")
    args = ap.parse_args()
    args.serve_args = shlex.split(args.serve)
    model = args.model  # the operator's --model string: clients may repeat it
    if args.mode in ("ttft", "both"):
        ttft(args, model)
    if args.mode in ("quality", "both"):
        quality(args, model)


if __name__ == "__main__":
    main()
