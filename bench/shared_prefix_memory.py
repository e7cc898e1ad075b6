#!/usr/bin/env python3
"""KV memory of concurrent requests that share a long system prompt, through `lathe serve` (CPU).

Starts `lathe serve` on the checkpoint, primes the prompt cache with the system prompt alone (max_tokens 1), then
sends N chat requests at once, each the system prompt plus its own question, and samples the server's proportional
set size (Pss) and the KV pool (GET /v1/cache: its blocks and the pages they really hold) while they run. With a
paged cache the N rows map one copy of the prompt's blocks; without one each row holds its own. One JSON line on stdout.

usage: shared_prefix_memory.py --lathe BIN --model DIR [--clients N] [--system-words W] [--max-tokens T]
                               [--serve-arg ARG]... [--label L]
"""
import argparse
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, body, timeout=600):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
        return json.load(r)


def pss_kb(pid):
    """Proportional set size: a page mapped at several addresses (a block shared by several caches) counts
    once, where VmRSS counts it at every mapping."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lathe", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--system-words", type=int, default=1500)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--serve-arg", action="append", default=[])
    ap.add_argument("--label", default="", help="a name for this run in the output (the build, say)")
    a = ap.parse_args()

    port = free_port()
    proc = subprocess.Popen([a.lathe, "serve", "--model", a.model, "--port", str(port), *a.serve_arg],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                get(port, "/health")
                break
            except OSError:
                time.sleep(0.1)
        model_id = get(port, "/v1/models")["data"][0]["id"]
        words = " ".join(f"rule{k % 97} item{k % 13}" for k in range(a.system_words // 2))
        system = {"role": "system", "content": "You follow these house rules. " + words}

        def body(question, max_tokens):
            return {"model": model_id, "messages": [system, {"role": "user", "content": question}],
                    "max_tokens": max_tokens, "temperature": 0, "logit_bias": {}, "ignore_eos": True}

        prime = post(port, body("Say hello.", 1))
        prompt_tokens = prime["usage"]["prompt_tokens"]
        idle_pss = pss_kb(proc.pid)
        results = [None] * a.clients

        def one(i):
            results[i] = post(port, body(f"Question {i}: what is rule {i}?", a.max_tokens))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(a.clients)]
        peak_pss, peak_pool, peak_refs = idle_pss, 0, 0
        primed_resident = get(port, "/v1/cache")["ram"].get("pool_resident_bytes", 0)
        peak_resident = primed_resident
        start = time.time()
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            peak_pss = max(peak_pss, pss_kb(proc.pid))
            ram = get(port, "/v1/cache")["ram"]
            peak_pool = max(peak_pool, ram.get("pool_bytes", 0))
            peak_refs = max(peak_refs, ram.get("pool_block_refs", 0))
            peak_resident = max(peak_resident, ram.get("pool_resident_bytes", 0))
            time.sleep(0.05)
        for t in threads:
            t.join()
        wall = time.time() - start
        cached = [r["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0) for r in results]
        print(json.dumps({"label": a.label, "clients": a.clients, "prompt_tokens": prompt_tokens, "serve_args": a.serve_arg,
                          "pss_after_prime_mb": round(idle_pss / 1024, 1),
                          "peak_pss_mb": round(peak_pss / 1024, 1),
                          "peak_pss_growth_mb": round((peak_pss - idle_pss) / 1024, 1),
                          "peak_pool_mb": round(peak_pool / 2**20, 1), "peak_pool_block_refs": peak_refs,
                          "pool_resident_after_prime_mb": round(primed_resident / 2**20, 1),
                          "peak_pool_resident_mb": round(peak_resident / 2**20, 1),
                          "cached_tokens": cached, "wall_s": round(wall, 2)}))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
