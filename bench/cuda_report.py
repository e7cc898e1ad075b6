#!/usr/bin/env python3
"""Turns the device outputs of scripts/cuda_device.sh (kernels.json, e2e.jsonl, peer.jsonl) into the markdown
tables of docs/benchmarks/cuda.md. usage: cuda_report.py RESULTS_DIR"""
import json
import os
import sys


def load_lines(path):
    if not os.path.exists(path):
        return []
    return [json.loads(l) for l in open(path) if l.strip().startswith("{")]


def main():
    d = sys.argv[1]
    e2e = load_lines(os.path.join(d, "e2e.jsonl"))
    peers = {os.path.basename(p["checkpoint"]).split("-16-")[0]: p for p in load_lines(os.path.join(d, "peer.jsonl"))}
    print("| checkpoint | weights | prefill 512 tok/s (TTFT ms) | prefill 4096 tok/s (TTFT ms) | decode ctx 128 tok/s |"
          " decode ctx 4096 tok/s | peak device MiB | cudaMalloc in decode |")
    print("|---|---|---|---|---|---|---|---|")
    for r in e2e:
        name = os.path.basename(r["model"])
        like, bits, gs = name.rsplit("-", 2)
        w = "bf16" if bits == "16" else f"{bits}-bit g{gs}"
        p = {x["tokens"]: x for x in r["prefill"]}
        dec = {x["context"]: x for x in r["decode"]}
        mallocs = sum(x["malloc_calls_in_loop"] for x in r["decode"])
        print(f"| {like} | {w} | {p[512]['tok_s']:,.0f} ({p[512]['ttft_ms']:.1f}) | {p[4096]['tok_s']:,.0f} "
              f"({p[4096]['ttft_ms']:.1f}) | {dec[128]['tok_s']:,.0f} | {dec[4096]['tok_s']:,.0f} | "
              f"{r['peak_device_mib']:,.0f} | {mallocs} |")
    if peers:
        print()
        print("| checkpoint | HF prefill 512 | HF prefill 4096 | HF decode ctx 128 | HF peak MiB |")
        print("|---|---|---|---|---|")
        for like, p in peers.items():
            pf = {x["tokens"]: x for x in p["prefill"]}
            print(f"| {like} | {pf[512]['tok_s']:,.0f} | {pf[4096]['tok_s']:,.0f} | {p['decode'][0]['tok_s']:,.1f} |"
                  f" {p['peak_device_mib']:,.0f} |")
    kp = os.path.join(d, "kernels.json")
    if os.path.exists(kp):
        k = json.load(open(kp))
        print()
        print(f"Device copy bandwidth (read + write): {k['copy_GB_s']:,.0f} GB/s")
        print()
        print("| GEMV N×K | weights | µs | GB/s | % of copy |")
        print("|---|---|---|---|---|")
        for g in k["gemv"]:
            print(f"| {g['N']}×{g['K']} | {g['bits']}-bit g{g['group_size']} | {g['us']:.1f} | {g['GB_s']:,.0f} |"
                  f" {g['pct_of_copy']:.0f}% |")
        print()
        print("| GEMM M×N×K | ours (dequant + cuBLAS) µs | cuBLAS bf16 µs | ours TFLOP/s | cuBLAS TFLOP/s | ratio |")
        print("|---|---|---|---|---|---|")
        for g in k["gemm"]:
            print(f"| {g['M']}×{g['N']}×{g['K']} | {g['ours_us']:.0f} | {g['cublas_bf16_us']:.0f} |"
                  f" {g['ours_tflops']:.0f} | {g['cublas_tflops']:.0f} | {g['ratio']:.2f} |")


if __name__ == "__main__":
    main()
