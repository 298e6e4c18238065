#!/usr/bin/env python3
"""Throughput on one GPU: trainstep (coordinator + 1 worker on cuda:0, deploy/local/launch.sh)
against PyTorch DDP (1 process, NCCL, ddp_bench.py) on the same tiny_gpt, windows and
micro-batches, bf16 autocast, AdamW, run one after the other in one invocation.

  tests/bench/worker/gpu_bench.py --bin BUILD/bin --out DIR [--device cuda|cpu]
      [--model L,H,D,T] [--micro-batch-size B] [--accumulation-steps K] [--windows N]
      [--skip S] [--peak-tflops P] [--python PY]

Default model: GPT-2 small's shape (12 layers, 12 heads, d_model 768, seq_len 1024; byte
vocabulary 256). Steady state: tokens of windows S+1..N over end_time_ms[N] - end_time_ms[S]
(the coordinator's decision times for trainstep; rank 0's time after each update for DDP).
MFU = tokens/s × FLOPs per token / peak, with FLOPs per token = 6·N + 12·L·D·T (PaLM's
count: N the parameters of the matmuls, the attention scores and values added); the peak
is --peak-tflops or, for a known GPU, its dense bf16 peak. --device cpu rehearses the
script on a machine without a GPU (pass a small --model). Prints lines starting
"trainstep", "ddp", "ratio", "model", "peak"; writes DIR/gpu_bench.json.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, HERE)
from worker_bench import read_jsonl, steady_rate  # noqa: E402

# Dense bf16 tensor-core peaks (TFLOP/s) of GPUs this may meet, by a substring of the name.
PEAKS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.1, "A10": 125.0}


def corpus(path, min_bytes):
    """The repository's own text (docs and sources), repeated up to min_bytes: on every machine."""
    parts = []
    for d, _dirs, names in sorted(os.walk(ROOT)):
        if any(x in d for x in ("/.git", "/build", "gpu-check-out", "/.gpu-debs")):
            continue
        for n in sorted(names):
            if n.endswith((".md", ".cc", ".h", ".proto", ".py")):
                with open(os.path.join(d, n), "rb") as f:
                    parts.append(f.read())
    text = b"".join(parts)
    with open(path, "wb") as f:
        f.write(text * (min_bytes // len(text) + 1))


def flops_per_token(n_layer, d_model, seq_len, vocab=256):
    matmul_params = n_layer * (12 * d_model * d_model + 13 * d_model) + d_model * vocab + vocab
    return 6 * matmul_params + 12 * n_layer * d_model * seq_len, matmul_params


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--model", default="12,12,768,1024")
    p.add_argument("--micro-batch-size", type=int, default=16)
    p.add_argument("--accumulation-steps", type=int, default=2)
    p.add_argument("--windows", type=int, default=30)
    p.add_argument("--skip", type=int, default=5)
    p.add_argument("--peak-tflops", type=float)
    p.add_argument("--python", default=sys.executable)
    args = p.parse_args()
    n_layer, n_head, d_model, seq_len = (int(x) for x in args.model.split(","))
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    data = os.path.join(args.out, "corpus.txt")
    tokens_needed = args.windows * args.micro_batch_size * args.accumulation_steps * seq_len
    corpus(data, tokens_needed + seq_len)
    spec = {
        "name": "gpu-bench", "seed": 1,
        "model": {"tiny_gpt": {"n_layer": n_layer, "n_head": n_head, "d_model": d_model,
                               "seq_len": seq_len}},
        "data": {"text": {"paths": [data], "seq_len": seq_len}, "shuffle": False},
        "batch": {"micro_batch_size": args.micro_batch_size,
                  "accumulation_steps": args.accumulation_steps, "tail": "dynamic"},
        "precision": "bf16",
        "loss": {"normalization": "tokens"},
        "optimizer": {"adamw": {"lr": 3e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
                                "weight_decay": 0.1}},
        "stop": {"max_updates": args.windows},
        "workers": {"count": 1},
    }
    spec_path = os.path.join(args.out, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    device_flag = "--device=cuda:0" if args.device == "cuda" else "--device=cpu"

    run_dir = os.path.join(args.out, "trainstep")
    r = subprocess.run([os.path.join(ROOT, "deploy/local/launch.sh"), "--spec", spec_path,
                        "--out", run_dir, "--bin", args.bin, "--worker-flag", device_flag],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"gpu_bench: trainstep run failed ({r.returncode}):\n{r.stderr[-3000:]}")
    updates = read_jsonl(os.path.join(run_dir, "updates.jsonl"))
    ts_rate, _ = steady_rate({u["window_id"]: (u["end_time_ms"], u["global_valid_tokens"])
                              for u in updates if u["outcome"] == "commit"}, args.skip)

    ddp_out = os.path.join(args.out, "ddp.jsonl")
    r = subprocess.run([args.python, os.path.join(HERE, "ddp_bench.py"), "--spec", spec_path,
                        "--windows", str(args.windows), "--out", ddp_out, "--device", args.device],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"gpu_bench: DDP run failed ({r.returncode}):\n{r.stderr[-3000:]}")
    ddp_rate, _ = steady_rate({u["window"]: (u["end_time_ms"], u["tokens"])
                               for u in read_jsonl(ddp_out)}, args.skip)

    fpt, params = flops_per_token(n_layer, d_model, seq_len)
    peak = args.peak_tflops
    name = "cpu"
    if args.device == "cuda":
        name = subprocess.run([args.python, "-c", "import torch; print(torch.cuda.get_device_name(0))"],
                              capture_output=True, text=True).stdout.strip()
        if peak is None:
            peak = next((v for k, v in PEAKS.items() if k in name), None)
    mfu = (lambda rate: rate * fpt / (peak * 1e12)) if peak else (lambda rate: None)
    result = {"device": name, "model": args.model, "matmul_params": params,
              "flops_per_token": fpt, "peak_tflops": peak,
              "trainstep_tokens_per_s": ts_rate, "ddp_tokens_per_s": ddp_rate,
              "trainstep_mfu": mfu(ts_rate), "ddp_mfu": mfu(ddp_rate),
              "ratio": ts_rate / ddp_rate, "windows": args.windows, "skip": args.skip,
              "micro_batch_size": args.micro_batch_size,
              "accumulation_steps": args.accumulation_steps}
    with open(os.path.join(args.out, "gpu_bench.json"), "w") as f:
        json.dump(result, f, indent=1)
    pct = lambda m: "n/a (no peak known: --peak-tflops)" if m is None else f"{100 * m:.1f} %"
    print(f"model tiny_gpt {args.model} (L,H,D,T), {params / 1e6:.1f} M matmul parameters, "
          f"{fpt / 1e9:.2f} GFLOP/token, bf16, {args.micro_batch_size}x{args.accumulation_steps}"
          f" sequences per window, device {name}")
    print(f"peak {peak} TFLOP/s" if peak else "peak unknown")
    print(f"trainstep {ts_rate:,.0f} tokens/s, MFU {pct(result['trainstep_mfu'])}")
    print(f"ddp       {ddp_rate:,.0f} tokens/s, MFU {pct(result['ddp_mfu'])}")
    print(f"ratio trainstep/ddp {result['ratio']:.3f}")


if __name__ == "__main__":
    main()
