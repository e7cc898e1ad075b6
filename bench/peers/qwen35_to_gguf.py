#!/usr/bin/env python3
"""Write an F16 GGUF (llama.cpp's format, arch `qwen35`) holding the same weights as a bf16/f16/f32 Qwen3.5
(model_type qwen3_5_text: Gated DeltaNet linear-attention layers mixed with gated full attention) safetensors
checkpoint.

For benchmarks against llama.cpp on the same weights: `lathe synth --like qwen3.5-0.8b --bits 16 --vocab-size 151936
--out DIR` writes a bf16 checkpoint; this turns it into a `qwen35 F16` GGUF, which `llama-quantize --pure` then takes
to Q4_0 / Q8_0. Like qwen3_to_gguf.py (whose safetensors reader and tokenizer writer it reuses) it needs only numpy
and llama.cpp's gguf-py package (PYTHONPATH=LLAMA_SRC/gguf-py, with PyYAML installed), not torch or transformers.

Usage: PYTHONPATH=LLAMA_SRC/gguf-py qwen35_to_gguf.py CHECKPOINT_DIR TOKENIZER_DIR OUT.gguf
  TOKENIZER_DIR as for qwen3_to_gguf.py (tokenizer.json and tokenizer_config.json, each may be gzipped). With the
  Qwen3 tokenizer (tests/fixtures/tokenizers/qwen3-real) the checkpoint's vocab_size must be >= 151669, e.g. 151936.

What changes on the way, as llama.cpp's converter does it for Qwen3.5 (its qwen35 loader expects these forms):
  - RMSNorm weights stored zero-centred in HF checkpoints (input_layernorm, post_attention_layernorm, q_norm, k_norm,
    model.norm) get +1; the gated norm of the linear-attention layers (linear_attn.norm, a plain scale) does not;
  - linear_attn.A_log is stored as A = -exp(A_log) (`ssm_a`), dt_bias becomes `ssm_dt.bias`;
  - conv1d weights [C, 1, K] lose their middle axis ([C, K]) and stay f32, as every vector does;
  - when linear_num_value_heads > linear_num_key_heads, the value heads of in_proj_qkv's V rows, in_proj_z, in_proj_a,
    in_proj_b, A_log, dt_bias, the conv's V channels and out_proj's columns go from grouped-by-key-head order to
    tiled order (a no-op for the 0.8B shape, 16 and 16 heads);
  - q_proj (query and output gate interleaved per head) and everything else go in unchanged apart from
    bf16 -> f16 (exact for the values of a synthetic checkpoint).
Metadata: the ssm.* keys (conv kernel, state size = key head dim, group count = key heads, time-step rank = value
heads, inner size = value heads x value head dim), full_attention_interval, rope dimension count =
head_dim x partial_rotary_factor, and rope dimension sections [11, 11, 10, 0] (Qwen3.5's interleaved MRoPE default;
for text all three position components are equal, so it is ordinary partial rope). Tied embeddings: no
`output.weight`.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import qwen3_to_gguf as q3  # noqa: E402  (reader, bf16 -> f32, tokenizer; it imports numpy and gguf or says why not)

np, gguf = q3.np, q3.gguf

# Hugging Face Qwen3.5 names -> GGUF names (llama.cpp's src/models/qwen35.cpp loads these).
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    **q3.ATTENTION_NAMES,
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.A_log": "ssm_a",
    "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.norm.weight": "ssm_norm.weight",
    **q3.MLP_NAMES,
}
# Zero-centred RMSNorm weights (scale 1 + w in HF Qwen3.5); llama.cpp stores 1 + w.
PLUS_ONE = {"input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_norm.weight",
            "self_attn.k_norm.weight"}


def split_name(hf):
    """(layer index or None, rest of the name)."""
    parts = hf.split(".", 3)  # model.layers.N.rest
    if len(parts) == 4 and parts[0] == "model" and parts[1] == "layers" and parts[2].isdecimal():
        return int(parts[2]), parts[3]
    return None, hf


def gguf_name(hf):
    layer, rest = split_name(hf)
    if layer is None and hf in q3.TOP_NAMES:
        return q3.TOP_NAMES[hf]
    if layer is not None and rest in LAYER_NAMES:
        return f"blk.{layer}.{LAYER_NAMES[rest]}"
    sys.exit(f"qwen35_to_gguf: no GGUF name for tensor {hf}")


def tile_v_heads(x, axis, k_heads, v_per_k, head_dim):
    """Value heads along `axis` from grouped order [k0: v0..v(r-1), k1: ...] to tiled order [v0 of k0, k1, ...,
    v1 of k0, k1, ...]."""
    shape = list(x.shape)
    x = x.reshape(shape[:axis] + [k_heads, v_per_k, head_dim] + shape[axis + 1:])
    return np.ascontiguousarray(np.swapaxes(x, axis, axis + 1)).reshape(shape)


def transform(rest, x, cfg):
    """The tensor as llama.cpp's qwen35 loader wants it (see the docstring)."""
    kh, vh = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    kd, vd = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    if rest.startswith("linear_attn.") and kh != vh:
        r = vh // kh
        if rest == "linear_attn.in_proj_qkv.weight":
            x = np.concatenate([x[:2 * kh * kd], tile_v_heads(x[2 * kh * kd:], 0, kh, r, vd)], axis=0)
        elif rest == "linear_attn.in_proj_z.weight":
            x = tile_v_heads(x, 0, kh, r, vd)
        elif rest in ("linear_attn.in_proj_a.weight", "linear_attn.in_proj_b.weight",
                      "linear_attn.A_log", "linear_attn.dt_bias"):
            x = tile_v_heads(x, 0, kh, r, 1)
        elif rest == "linear_attn.conv1d.weight":
            x = x.reshape(x.shape[0], x.shape[-1])
            x = np.concatenate([x[:2 * kh * kd], tile_v_heads(x[2 * kh * kd:], 0, kh, r, vd)], axis=0)
        elif rest == "linear_attn.out_proj.weight":
            x = tile_v_heads(x, 1, kh, r, vd)
    if rest == "linear_attn.A_log":
        x = -np.exp(x)
    elif rest == "linear_attn.conv1d.weight":
        x = x.reshape(x.shape[0], x.shape[-1])  # [C, 1, K] -> [C, K]
    elif rest in PLUS_ONE or rest == "model.norm.weight":
        x = x + 1.0
    return x


def main():
    ckpt, tok_dir, out, cfg, tensors = q3.read_checkpoint(__doc__, "qwen35_to_gguf", ("qwen3_5_text", "qwen3_5"))

    L = cfg["num_hidden_layers"]
    interval = cfg.get("full_attention_interval", 4)
    expected = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(L)]
    if cfg.get("layer_types", expected) != expected:
        # llama.cpp could take an explicit per-layer list; this converter writes only the interval.
        sys.exit(f"qwen35_to_gguf: layer_types is not 'full attention every {interval}th layer'")
    rope = cfg.get("rope_parameters") or {}
    rope_theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000000.0)))
    partial = float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25)))
    if rope.get("rope_type", "default") != "default":
        sys.exit(f"qwen35_to_gguf: rope_type {rope.get('rope_type')!r} is not supported here")
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    sections = list(rope.get("mrope_section", [11, 11, 10]))
    sections = (sections + [0, 0, 0, 0])[:4]

    arch = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.QWEN35]
    tmp = out + ".tmp"
    w = q3.open_gguf(arch, tmp, ckpt, cfg, head_dim)
    w.add_rope_dimension_sections(sections)
    w.add_rope_freq_base(rope_theta)
    w.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
    w.add_ssm_state_size(cfg["linear_key_head_dim"])
    w.add_ssm_group_count(cfg["linear_num_key_heads"])
    w.add_ssm_time_step_rank(cfg["linear_num_value_heads"])
    w.add_ssm_inner_size(cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"])
    w.add_full_attention_interval(interval)
    w.add_rope_dimension_count(int(head_dim * partial))
    n_tok = q3.add_vocab(w, tok_dir, cfg)

    def tensor_of(hf):
        name = gguf_name(hf)
        x = transform(split_name(hf)[1], q3.to_f32(*tensors[hf]), cfg)
        # Matrices in f16; vectors, norms and the conv kernel in f32, as convert_hf_to_gguf.py --outtype f16 does.
        return name, x, x.ndim <= 1 or name.endswith("_norm.weight") or ".ssm_conv1d." in name

    q3.write_gguf(w, tensors, tmp, out, cfg, n_tok, tensor_of)


if __name__ == "__main__":
    main()
