#!/usr/bin/env python3
"""Why does a llama-server completion end early? Starts llama-server with the given arguments, sends one greedy
completion of token ids (the prompt serve_load sends client 0) to its native /completion endpoint with
ignore_eos, and prints one JSON line: the stop type, the tokens generated, the last few tokens with their top
candidates and probabilities, and any non-finite probability seen. Used on the device (scripts/cuda_device.sh
peer-probe) where session 14 saw streams end before max_tokens.

Usage: llama_server_probe.py --server BIN [--port 18091] [--prompt-tokens 128] [--max-tokens 128] -- ARGS...
"""
import argparse
import json
import math
import subprocess
import sys
import time
import urllib.error
import urllib.request


def post(port, path, body, timeout=600):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_ready(port, proc, limit_s):
    t0 = time.time()
    while time.time() - t0 < limit_s:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.5)
    raise RuntimeError("server not ready")


def strip_bytes(x):
    """The probabilities without their per-token byte arrays (long, and the token text says the same)."""
    if isinstance(x, dict):
        return {k: strip_bytes(v) for k, v in x.items() if k != "bytes"}
    if isinstance(x, list):
        return [strip_bytes(v) for v in x]
    return x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--port", type=int, default=18091)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--label", default="")
    ap.add_argument("--n-probs", type=int, default=0, help="top candidates per token (0: none asked)")
    ap.add_argument("--log", help="write the server's stdout and stderr here")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    args = [x for x in a.args if x != "--"]
    log = open(a.log, "wb") if a.log else subprocess.DEVNULL
    proc = subprocess.Popen([a.server, "--port", str(a.port)] + args, stdout=log, stderr=subprocess.STDOUT)
    out = {"label": a.label, "args": args}
    try:
        wait_ready(a.port, proc, 300)
        # serve_load's prompt for client 0, round 0.
        prompt = [5 + (k * 7) % 500 for k in range(a.prompt_tokens)]
        r = post(a.port, "/completion", {"prompt": prompt, "n_predict": a.max_tokens, "ignore_eos": True,
                                         "temperature": 0, "return_tokens": True, "n_probs": a.n_probs,
                                         "post_sampling_probs": False, "cache_prompt": False})
        toks = r.get("tokens", [])
        probs = r.get("completion_probabilities", [])
        nonfinite = 0
        for p in probs:
            for c in p.get("top_logprobs", p.get("top_probs", [])):
                v = c.get("logprob", c.get("prob", 0.0))
                if isinstance(v, float) and not math.isfinite(v):
                    nonfinite += 1
        out.update({"stop_type": r.get("stop_type"), "stopping_word": r.get("stopping_word"),
                    "tokens_predicted": r.get("tokens_predicted"), "n_tokens": len(toks), "last_tokens": toks[-5:],
                    "last_probs": strip_bytes(probs[-3:]), "first_probs": strip_bytes(probs[:2]), "nonfinite_probs": nonfinite,
                    "truncated": r.get("truncated")})
    except urllib.error.HTTPError as e:  # the server's own error body says why
        out["error"] = f"HTTP {e.code}: {e.read()[:2000].decode(errors='replace')}"
    except Exception as e:  # the line still says what failed
        out["error"] = str(e)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
