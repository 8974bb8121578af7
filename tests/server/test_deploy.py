"""The deployment recipe (Dockerfile, deploy/k8s/*.yaml): the files parse, agree with each other,
and name only what wick and the gateway have: wick serve started with the container's arguments
answers the probes the manifests name, and the gateway's flags exist in the pinned sglang-router."""
import json
import os
import re
import shlex
import subprocess
import sys
import time

import pytest
import requests

from conftest import MODEL, WICK, free_port, skip_or_fail

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
yaml = pytest.importorskip("yaml")


def dockerfile():
    """Instructions of the Dockerfile as (KEYWORD, argument), continuation lines joined."""
    text = open(os.path.join(ROOT, "Dockerfile")).read().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            kw, _, arg = line.partition(" ")
            out.append((kw.upper(), arg.strip()))
    return out


def manifests(name):
    with open(os.path.join(ROOT, "deploy", "k8s", name)) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def find(docs, kind, name):
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def container_port(container, name_or_number):
    for p in container.get("ports", []):
        if name_or_number in (p.get("name"), p["containerPort"]):
            return p["containerPort"]
    raise AssertionError(f"container {container['name']} has no port {name_or_number}")


def entrypoint():
    ins = dict(dockerfile())
    return json.loads(ins["ENTRYPOINT"]), json.loads(ins["CMD"])


def test_dockerfile_builds_with_make_and_runs_as_a_user_on_a_volume():
    ins = dockerfile()
    kws = [k for k, _ in ins]
    assert ins[0][0] == "FROM" and ins[0][1].startswith("debian:"), "a Debian base"
    assert any(k == "RUN" and "make build" in a for k, a in ins), "built by make build"
    users = [a for k, a in ins if k == "USER"]
    assert users and users[-1] not in ("root", "0"), "the server runs as a non-root user"
    assert kws.index("USER") > max(i for i, k in enumerate(kws) if k == "RUN"), "USER after the last RUN"
    assert json.loads(dict(ins)["VOLUME"]) == ["/models"]
    assert re.search(r"WICK_MODELS=/models\b", dict(ins)["ENV"]), "the store is the volume"
    ep, _ = entrypoint()
    assert ep[:2] == ["wick", "serve"]
    port = ep[ep.index("--port") + 1]
    assert dict(ins)["EXPOSE"] == port
    assert ep[ep.index("--host") + 1] == "0.0.0.0"


def test_manifests_agree_with_the_image_and_each_other():
    ep, _ = entrypoint()
    image_port = int(ep[ep.index("--port") + 1])
    docs = manifests("wick.yaml")
    dep = find(docs, "Deployment", "wick")
    pod = dep["spec"]["template"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    c = pod["spec"]["containers"][0]
    assert container_port(c, "http") == image_port
    for probe in ("readinessProbe", "livenessProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == "/health"
        assert container_port(c, get["port"]) == image_port
    mount = next(m for m in c["volumeMounts"] if m["name"] == "models")
    assert mount["mountPath"] == "/models"
    assert {"name": "WICK_MODELS", "value": "/models"} in c["env"]
    claim = next(v for v in pod["spec"]["volumes"] if v["name"] == "models")["persistentVolumeClaim"]
    find(docs, "PersistentVolumeClaim", claim["claimName"])
    svc = find(docs, "Service", "wick")
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert container_port(c, svc["spec"]["ports"][0]["targetPort"]) == image_port

    gw_docs = manifests("gateway.yaml")
    gw = find(gw_docs, "Deployment", "wick-gateway")["spec"]["template"]["spec"]
    cmd = " ".join(gw["containers"][0]["args"])
    launch = shlex.split(cmd[cmd.index("python -m sglang_router"):].replace("$(POD_NAMESPACE)", "ns"))
    flags = [a for a in launch if a.startswith("--")]
    value = lambda f: launch[launch.index(f) + 1]
    assert int(value("--service-discovery-port")) == image_port
    key, _, val = value("--selector").partition("=")
    assert pod["metadata"]["labels"].get(key) == val, "the gateway's selector picks the wick pods"
    assert value("--policy") == "cache_aware"
    gw_port = int(value("--port"))
    gw_c = gw["containers"][0]
    assert container_port(gw_c, "http") == gw_port
    gsvc = find(gw_docs, "Service", "wick-gateway")
    assert container_port(gw_c, gsvc["spec"]["ports"][0]["targetPort"]) == gw_port
    role = find(gw_docs, "Role", "wick-gateway")
    assert {"get", "list", "watch"} <= set(role["rules"][0]["verbs"]) and "pods" in role["rules"][0]["resources"]
    pytest.importorskip("sglang_router")
    help_text = subprocess.run([sys.executable, "-m", "sglang_router.launch_router", "--help"],
                               capture_output=True, text=True, timeout=60).stdout
    for f in flags:
        assert f in help_text, f"sglang-router has no {f}"


def test_wick_started_as_the_container_answers_the_probes():
    if not os.path.exists(MODEL):
        skip_or_fail(f"default model missing: {MODEL}")
    ep, cmd = entrypoint()
    c = find(manifests("wick.yaml"), "Deployment", "wick")["spec"]["template"]["spec"]["containers"][0]
    args = ep[2:] + c.get("args", cmd)
    port = free_port()
    args[args.index("--port") + 1] = str(port)
    store = os.path.dirname(MODEL)  # the default model is smollm2.gguf in the test's store
    assert os.path.basename(MODEL) == "smollm2.gguf"
    proc = subprocess.Popen([WICK, "serve", *args], env={**os.environ, "WICK_MODELS": store},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while time.time() < deadline:
            assert proc.poll() is None, "wick serve exited: " + proc.stdout.read()
            try:
                if requests.get(url + "/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.2)
        for probe in ("readinessProbe", "livenessProbe"):
            r = requests.get(url + c[probe]["httpGet"]["path"], timeout=5)
            assert r.status_code == 200, probe
        # what the gateway reads from each worker it discovers
        for path in ("/get_model_info", "/get_server_info", "/get_load", "/v1/models"):
            assert requests.get(url + path, timeout=5).status_code == 200, path
    finally:
        proc.terminate()
        proc.wait(10)
