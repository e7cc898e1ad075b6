#!/usr/bin/env python3
"""How well does the reference implementation itself (HF transformers + torch) keep the f32 argmax in bf16?

For every fixture under tests/fixtures/models/<arch>-<variant>/ this builds the HF model from config.json
(AutoModelForCausalLM.from_config on the text config), loads the checkpoint (MLX affine-quantized weights are
dequantized to float32: value = scales*q + biases), and runs each reference prompt (chat, long, one, chat_greedy)
as one forward over all its tokens, no KV cache, scoring every position against reference.safetensors:
  f32        the model in float32: a sanity check, should match the reference to ~1e-6 with every argmax equal;
  bf16_cast  the same model after model.to(torch.bfloat16) (this also casts the rope inv_freq buffers);
  bf16_init  a model built with from_config(dtype=torch.bfloat16), as from_pretrained(dtype=bf16) builds it
             (buffers computed in float32 at init stay float32), weights rounded to bf16 on load.
Figures, summed over the 4 prompts like tests/cuda/parity_test.cc (Bf16KeepsArgmax): positions whose argmax equals
the reference argmax / total positions, max over prompts of max|Δ| / max(1, max|ref|), and the widest reference
top-1/top-2 gap (/ max(1, max|ref|)) among the missed positions, and how many misses are exact ties of the
model's own top-2 logits (bf16 logits can tie; argmax then takes the lower id). Logits are cast to f32 before
comparing. A fixture that fails to load is reported as an error and the others still run.

usage: python3 bench/peers/hf_bf16_agreement.py tests/fixtures/models [--device cuda] [--attn eager|sdpa]
                                                 [--only SUBSTR ...] [--out file.json]
"""
import argparse
import json
import os
import struct
import sys
import traceback

import torch
import transformers

PROMPTS = ("chat", "long", "one", "chat_greedy")
IGNORED = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")
ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
             "I64": torch.int64, "I32": torch.int32, "U32": torch.int32,  # U32: same bits, read as int32
             "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def read_safetensors(path):
    """{name: (tensor, dtype string)} of one .safetensors file (little-endian host assumed)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = bytearray(f.read())
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = ST_DTYPES[info["dtype"]]
        lo, hi = info["data_offsets"]
        count = (hi - lo) // torch.empty((), dtype=dt).element_size()
        t = torch.frombuffer(data, dtype=dt, offset=lo, count=count) if count else torch.empty(0, dtype=dt)
        out[name] = (t.reshape(info["shape"]).clone(), info["dtype"])
    return out


def dequantize(w, scales, biases, bits, group):
    """MLX affine: element j of each little-endian u32 word at bit offset bits*j; value = scales*q + biases."""
    if bits not in (2, 4, 8):
        raise ValueError(f"unsupported bits {bits}")
    words = w.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(0, 32, bits, dtype=torch.int64)
    q = ((words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)).flatten(-2).float()
    n_in = q.shape[-1]
    want = tuple(q.shape[:-1]) + (n_in // group,)
    if n_in % group or tuple(scales.shape) != want or tuple(biases.shape) != want:
        raise ValueError(f"quantized shapes disagree: weight {tuple(w.shape)} ({bits}-bit, {n_in} inputs), "
                         f"scales {tuple(scales.shape)}, biases {tuple(biases.shape)}, group {group}")
    return scales.float().repeat_interleave(group, -1) * q + biases.float().repeat_interleave(group, -1)


def quant_spec(qcfg, module):
    for key in (module, module.removeprefix("language_model."), "language_model." + module):
        if isinstance(qcfg.get(key), dict):
            return qcfg[key]["bits"], qcfg[key]["group_size"]
    return qcfg["bits"], qcfg["group_size"]


def hf_name(name):
    """Checkpoint name -> HF text-model name; None for tensors a text model ignores (VLM vision parts)."""
    if name.startswith(IGNORED):
        return None
    if name.startswith("language_model."):  # mlx-community VLM wrapper: language_model.model.* / language_model.lm_head
        return name[len("language_model."):]
    if name.startswith("model.language_model."):  # transformers-5 VLM layout
        return "model." + name[len("model.language_model."):]
    return name


def load_checkpoint(d, cfg_json, round_bf16):
    """All tensors as float32 under HF names; quantized modules dequantized. Returns (weights, n_quantized)."""
    index = os.path.join(d, "model.safetensors.index.json")
    files = ["model.safetensors"]
    if os.path.exists(index):  # sharded
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    raw = {}
    for f in files:
        raw.update(read_safetensors(os.path.join(d, f)))
    qcfg = cfg_json.get("quantization") or cfg_json.get("quantization_config") or {}
    out, consumed = {}, set()
    for name in raw:
        if not name.endswith(".scales"):
            continue
        module = name[: -len(".scales")]
        wname = module + ".weight" if module + ".weight" in raw else module
        bits, group = quant_spec(qcfg, module)
        w = dequantize(raw[wname][0], raw[name][0], raw[module + ".biases"][0], bits, group)
        out[wname] = w.to(torch.bfloat16).float() if round_bf16 else w
        consumed |= {wname, name, module + ".biases"}
    for name, (t, dt) in raw.items():
        if name in consumed:
            continue
        if dt == "U32":
            raise ValueError(f"{name}: U32 tensor without .scales")
        out[name] = t.float() if t.is_floating_point() else t
    weights = {}
    for name, t in out.items():
        hn = hf_name(name)
        if hn is not None:
            weights[hn] = t
    return weights, len(consumed) // 3


def load_into(model, weights, model_type):
    """Copy weights into the model's state dict (casting to its dtype); fail loudly on any mismatch."""
    sd = model.state_dict()
    params = {k for k, _ in model.named_parameters(remove_duplicate=False)}
    notes, weights = [], dict(weights)
    mlx_conv = False
    for k, t in list(weights.items()):  # MLX stores conv1d [C, K, 1]; HF wants [C, 1, K]
        if k.endswith("conv1d.weight") and k in sd and t.dim() == 3 and t.shape != sd[k].shape \
                and t.permute(0, 2, 1).shape == sd[k].shape:
            weights[k], mlx_conv = t.permute(0, 2, 1).contiguous(), True
    if mlx_conv and model_type.startswith("qwen3_5"):  # MLX folds the 1 of HF's (1 + w) RMSNorms into the weight
        for k in weights:
            if k.endswith("norm.weight") and ".linear_attn.norm." not in k:
                weights[k] = weights[k] - 1.0
        notes.append("MLX layout: conv1d transposed, (1+w) norm weights shifted by -1")
    unused = sorted(set(weights) - set(sd))
    if unused:
        raise KeyError(f"{len(unused)} checkpoint tensors the HF model has no place for, e.g. {unused[:6]}")
    loaded = set()
    with torch.no_grad():
        for k, dst in sd.items():
            if k in weights:
                if tuple(weights[k].shape) != tuple(dst.shape):
                    raise ValueError(f"{k}: checkpoint shape {tuple(weights[k].shape)}, HF expects {tuple(dst.shape)}")
                dst.copy_(weights[k])
                loaded.add(dst.data_ptr())
    missing = [k for k, dst in sd.items() if k not in weights and dst.data_ptr() not in loaded]  # tied ones are loaded
    if [k for k in missing if k in params]:
        raise KeyError(f"HF parameters missing from the checkpoint: {[k for k in missing if k in params][:6]}")
    notes += [f"buffer {k} left at its init value" for k in missing]
    return notes


@torch.no_grad()
def score(model, prompts, refs, device):
    agree = total = tied = 0
    max_rel = max_abs = widest_gap = 0.0
    for p in PROMPTS:
        ids = torch.tensor([prompts[p]], dtype=torch.long, device=device)
        got = model(input_ids=ids, use_cache=False).logits[0].float().cpu()
        ref = refs["logits_" + p][0]
        if got.shape != ref.shape:
            raise ValueError(f"prompt {p}: logits {tuple(got.shape)} vs reference {tuple(ref.shape)}")
        scale = max(1.0, ref.abs().max().item())
        diff = (got - ref).abs().max().item()
        max_abs, max_rel = max(max_abs, diff), max(max_rel, diff / scale)
        miss = ref.argmax(-1) != got.argmax(-1)
        agree += int((~miss).sum())
        total += ref.shape[0]
        if miss.any():
            top2 = ref[miss].topk(2, dim=-1).values
            widest_gap = max(widest_gap, ((top2[:, 0] - top2[:, 1]).max().item()) / scale)
            gtop2 = got[miss].topk(2, dim=-1).values  # bf16 logits can tie exactly; argmax then takes the first
            tied += int((gtop2[:, 0] == gtop2[:, 1]).sum())
    return {"agree": agree, "total": total, "agreement": agree / total, "max_abs_diff": max_abs,
            "max_rel_diff": max_rel, "widest_missed_ref_gap_rel": widest_gap, "misses_on_exact_ties": tied}


@torch.no_grad()
def greedy(model, prompt, n, device):
    """n greedy tokens after prompt, each from a full forward (no cache: the models are tiny)."""
    ids = list(prompt)
    for _ in range(n):
        x = torch.tensor([ids], dtype=torch.long, device=device)
        ids.append(int(model(input_ids=x, use_cache=False).logits[0, -1].float().argmax()))
    return ids[len(prompt):]


def greedy_report(model, ref_json, device):
    want = ref_json["greedy_continuation"]
    got = greedy(model, ref_json["prompts"]["chat"], len(want), device)
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    return {"match": first is None, "first_divergence": first, "tokens": got}


def run_fixture(d, args):
    cfg_json = json.load(open(os.path.join(d, "config.json")))
    ref_json = json.load(open(os.path.join(d, "reference.json")))
    refs = read_safetensors(os.path.join(d, "reference.safetensors"))
    cfg_dict = {k: v for k, v in cfg_json.items() if k not in ("quantization", "quantization_config")}
    config = transformers.AutoConfig.for_model(cfg_dict.pop("model_type"), **cfg_dict).get_text_config()
    model_type = config.model_type

    def build(weights, dtype):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=args.attn)
        notes = load_into(model, weights, model_type)
        bad = {str(p.dtype) for p in model.parameters() if p.dtype != dtype}
        if bad:
            notes.append(f"parameters not in {dtype}: {sorted(bad)}")
        return model.to(args.device).eval(), notes

    res = {"hf_class": None, "model_type": model_type, "attn_implementation": args.attn}
    weights, n_quant = load_checkpoint(d, cfg_json, round_bf16=False)
    res["quantized_modules"] = n_quant
    model, notes = build(weights, torch.float32)
    res["hf_class"] = type(model).__name__
    res["f32"] = score(model, ref_json["prompts"], refs, args.device)
    res["dequant"] = "f32" if n_quant else "none (bf16 weights)"
    ok = lambda s: s["agree"] == s["total"] and s["max_rel_diff"] <= 1e-3
    if n_quant and not ok(res["f32"]):  # maybe the reference dequantized to bf16: try that, keep the closer one
        w2, _ = load_checkpoint(d, cfg_json, round_bf16=True)
        m2, _ = build(w2, torch.float32)
        s2 = score(m2, ref_json["prompts"], refs, args.device)
        res["f32_with_f32_dequant"] = res["f32"]
        if s2["max_rel_diff"] < res["f32"]["max_rel_diff"]:
            res["f32"], res["dequant"], model, weights = s2, "bf16-rounded", m2, w2
    res["f32_sane"] = ok(res["f32"])
    res["bf16_cast"] = score(model.to(torch.bfloat16), ref_json["prompts"], refs, args.device)
    del model
    model, notes_b = build(weights, torch.bfloat16)
    res["bf16_init"] = score(model, ref_json["prompts"], refs, args.device)
    res["bf16_init"]["greedy"] = greedy_report(model, ref_json, args.device)  # as tests/cuda/parity_test.cc
    res["notes"] = sorted(set(notes + notes_b))
    return res


def fmt(s):
    return (f"{s['agree']:4d}/{s['total']:<4d} ({100 * s['agreement']:5.1f}%) rel {s['max_rel_diff']:.1e} "
            f"gap {s['widest_missed_ref_gap_rel']:.1e}"
            + (f" ties {s['misses_on_exact_ties']}" if s["misses_on_exact_ties"] else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models_dir")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--attn", default="eager", choices=["eager", "sdpa"])
    ap.add_argument("--only", nargs="*", default=[], help="run fixtures whose name contains any of these")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # the f32 sanity check needs true f32 matmuls
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    fixtures = sorted(n for n in os.listdir(args.models_dir)
                      if os.path.exists(os.path.join(args.models_dir, n, "reference.safetensors"))
                      and (not args.only or any(s in n for s in args.only)))
    out = {"engine": f"transformers {transformers.__version__} / torch {torch.__version__}",
           "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
           "attn_implementation": args.attn, "prompts": list(PROMPTS), "fixtures": {}}
    print(f"# {out['engine']} on {out['device']}, attn={args.attn}; "
          "agree/total (%), rel = max|d|/max(1,max|ref|), gap = widest missed ref top-2 gap / max(1,max|ref|)")
    for name in fixtures:
        try:
            r = run_fixture(os.path.join(args.models_dir, name), args)
            print(f"{name:28s} f32 {fmt(r['f32'])}{'' if r['f32_sane'] else ' (NOT SANE)'} | "
                  f"bf16_cast {fmt(r['bf16_cast'])} | bf16_init {fmt(r['bf16_init'])}", flush=True)
            for n in r["notes"]:
                print(f"{'':28s} note: {n}")
        except Exception as e:  # one fixture failing must not stop the others
            r = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            print(f"{name:28s} ERROR {r['error']}", flush=True)
        out["fixtures"][name] = r
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
