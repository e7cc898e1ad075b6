#!/usr/bin/env python3
"""Write an F16 GGUF (llama.cpp's format) holding the same weights as a bf16/f16/f32 Qwen3 safetensors checkpoint.

For benchmarks against llama.cpp on the same weights: `lathe synth --like qwen3-0.6b --bits 16 --out DIR` writes a
bf16 checkpoint; this turns it into `qwen3 F16` GGUF, which `llama-quantize --pure` then takes to Q4_0 / Q8_0.
llama.cpp's own converter (convert_hf_to_gguf.py) needs torch and transformers; this one needs only numpy and
llama.cpp's gguf-py package (put its directory on PYTHONPATH, e.g. SRC/gguf-py, and have PyYAML installed).

Usage: PYTHONPATH=LLAMA_SRC/gguf-py qwen3_to_gguf.py [--as-llama] CHECKPOINT_DIR TOKENIZER_DIR OUT.gguf
  TOKENIZER_DIR holds tokenizer.json and tokenizer_config.json (each may be gzipped, as in
  tests/fixtures/tokenizers/qwen3-real): the real Qwen3 byte-level BPE vocabulary and merges, padded to the
  checkpoint's vocab_size with [PADi] tokens the way convert_hf_to_gguf.py does it.

The weights go in unchanged apart from bf16 -> f16 (exact for every bf16 value in f16's normal range, which covers
all of a synthetic checkpoint's matrices); norms are stored as f32. Qwen3 uses NeoX rope in both engines, so q/k
rows are not permuted. Tied embeddings: no `output.weight`; llama.cpp reuses token_embd for the logits.
"""
import gzip
import json
import os
import shutil
import struct
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    sys.exit("qwen3_to_gguf: needs numpy (apt-get install -y python3-numpy)")
try:
    import gguf
except ImportError as e:
    sys.exit(f"qwen3_to_gguf: cannot import gguf ({e}); set PYTHONPATH=LLAMA_SRC/gguf-py "
             "(and apt-get install -y python3-numpy python3-yaml)")


def read_safetensors(path):
    """{name: (dtype string, shape, numpy view)} over a memory map of one safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        out[name] = (info["dtype"], info["shape"], data[begin:end])
    return out


def to_f32(dtype, shape, raw):
    if dtype == "BF16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if dtype == "F16":
        return raw.view(np.float16).astype(np.float32).reshape(shape)
    if dtype == "F32":
        return np.array(raw.view(np.float32)).reshape(shape)
    sys.exit(f"qwen3_to_gguf: tensor dtype {dtype} is not bf16/f16/f32 (quantized checkpoints are not supported)")


# Hugging Face Qwen3 names -> GGUF names (llama.cpp's src/models/qwen3.cpp loads these); the attention and MLP
# parts are shared with qwen35_to_gguf.py.
ATTENTION_NAMES = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
}
MLP_NAMES = {
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    **ATTENTION_NAMES,
    "post_attention_layernorm.weight": "ffn_norm.weight",
    **MLP_NAMES,
}
TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_name(hf):
    if hf in TOP_NAMES:
        return TOP_NAMES[hf]
    parts = hf.split(".", 3)  # model.layers.N.rest
    if len(parts) == 4 and parts[0] == "model" and parts[1] == "layers" and parts[3] in LAYER_NAMES:
        return f"blk.{int(parts[2])}.{LAYER_NAMES[parts[3]]}"
    sys.exit(f"qwen3_to_gguf: no GGUF name for tensor {hf}")


def read_maybe_gz(directory, name):
    for candidate, opener in ((name, open), (name + ".gz", gzip.open)):
        p = os.path.join(directory, candidate)
        if os.path.exists(p):
            with opener(p, "rt", encoding="utf-8") as f:
                return f.read()
    sys.exit(f"qwen3_to_gguf: {directory} has neither {name} nor {name}.gz")


def looks_special(text):
    return text.startswith("<|") and text.endswith("|>")


def add_vocab(writer, tok_dir, cfg):
    tok_json = read_maybe_gz(tok_dir, "tokenizer.json")
    tok_cfg = read_maybe_gz(tok_dir, "tokenizer_config.json")
    tok = json.loads(tok_json)
    vocab_size = cfg["vocab_size"]
    reverse = {i: t for t, i in tok["model"]["vocab"].items()}
    added = {a["id"]: a for a in tok.get("added_tokens", [])}
    for i, a in added.items():
        reverse[i] = a["content"]
    if max(reverse) >= vocab_size:
        sys.exit(f"qwen3_to_gguf: tokenizer id {max(reverse)} >= vocab_size {vocab_size}")
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(reverse[i])
            special = added[i].get("special") or looks_special(reverse[i])
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(reverse[i])
            types.append(gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")  # Qwen2/Qwen3 pre-tokenizer regex, as convert_hf_to_gguf.py detects it
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    # Merges, bos/eos/pad ids, add_bos and the chat template: gguf-py's SpecialVocab reads them from the files
    # as transformers would (tokenizer.json, tokenizer_config.json, config.json).
    with tempfile.TemporaryDirectory() as d:
        for name, text in (("tokenizer.json", tok_json), ("tokenizer_config.json", tok_cfg),
                           ("config.json", json.dumps(cfg))):
            with open(os.path.join(d, name), "w", encoding="utf-8") as f:
                f.write(text)
        special = gguf.SpecialVocab(d, load_merges=True, n_vocab=vocab_size)
        special.add_to_gguf(writer)
    return len(reverse)


def open_gguf(arch, tmp, ckpt, cfg, head_dim):
    """A GGUF writer for arch at tmp with the metadata every Qwen shape shares (blocks, sizes, heads, eps, f16)."""
    w = gguf.GGUFWriter(tmp, arch)
    w.add_name("synthetic " + os.path.basename(os.path.normpath(ckpt)))
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    return w


def write_gguf(w, tensors, tmp, out, cfg, n_tok, tensor_of):
    """Adds every tensor (tensor_of(hf name) -> (GGUF name, f32 array, whether it stays f32; f16 otherwise)) in a
    fixed order, writes the file under tmp, moves it to out and prints a one-line JSON summary."""
    n_params = 0
    for hf in sorted(tensors, key=lambda n: (n.count("."), n)):
        name, x, keep_f32 = tensor_of(hf)
        n_params += x.size
        w.add_tensor(name, x.astype(np.float32) if keep_f32 else x.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, out)
    print(json.dumps({"out": out, "tensors": len(tensors), "parameters": int(n_params),
                      "tokenizer_tokens": n_tok, "vocab_size": cfg["vocab_size"],
                      "bytes": os.path.getsize(out)}))


def read_checkpoint(usage, prog, model_types):
    """(checkpoint dir, tokenizer dir, output path, config, {name: tensor}) from the command line; exits with the
    usage, or saying why the checkpoint does not fit (another model type, quantized weights)."""
    if len(sys.argv) != 4:
        sys.exit(usage)
    ckpt, tok_dir, out = sys.argv[1:]
    with open(os.path.join(ckpt, "config.json")) as f:
        cfg = json.load(f)
    cfg = {**cfg, **cfg.get("text_config", {})}
    if cfg.get("model_type") not in model_types:
        sys.exit(f"{prog}: model_type {cfg.get('model_type')!r}, expected {model_types[0]!r}")
    if "quantization" in cfg:
        sys.exit(f"{prog}: the checkpoint is quantized; give a bf16/f16/f32 one (lathe synth --bits 16)")
    tensors = {}
    for f in sorted(f for f in os.listdir(ckpt) if f.endswith(".safetensors")):
        tensors.update(read_safetensors(os.path.join(ckpt, f)))
    return ckpt, tok_dir, out, cfg, tensors


def main():
    # --as-llama: a llama.cpp older than its Qwen3 support (2025-04) still runs the same matrices as arch "llama"
    # without the per-head q/k RMSNorm (a few thousand multiplies a token), so speed can be compared; the outputs
    # are not Qwen3's (llama.cpp's llama rope pairs dimensions differently), only the work and the bytes match.
    as_llama = "--as-llama" in sys.argv
    if as_llama:
        sys.argv.remove("--as-llama")
    ckpt, tok_dir, out, cfg, tensors = read_checkpoint(__doc__, "qwen3_to_gguf", ("qwen3",))
    if as_llama:
        tensors = {k: v for k, v in tensors.items() if not k.endswith(("q_norm.weight", "k_norm.weight"))}
    elif not hasattr(gguf.MODEL_ARCH, "QWEN3"):
        sys.exit("qwen3_to_gguf: this gguf-py (llama.cpp) predates Qwen3; pass --as-llama for a speed stand-in")

    arch = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA if as_llama else gguf.MODEL_ARCH.QWEN3]
    tmp = out + ".tmp"
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    w = open_gguf(arch, tmp, ckpt, cfg, head_dim)
    w.add_rope_freq_base(float(cfg["rope_theta"]))
    if as_llama:
        w.add_rope_dimension_count(head_dim)  # llama.cpp's llama arch otherwise takes hidden / heads
    n_tok = add_vocab(w, tok_dir, cfg)

    def tensor_of(hf):
        x = to_f32(*tensors[hf])
        # Matrices in f16, vectors (norms) in f32, as convert_hf_to_gguf.py --outtype f16 does.
        return gguf_name(hf), x, x.ndim != 2

    write_gguf(w, tensors, tmp, out, cfg, n_tok, tensor_of)


if __name__ == "__main__":
    main()
