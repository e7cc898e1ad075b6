#!/usr/bin/env python3
"""lathe vs llama.cpp on the CPU: same synthetic Qwen3-0.6B (or Qwen3.5-0.8B) weights, same bytes, alternated runs,
one machine.

Issue #15's comparison. Run it on a quiet machine (nothing else building or benchmarking beside it):

  bench/peers/cpu_vs_llama_cpp.py --llama-src LLAMA_CPP_SOURCE \
      [--lathe build/lathe] [--rounds 3] [--threads 1,2] [--bits 4,8] [--prompt 128] [--out bench/results/X.json]
      [--like qwen3-0.6b | qwen3.5-0.8b]

What it does (each step cached under --work, default $LATHE_PEER_DIR/cpu-vs-llama-cpp for qwen3-0.6b and
$LATHE_PEER_DIR/cpu-vs-llama-cpp-qwen3.5-0.8b for qwen3.5-0.8b, LATHE_PEER_DIR defaulting to ~/.cache/lathe-peers):
 1. builds llama.cpp's llama-bench and llama-quantize from --llama-src (bench/peers/llama_cpp_build.sh: a source
    tree or a git directory; CPU only, -DGGML_NATIVE=ON; outside this repository);
 2. `lathe synth --like qwen3-0.6b --bits 16 --seed 1` (bf16), then from those same weights
    `lathe quantize --bits 4 --group-size 64` and `--bits 8 --group-size 64` (MLX affine, bf16 scales and biases:
    4.5 and 8.5 bits per weight) and bench/peers/qwen3_to_gguf.py -> F16 GGUF -> `llama-quantize --pure` Q4_0 and
    Q8_0 (4.5 and 8.5 bits per weight: the same bytes, every matrix including the tied embedding/logits one);
    with --like qwen3.5-0.8b (the Gated DeltaNet + gated attention hybrid, llama.cpp arch qwen35):
    `lathe synth --like qwen3.5-0.8b --vocab-size 151936` (so that the Qwen3 tokenizer covers the vocabulary) and
    bench/peers/qwen35_to_gguf.py instead;
 3. copy and read bandwidth (bench/peers/membw.cc) at 1 and 2 threads, before and after the runs;
 4. rounds of: for each bits, for each thread count, `lathe --threads T run --json` (128-token prompt or --prompt, 64
    decode steps, --ignore-eos) and `llama-bench -p 128 -n 64 -t T -r 1` back to back, the order flipped every round;
 5. medians and min/max per engine, bits and threads; ratios against the issue's goals (decode >= 1.3x and prefill
    >= 1.0x llama.cpp at 2 threads, 2 threads >= 1.7x 1 thread); decode weight bytes read per second (weight
    tensor bytes x decode tok/s) next to the measured bandwidth. JSON on stdout and in --out; progress on stderr.

--lathe takes any lathe binary (e.g. one built from another branch), so the same run can be repeated after a kernel
change; the checkpoints are re-made only when missing (--fresh re-makes them).
The converter needs numpy and PyYAML (Debian: apt-get install -y python3-numpy python3-yaml; an early-2025
gguf-py also imports python3-sentencepiece); --python names the
interpreter that has them (default: /usr/bin/python3).
"""
import argparse
import datetime
import gzip
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time

# Peer builds and checkpoints live outside the repo (never committed).
PEER_DIR = os.environ.get("LATHE_PEER_DIR", os.path.expanduser("~/.cache/lathe-peers"))

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
# --like: the synthetic shape, its converter to F16 GGUF and where its files are cached.
SHAPES = {
    "qwen3-0.6b": {"synth": [], "converter": "qwen3_to_gguf.py", "work": "cpu-vs-llama-cpp", "title": "Qwen3-0.6B"},
    # The Qwen3 tokenizer (151,669 ids) under the checkpoint: the vocabulary is padded to 151,936 rather than
    # Qwen3.5's 248,320, so the embedding/logits matrix is the Qwen3-0.6B one.
    "qwen3.5-0.8b": {"synth": ["--vocab-size", "151936"], "converter": "qwen35_to_gguf.py",
                     "work": "cpu-vs-llama-cpp-qwen3.5-0.8b", "title": "Qwen3.5-0.8B (vocabulary 151,936)"},
}
PROMPT = 128
GEN = 64
# The goals (#15).
GOAL_DECODE, GOAL_PREFILL, GOAL_SCALING = 1.3, 1.0, 1.7


def portable_paths(text, a):
    """The saved JSON names no path of this machine: the peer directory as $LATHE_PEER_DIR, the llama.cpp source
    and the lathe binary by their last two components."""
    def tail(path):
        return os.path.join(*os.path.normpath(path).split(os.sep)[-2:])
    for path, name in ((os.path.abspath(a.llama_build), "$LATHE_PEER_DIR/llama.cpp"),
                       (os.path.abspath(a.work), "$LATHE_PEER_DIR/" + SHAPES[a.like]["work"]),
                       (PEER_DIR, "$LATHE_PEER_DIR"),
                       (os.path.abspath(a.llama_src), tail(a.llama_src)),
                       (os.path.abspath(a.lathe), tail(a.lathe)),
                       (REPO, ".")):
        text = text.replace(path, name)
    return text


def log(msg):
    print(f"[{datetime.datetime.utcnow():%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("$ " + " ".join(cmd))
    return subprocess.run(cmd, check=True, text=True, stdout=subprocess.PIPE, **kw).stdout


def tensor_bytes_safetensors(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
    return os.path.getsize(path) - 8 - n


def tensor_bytes_gguf(path, python, llama_src):
    # Sum of tensor bytes from the GGUF header (gguf-py's reader); norms included, as in the safetensors figure.
    code = ("import sys, gguf; r = gguf.GGUFReader(sys.argv[1]); "
            "print(sum(int(t.n_bytes) for t in r.tensors))")
    env = dict(os.environ, PYTHONPATH=os.path.join(llama_src, "gguf-py"))
    return int(subprocess.run([python, "-c", code, path], check=True, text=True, stdout=subprocess.PIPE,
                              env=env).stdout)


def isa_of_binary(path):
    """What vector ISA a binary's code contains: counts of a few telling instructions (objdump)."""
    if not shutil.which("objdump"):
        return {"note": "objdump not found"}
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL).stdout
    counts = {
        "zmm_instructions (AVX-512)": len(re.findall(r"%zmm", out)),
        "vpdpbusd (VNNI)": len(re.findall(r"\bvpdpbusds?\b", out)),
        "vpmaddubsw (AVX2/AVX-512 int8)": len(re.findall(r"\bvpmaddubsw\b", out)),
        "ymm_instructions (AVX/AVX2)": len(re.findall(r"%ymm", out)),
    }
    return counts


def native_isa():
    out = subprocess.run(["c++", "-march=native", "-dM", "-E", "-x", "c++", "/dev/null"], text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
    keep = ("__AVX2__", "__FMA__", "__F16C__", "__AVX512F__", "__AVX512BW__", "__AVX512VL__", "__AVX512VNNI__",
            "__AVXVNNI__", "__AVX512BF16__", "__AVX512VBMI__")
    return [m for m in keep if re.search(r"#define " + m + r"\b", out)]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def loadavg():
    try:
        return [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except OSError:
        return None


def busy_cpu_seconds():
    """(CPU seconds the whole machine has spent busy, CPU seconds of this script's finished children)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    busy = sum(v[:8]) - v[3] - v[4]  # user nice system idle iowait irq softirq steal: all but idle and iowait
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return busy / os.sysconf("SC_CLK_TCK"), ru.ru_utime + ru.ru_stime


def membw(binary, threads):
    return json.loads(run([binary, str(threads), "256", "8"]))


def lathe_run(lathe, model, threads, ids):
    t0 = time.time()
    j = json.loads(run([lathe, "--threads", str(threads), "run", "--model", model, "--ids", ids,
                        "--max-tokens", str(GEN + 1), "--ignore-eos", "--json"]))
    return {"prefill_tok_s": j["prefill_tok_s"], "decode_tok_s": j["decode_tok_s"],
            "decode_steps": j["decode_steps"], "prompt_tokens": j["prompt_tokens"], "load_ms": j["load_ms"],
            "wall_s": round(time.time() - t0, 2), "cpu_isa": j.get("cpu_isa")}


def lathe_run_from_empty(lathe, model, threads):
    """Decode after a one-token prompt: the context depth llama-bench's tg64 runs at (its decode_tok_s)."""
    j = json.loads(run([lathe, "--threads", str(threads), "run", "--model", model, "--ids", "9",
                        "--max-tokens", str(GEN + 1), "--ignore-eos", "--json"]))
    return j["decode_tok_s"]


def bench_has_depth(binary):
    """Whether this llama-bench takes -d (context depth; added in 2025-05): without it, decode is compared from an
    empty context only (lathe_run_from_empty)."""
    text = subprocess.run([binary, "--help"], text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT).stdout
    return re.search(r"^\s*-d, --n-depth", text, re.M) is not None


def llama_bench(binary, gguf_path, threads, depth):
    """pp128 and tg64 from an empty context (the issue's command), then tg64 after `depth` tokens, where lathe's
    decode steps run (lathe decodes after its prompt)."""
    t0 = time.time()
    out = json.loads(run([binary, "-m", gguf_path, "-p", str(PROMPT), "-n", str(GEN), "-t", str(threads),
                          "-r", "1", "-o", "json"], stderr=subprocess.DEVNULL))
    if depth and bench_has_depth(binary):
        out += json.loads(run([binary, "-m", gguf_path, "-p", "0", "-n", str(GEN), "-d", str(depth), "-t",
                               str(threads), "-r", "1", "-o", "json"], stderr=subprocess.DEVNULL))
    res = {"wall_s": round(time.time() - t0, 2)}
    for t in out:
        key = "prefill_tok_s" if t["n_prompt"] > 0 else "decode_tok_s"
        if t.get("n_depth"):
            key = f"decode_at_depth_{t['n_depth']}_tok_s"
        res[key] = t["avg_ts"]
        res.setdefault("info", {k: t.get(k) for k in ("build_commit", "cpu_info", "backends", "model_type",
                                                       "model_size", "n_batch", "flash_attn", "type_k")})
    return res


def summarize(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2),
            "max": round(max(values), 2), "n": len(values)}


def summarize_result(result):
    """Medians per engine, bits and threads; ratios against #15's goals; decode weight GB/s vs bandwidth."""
    models = {int(k): v for k, v in result["models"].items()}
    threads = result["method"]["threads"]
    bits_list = sorted(models)
    bw_before = {int(k): v for k, v in result["bandwidth"]["before"].items()}
    bw_after = {int(k): v for k, v in result["bandwidth"].get("after", result["bandwidth"]["before"]).items()}
    summary = {}
    for bits in bits_list:
        for eng in ("lathe", "llama.cpp"):
            for t in threads:
                rs = [x for x in result["runs"] if x["engine"] == eng and x["bits"] == bits and x["threads"] == t]
                s = {"prefill_tok_s": summarize([x.get("prefill_tok_s") for x in rs]),
                     "decode_tok_s": summarize([x.get("decode_tok_s") for x in rs])}
                deep = summarize([x.get(f"decode_at_depth_{PROMPT}_tok_s") for x in rs])
                if deep:
                    s[f"decode_at_depth_{PROMPT}_tok_s"] = deep
                empty = summarize([x.get("decode_from_empty_tok_s") for x in rs])
                if empty:
                    s["decode_from_empty_tok_s"] = empty
                wb = models[bits][eng]["weight_bytes"]
                bw = max(bw_before[t]["read_gb_s"], bw_after[t]["read_gb_s"])
                cp = max(bw_before[t]["copy_gb_s"], bw_after[t]["copy_gb_s"])
                if s["decode_tok_s"]:
                    gbs = wb * s["decode_tok_s"]["median"] / 1e9
                    s["decode_weight_gb_s"] = round(gbs, 2)
                    s["best_read_gb_s_same_run"] = bw
                    s["best_copy_gb_s_same_run"] = cp
                    s["decode_weight_pct_of_read_bw"] = round(100 * gbs / bw, 1)
                    s["decode_weight_pct_of_copy_bw"] = round(100 * gbs / cp, 1)
                summary[f"{eng} {bits}-bit T={t}"] = s
        goals = {}
        for t in threads:
            lt, ll = summary.get(f"lathe {bits}-bit T={t}"), summary.get(f"llama.cpp {bits}-bit T={t}")
            if lt and ll and lt["decode_tok_s"] and ll["decode_tok_s"]:
                goals[f"T={t} decode lathe/llama.cpp"] = round(
                    lt["decode_tok_s"]["median"] / ll["decode_tok_s"]["median"], 3)
                goals[f"T={t} prefill lathe/llama.cpp"] = round(
                    lt["prefill_tok_s"]["median"] / ll["prefill_tok_s"]["median"], 3)
                if ll.get(f"decode_at_depth_{PROMPT}_tok_s"):
                    goals[f"T={t} decode lathe/llama.cpp at depth {PROMPT}"] = round(
                        lt["decode_tok_s"]["median"] / ll[f"decode_at_depth_{PROMPT}_tok_s"]["median"], 3)
                if lt.get("decode_from_empty_tok_s"):  # both from an empty context, as llama-bench's tg64
                    goals[f"T={t} decode lathe/llama.cpp from empty"] = round(
                        lt["decode_from_empty_tok_s"]["median"] / ll["decode_tok_s"]["median"], 3)
        if 1 in threads and 2 in threads and "T=2 decode lathe/llama.cpp" in goals and \
                "T=1 decode lathe/llama.cpp" in goals:
            for eng in ("lathe", "llama.cpp"):
                one, two = summary[f"{eng} {bits}-bit T=1"], summary[f"{eng} {bits}-bit T=2"]
                for k in ("decode", "prefill"):
                    goals[f"{eng} {k} T=2/T=1"] = round(two[f"{k}_tok_s"]["median"] / one[f"{k}_tok_s"]["median"], 3)
            # Like for like where the run has it: both engines decoding from an empty context.
            d = goals.get("T=2 decode lathe/llama.cpp from empty", goals.get("T=2 decode lathe/llama.cpp"))
            p = goals.get("T=2 prefill lathe/llama.cpp")
            goals["met"] = {"decode >= 1.3x at T=2": d is not None and d >= GOAL_DECODE,
                            "prefill >= 1.0x at T=2": p is not None and p >= GOAL_PREFILL,
                            "lathe decode T=2 >= 1.7x T=1": goals["lathe decode T=2/T=1"] >= GOAL_SCALING,
                            "lathe prefill T=2 >= 1.7x T=1": goals["lathe prefill T=2/T=1"] >= GOAL_SCALING}
        summary[f"{bits}-bit ratios"] = goals
    return summary


def markdown_table(result):
    """The summary as the Markdown table docs/benchmarks.md carries."""
    sm = result["summary"]
    lines = [f"| engine | weights | MB | threads | prefill {PROMPT} tok/s | decode tok/s | decode weight GB/s "
             "(% of read / copy bw) |", "|---|---|---:|---:|---|---|---|"]
    for key, s in sm.items():
        if "ratios" in key or not s.get("decode_tok_s"):
            continue
        eng, bits, t = key.split(" ")
        b = int(bits.split("-")[0])
        m = result["models"].get(str(b), result["models"].get(b))[eng]
        w = {("lathe", 4): "MLX 4-bit g64", ("lathe", 8): "MLX 8-bit g64", ("llama.cpp", 4): "Q4_0 pure",
             ("llama.cpp", 8): "Q8_0 pure"}.get((eng, b), f"{b}-bit")
        p, d = s["prefill_tok_s"], s["decode_tok_s"]
        deep = s.get(f"decode_at_depth_{PROMPT}_tok_s")
        deep = f"; at depth {PROMPT}: {deep['median']}" if deep else ""
        if s.get("decode_from_empty_tok_s"):
            deep += f"; from empty: {s['decode_from_empty_tok_s']['median']}"
        lines.append(f"| {eng} | {w} | {m['weight_mb']} | {t[2:]} | {p['median']} ({p['min']}–{p['max']}) | "
                     f"{d['median']} ({d['min']}–{d['max']}){deep} | {s['decode_weight_gb_s']} "
                     f"({s['decode_weight_pct_of_read_bw']}% / {s['decode_weight_pct_of_copy_bw']}%) |")
    return "\n".join(lines)


def main():
    global PROMPT
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-src", required=True, help="llama.cpp source tree or git directory")
    ap.add_argument("--lathe", default=os.path.join(REPO, "build", "lathe"), help="lathe binary to measure")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--bits", default="4,8")
    ap.add_argument("--like", default="qwen3-0.6b", choices=sorted(SHAPES), help="the synthetic model's shape")
    ap.add_argument("--work", help="checkpoints and tools (cached); default $LATHE_PEER_DIR/cpu-vs-llama-cpp, "
                    "or cpu-vs-llama-cpp-qwen3.5-0.8b for --like qwen3.5-0.8b")
    ap.add_argument("--llama-build", default=os.path.join(PEER_DIR, "llama.cpp"), help="llama.cpp build directory")
    ap.add_argument("--python", default="/usr/bin/python3", help="a Python with numpy and PyYAML (converter)")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--fresh", action="store_true", help="re-make the checkpoints")
    ap.add_argument("--label", default="", help="what the lathe binary is (branch, commit), recorded in the JSON")
    ap.add_argument("--prompt", type=int, default=PROMPT, help="prompt tokens (prefill length, decode depth)")
    ap.add_argument("--summarize", metavar="RAW", help="only recompute the summary of an earlier run's JSON")
    a = ap.parse_args()
    PROMPT = a.prompt
    if a.summarize:
        with open(a.summarize) as f:
            result = json.load(f)
        PROMPT = result["method"]["prompt_tokens"]
        result["summary"] = summarize_result(result)
        print(json.dumps(result, indent=1))
        print(markdown_table(result), file=sys.stderr)
        return
    lathe = os.path.abspath(a.lathe)
    threads = [int(t) for t in a.threads.split(",")]
    bits_list = [int(b) for b in a.bits.split(",")]
    shape = SHAPES[a.like]
    if not a.work:
        a.work = os.path.join(PEER_DIR, shape["work"])
    work = a.work
    os.makedirs(work, exist_ok=True)

    # 1. llama.cpp
    bindir = run([os.path.join(HERE, "llama_cpp_build.sh"), a.llama_src, a.llama_build],
                 env=dict(os.environ, LLAMA_EXTRA_TARGETS="llama-tokenize")).strip().splitlines()[-1]
    llama_src = a.llama_src
    if not os.path.exists(os.path.join(llama_src, "CMakeLists.txt")):
        llama_src = os.path.join(a.llama_build, "src")  # checked out from a git directory by the build script
    bench_bin, quant_bin = os.path.join(bindir, "llama-bench"), os.path.join(bindir, "llama-quantize")
    commit_file = os.path.join(a.llama_build, "src.commit")
    llama_commit = open(commit_file).read().strip() if os.path.exists(commit_file) else None

    # 2. the same weights for both engines
    bf16 = os.path.join(work, "bf16")
    if a.fresh:
        for d in os.listdir(work):
            p = os.path.join(work, d)
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    if not os.path.exists(os.path.join(bf16, "model.safetensors")):
        shutil.rmtree(bf16, ignore_errors=True)
        run([lathe, "synth", "--like", a.like, "--bits", "16", "--seed", "1", *shape["synth"], "--out", bf16])
    # A llama.cpp from before its Qwen3 support runs the Qwen3 shape as arch "llama" (qwen3_to_gguf.py --as-llama:
    # the same matrices and bytes, without the per-head q/k norms, so the peer does slightly less work).
    with open(os.path.join(llama_src, "gguf-py", "gguf", "constants.py")) as f:
        peer_has_qwen3 = re.search(r"^\s*QWEN3\s*=", f.read(), re.M) is not None
    as_llama = a.like == "qwen3-0.6b" and not peer_has_qwen3
    peer_arch = "llama (stand-in: this llama.cpp predates Qwen3; no q/k norms)" if as_llama else a.like
    f16_gguf = os.path.join(work, f"{a.like}-f16{'-as-llama' if as_llama else ''}.gguf")
    if not os.path.exists(f16_gguf):
        env = dict(os.environ, PYTHONPATH=os.path.join(llama_src, "gguf-py"))
        run([a.python, os.path.join(HERE, shape["converter"]), *(["--as-llama"] if as_llama else []), bf16,
             os.path.join(REPO, "tests", "fixtures", "tokenizers", "qwen3-real"), f16_gguf], env=env)
    models = {}
    for bits in bits_list:
        lq = os.path.join(work, f"lathe-q{bits}g64")
        if not os.path.exists(os.path.join(lq, "config.json")):
            shutil.rmtree(lq, ignore_errors=True)
            run([lathe, "quantize", "--model", bf16, "--out", lq, "--bits", str(bits), "--group-size", "64",
                 "--eval-tokens", "0"], stderr=subprocess.DEVNULL)
        gtype = {4: "Q4_0", 8: "Q8_0"}[bits]
        gq = os.path.join(work, f"{a.like}-{gtype.lower()}-pure{'-as-llama' if as_llama else ''}.gguf")
        if not os.path.exists(gq):
            run([quant_bin, "--pure", f16_gguf, gq + ".tmp", gtype], stderr=subprocess.DEVNULL)
            os.replace(gq + ".tmp", gq)
        lfiles = sorted(f for f in os.listdir(lq) if f.endswith(".safetensors"))
        models[bits] = {
            "lathe": {"dir": lq, "format": f"MLX affine {bits}-bit g64 (bf16 scales and biases), from the bf16 "
                      "synthetic checkpoint via lathe quantize",
                      "weight_bytes": sum(tensor_bytes_safetensors(os.path.join(lq, f)) for f in lfiles)},
            "llama.cpp": {"file": gq, "format": f"{gtype} --pure (every matrix {gtype}), from the same bf16 "
                          "weights via F16 GGUF", "weight_bytes": tensor_bytes_gguf(gq, a.python, llama_src)},
        }
        for e in models[bits].values():
            e["weight_mb"] = round(e["weight_bytes"] / 1e6, 1)

    # The converted vocabulary tokenizes as lathe's tokenizer does (a check of qwen3_to_gguf.py's tokenizer part).
    tokenizer_check = None
    tok_bin = os.path.join(bindir, "llama-tokenize")
    if os.path.exists(tok_bin):
        tok_dir = os.path.join(work, "qwen3-tokenizer")
        os.makedirs(tok_dir, exist_ok=True)
        fixture = os.path.join(REPO, "tests", "fixtures", "tokenizers", "qwen3-real")
        for name in os.listdir(fixture):
            src_path = os.path.join(fixture, name)
            if name.endswith(".gz"):
                with gzip.open(src_path, "rb") as fi, open(os.path.join(tok_dir, name[:-3]), "wb") as fo:
                    shutil.copyfileobj(fi, fo)
            else:
                shutil.copy(src_path, tok_dir)
        text = ("Hello world! The quick brown fox — 12345 tokens, naïve café, <think>x</think> 你好世界 "
                "<|im_start|>user\n  indented\tcode();")
        ours = json.loads(run([lathe, "tokenize", "--tokenizer", tok_dir, text]).strip().splitlines()[-1])
        theirs = json.loads(run([tok_bin, "-m", f16_gguf, "-p", text, "--ids", "--log-disable"],
                                stderr=subprocess.DEVNULL).strip().splitlines()[-1])
        tokenizer_check = {"text": text, "tokens": len(ours), "same_ids": ours == theirs}
        if ours != theirs:
            log(f"tokenizer check: lathe {ours} vs llama.cpp {theirs}")

    membw_bin = os.path.join(work, "membw")
    src = os.path.join(HERE, "membw.cc")
    if not os.path.exists(membw_bin) or os.path.getmtime(membw_bin) < os.path.getmtime(src):
        run(["c++", "-O3", "-march=native", "-pthread", src, "-o", membw_bin])

    ids = ",".join(str((i * 7919) % 150000) for i in range(PROMPT))  # as bench/cpu_e2e.sh
    for path in [os.path.join(models[b]["lathe"]["dir"], "model.safetensors") for b in bits_list] + \
            [models[b]["llama.cpp"]["file"] for b in bits_list]:
        if os.path.exists(path):
            with open(path, "rb") as f:  # page cache warm for both engines
                while f.read(1 << 24):
                    pass

    # 3-4. bandwidth, then alternated rounds, then bandwidth again
    result = {
        "what": f"lathe vs llama.cpp, CPU, synthetic {shape['title']} shape, same bf16 source weights, same bytes",
        "date_utc": datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {"cpu": cpu_model(), "nproc": os.cpu_count(), "native_isa": native_isa(),
                    "loadavg_before": loadavg()},
        "lathe": {"binary": lathe, "label": a.label, "binary_mtime_utc": datetime.datetime.utcfromtimestamp(
            os.path.getmtime(lathe)).strftime("%Y-%m-%dT%H:%M:%SZ"), "isa_in_binary": isa_of_binary(lathe)},
        "llama.cpp": {"source": a.llama_src, "commit": llama_commit, "build": "Release, CPU, -DGGML_NATIVE=ON "
                      "(-march=native), OpenMP, static", "isa_in_binary": isa_of_binary(bench_bin), "arch": peer_arch,
                      "tokenizer_check": tokenizer_check},
        "method": {"prompt_tokens": PROMPT, "decode_steps": GEN, "rounds": a.rounds, "threads": threads,
                   "lathe_cmd": f"lathe --threads T run --model DIR --ids <{PROMPT} ids> --max-tokens {GEN + 1} "
                                "--ignore-eos --json; again with --ids 9 (decode from an empty context, as "
                                "llama-bench's tg)",
                   "llama_cmd": f"llama-bench -m GGUF -p {PROMPT} -n {GEN} -t T -r 1 -o json, then "
                                f"llama-bench -m GGUF -p 0 -n {GEN} -d {PROMPT} -t T -r 1 -o json (decode after "
                                f"{PROMPT} tokens, where lathe's steps run); each after llama-bench's warm-up run",
                   "weight_bytes_read_per_s": "weight tensor bytes (every tensor in the file; the tied "
                   "embedding matrix once, as the logits read it whole) x decode tok/s"},
        "models": models,
        "bandwidth": {"before": {t: membw(membw_bin, t) for t in threads}},
        "runs": [],
    }
    partial = (a.out or os.path.join(work, "last")) + ".partial"
    busy0, ours0, wall0 = *busy_cpu_seconds(), time.time()
    for r in range(a.rounds):
        for bits in bits_list:
            for t in threads:
                order = ["lathe", "llama.cpp"] if r % 2 == 0 else ["llama.cpp", "lathe"]
                for eng in order:
                    if eng == "lathe":
                        m = lathe_run(lathe, models[bits]["lathe"]["dir"], t, ids)
                        m["decode_from_empty_tok_s"] = lathe_run_from_empty(lathe, models[bits]["lathe"]["dir"], t)
                    else:
                        m = llama_bench(bench_bin, models[bits]["llama.cpp"]["file"], t, PROMPT)
                        info = m.pop("info", None)
                        if info:
                            result["llama.cpp"]["bench_info"] = info
                    m.update({"round": r, "engine": eng, "bits": bits, "threads": t, "loadavg": loadavg()})
                    log(f"round {r} {eng:9s} {bits}-bit T={t}: prefill {m.get('prefill_tok_s', 0):.1f} "
                        f"decode {m.get('decode_tok_s', 0):.2f} tok/s")
                    result["runs"].append(m)
                    with open(partial, "w") as f:  # what has run so far, should a later run fail
                        json.dump(result, f, indent=1)
    result["bandwidth"]["after"] = {t: membw(membw_bin, t) for t in threads}
    result["machine"]["loadavg_after"] = loadavg()
    busy1, ours1 = busy_cpu_seconds()
    # Everything busy on the machine minus this run's own processes: near 0 on a quiet machine.
    result["machine"]["quiet"] = {"wall_s": round(time.time() - wall0, 1),
                                  "cpu_s_all_processes": round(busy1 - busy0, 1),
                                  "cpu_s_this_benchmark": round(ours1 - ours0, 1),
                                  "cpu_s_others": round((busy1 - busy0) - (ours1 - ours0), 1)}

    result["summary"] = summarize_result(result)
    text = portable_paths(json.dumps(result, indent=1), a)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    if os.path.exists(partial):
        os.remove(partial)
    print(markdown_table(result), file=sys.stderr)
    print(text)


if __name__ == "__main__":
    main()
