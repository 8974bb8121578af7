"""Faults outside the requests: a model file truncated under a running server,
and `wick convert` writing to a disk that runs out of room (docs/security.md,
"Faults")."""
import os
import shutil
import subprocess
import tempfile

import requests

import conftest
from conftest import WICK, Server, skip_or_fail

SHARED = os.environ.get("WICK_SHARED_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared"))
TINY_LLAMA = os.path.join(SHARED, "fixtures", "tiny-models", "llama")


def complete(s, prompt):
    return requests.post(s.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2}, timeout=120)


def test_a_model_file_truncated_under_the_server_does_not_bring_it_down(tmp_path):
    if not os.path.exists(conftest.MODEL):
        skip_or_fail(f"default model missing: {conftest.MODEL}")
    copy = tmp_path / "m.gguf"
    shutil.copyfile(conftest.MODEL, copy)
    saved = conftest.MODEL
    conftest.MODEL = str(copy)
    try:
        s = Server()
    finally:
        conftest.MODEL = saved
    try:
        assert complete(s, "Hello").status_code == 200
        os.truncate(copy, 0)  # in place: the same inode, now empty
        r = complete(s, "An unrelated request")
        assert r.status_code == 500, r.text
        err = r.json()["error"]
        assert err["code"] == "model_load_failed" and str(copy) in err["message"], r.text
        assert s.proc.poll() is None, "the server died"
        # alive, and honest: the default model is not loaded now
        assert requests.get(s.url + "/health", timeout=5).status_code == 503
        with open(conftest.MODEL, "rb") as src, open(copy, "r+b") as dst:  # rewritten in place
            shutil.copyfileobj(src, dst)
        assert complete(s, "Hello again").status_code == 200
        assert requests.get(s.url + "/health", timeout=5).status_code == 200
        os.unlink(copy)  # deleted: names resolve to files, so this one is gone (404), no crash
        r = complete(s, "Still there?")
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
        assert s.proc.poll() is None
    finally:
        s.stop()


def convert_fails_cleanly(out_dir, prefix, expect):
    out = os.path.join(out_dir, "out.gguf")
    p = subprocess.run(prefix + [WICK, "convert", TINY_LLAMA, out, "--type", "f32"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0, p.stdout + p.stderr
    msg = p.stdout + p.stderr
    assert f"{out}: write failed after" in msg and expect in msg and "nothing was written there" in msg, msg
    assert os.listdir(out_dir) == [], os.listdir(out_dir)  # no partial file, no temporary


def test_convert_to_a_full_disk_leaves_no_partial_file(tmp_path):
    if not os.path.isdir(TINY_LLAMA):
        skip_or_fail(f"no tiny llama fixture at {TINY_LLAMA}")
    # A file-size limit stands in for a full disk anywhere (no root needed).
    limited = tmp_path / "limited"
    limited.mkdir()
    convert_fails_cleanly(str(limited), ["bash", "-c", 'ulimit -f 64; trap "" XFSZ; exec "$@"', "-"],
                          "File too large")
    # A real full disk where a small tmpfs can be mounted (root, as in CI).
    mnt = tempfile.mkdtemp(prefix="wick-full-")
    try:
        if shutil.which("mount") and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", mnt],
                                                    capture_output=True).returncode == 0:
            try:
                convert_fails_cleanly(mnt, [], "No space left on device")
            finally:
                subprocess.run(["umount", mnt], check=True)
    finally:
        os.rmdir(mnt)
