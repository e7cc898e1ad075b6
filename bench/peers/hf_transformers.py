#!/usr/bin/env python3
"""Peer benchmark: HF transformers (torch bf16, SDPA attention, greedy, static cache) on random weights with
the shapes of a lathe checkpoint's config.json (the same shapes as `lathe synth`; torch's random init, since
transformers cannot read MLX-quantized weights). Prints one JSON object like bench/cuda_e2e.

usage: hf_transformers.py CHECKPOINT_DIR [--decode-steps N]
"""
import argparse
import json
import statistics
import time

import torch
import transformers


def timed(fn, reps):
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--decode-steps", type=int, default=128)
    args = ap.parse_args()
    cfg = transformers.AutoConfig.from_pretrained(args.checkpoint)
    cfg.torch_dtype = torch.bfloat16
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16, attn_implementation="sdpa")
    model.eval()
    vocab = min(cfg.vocab_size, 100000)
    gen = torch.Generator(device="cuda").manual_seed(1)

    def ids(n):
        return torch.randint(0, vocab, (1, n), device="cuda", generator=gen)

    def generate(prompt, new):
        return model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                              cache_implementation="static", pad_token_id=0)

    out = {"engine": f"transformers {transformers.__version__} / torch {torch.__version__}", "checkpoint": args.checkpoint}
    with torch.inference_mode():
        generate(ids(32), 4)  # warm-up
        out["prefill"] = []
        for n in (512, 4096):
            p = ids(n)
            ms = timed(lambda: model(p, use_cache=False, logits_to_keep=1), 3)
            out["prefill"].append({"tokens": n, "ttft_ms": ms, "tok_s": n / (ms / 1000.0)})
        p = ids(128)
        t1 = timed(lambda: generate(p, 1), 2)
        tn = timed(lambda: generate(p, args.decode_steps + 1), 2)
        out["decode"] = [{"context": 128, "steps": args.decode_steps,
                          "tok_s": args.decode_steps / ((tn - t1) / 1000.0)}]
    out["peak_device_mib"] = torch.cuda.max_memory_allocated() / 1048576.0
    print(json.dumps(out))


if __name__ == "__main__":
    main()
