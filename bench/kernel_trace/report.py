#!/usr/bin/env python3
"""Prints a bench/kernel_trace JSON file as a table: per kernel (demangled names shortened to the template's
name) its launches and GPU time per step, and the window's span and busy time per step.
Usage: bench/kernel_trace/report.py FILE [--steps N] [--top K]"""
import argparse
import json
import re


def short(name):
    # "_ZN5lathe4cuda..18attn_decode_kernelILi4EE..." -> "attn_decode_kernel": the mangled name's <length><id>
    # pieces, the last one naming a kernel; cuBLAS's unmangled names stay whole.
    ids, i = [], 0
    while i < len(name):
        m = re.match(r"(\d+)", name[i:])
        if not m:
            i += 1
            continue
        n, start = int(m.group(1)), i + len(m.group(1))
        piece = name[start:start + n]
        if n > 0 and len(piece) == n and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", piece):
            ids.append(piece)
            i = start + n
        else:
            i = start
    kernels = [x for x in ids if "kernel" in x]
    return kernels[-1] if kernels else name[:60]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--steps", type=int, default=1, help="steps in the traced window (per-step figures)")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    d = json.load(open(a.file))
    n = a.steps
    print(f"span {d['span_ms'] / n:.3f} ms/step, GPU busy {d['busy_ms'] / n:.3f} ms/step ({d['records']} records)")
    busy = d["busy_ms"] or 1.0
    for k in d["kernels"][: a.top]:
        print(f"{k['total_ms'] / n:8.3f} ms/step {k['total_ms'] / busy:6.1%} {k['count'] / n:7.1f}/step "
              f"{k['mean_us']:9.2f} us  {short(k['name'])}")


if __name__ == "__main__":
    main()
