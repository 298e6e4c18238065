#!/usr/bin/python3
"""Llama benchmark: a SmolLM-135M-sized model (30 layers, hidden 576, 9 heads, 3 KV heads,
intermediate 1536, vocab 49,152, tied head; random bf16 weights in Hugging Face layout, made by
tests/conformance/llama_reference.py) fine-tuned on this machine's CPU, side by side in one run:

  trainstep W = 1                      tokens/s, peak RSS of the worker
  trainstep W = 1, activation ckpt     tokens/s, peak RSS of the worker
  plain loop (plain_loop_bench)        tokens/s, peak RSS, the weights' load time

  tests/bench/worker/llama_bench.py [--build-dir build] [--reps 2] [--windows 6] [--skip 2]
                                    [--threads 2] [--seq-len 128] [--micro-batch-size 2]
                                    [--accumulation-steps 2] [--model-dir DIR]

fp32 master weights and AdamW, the same spec, windows and micro-batches for every system
(JSONL of random token ids). Steady state: the tokens of windows skip+1..N over the time
between their ends, as tests/bench/worker/worker_bench.py measures. Peak RSS is the process's
VmHWM, polled while it runs. Each repetition runs the three systems in a rotated order; the
medians are printed, with every run's numbers in --out-dir/results.json.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from worker_bench import read_jsonl, steady_rate  # noqa: E402

SMOLLM_135M = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
    "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
    "tie_word_embeddings": True,
}


class PeakRss:
    """Polls VmHWM (KiB) of every process whose argv[0] ends with one of `names`."""

    def __init__(self, names):
        self.names = tuple(n.encode() for n in names)
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        argv0 = f.read().split(b"\0")[0]
                    if not argv0.endswith(self.names):
                        continue
                    with open(f"/proc/{pid}/status") as f:
                        for line in f:
                            if line.startswith("VmHWM:"):
                                self.peak_kib = max(self.peak_kib, int(line.split()[1]))
                except (OSError, ValueError, IndexError):
                    pass
            self._stop.wait(0.2)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def make_inputs(args):
    model = args.model_dir or os.path.join(args.out_dir, "smollm-135m")
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tests/conformance/llama_reference.py"),
                        "make", model, "--seed", "1", "--dtype", "bfloat16",
                        "--config", json.dumps(SMOLLM_135M)], check=True)
    rng = random.Random(7)
    data = os.path.join(args.out_dir, "train.jsonl")
    samples = args.micro_batch_size * args.accumulation_steps * (args.windows + 1)
    with open(data, "w") as f:
        for _ in range(samples):
            ids = [rng.randrange(SMOLLM_135M["vocab_size"]) for _ in range(args.seq_len)]
            f.write(json.dumps({"input_ids": ids, "labels": ids}) + "\n")
    return model, data


def spec_for(args, model, data, checkpointing):
    spec = {
        "name": "llama-bench",
        "model": {"llama": {"path": model}, "activation_checkpointing": checkpointing},
        "data": {"jsonl": {"path": data}},
        "batch": {"micro_batch_size": args.micro_batch_size,
                  "accumulation_steps": args.accumulation_steps},
        "optimizer": {"adamw": {"lr": 1e-4}},
        "stop": {"max_updates": args.windows},
        "workers": {"count": 1},
    }
    path = os.path.join(args.out_dir, f"spec-{'ckpt' if checkpointing else 'plain'}.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    return path


def run_trainstep(args, spec, name):
    out = os.path.join(args.out_dir, name)
    subprocess.run(["rm", "-rf", out], check=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    with PeakRss(["trainstep-worker"]) as rss:
        r = subprocess.run([os.path.join(ROOT, "deploy/local/launch.sh"), "--spec", spec,
                            "--out", out, "--bin", os.path.join(args.build_dir, "bin"),
                            "--worker-flag", f"--threads={args.threads}"],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"trainstep failed ({r.returncode}):\n{r.stderr[-2000:]}")
    updates = read_jsonl(os.path.join(out, "updates.jsonl"))
    records = {u["window_id"]: (u["end_time_ms"], u["global_valid_tokens"])
               for u in updates if u["outcome"] == "commit"}
    rate, _ = steady_rate(records, args.skip)
    return {"tokens_per_s": rate, "peak_rss_gib": rss.peak_kib / 2**20}


def run_plain(args, spec, name):
    out = os.path.join(args.out_dir, f"{name}.jsonl")
    with PeakRss(["plain_loop_bench"]) as rss:
        r = subprocess.run([os.path.join(args.build_dir, "bench", "plain_loop_bench"),
                            "--spec", spec, "--threads", str(args.threads), "--out", out],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"plain_loop_bench failed ({r.returncode}):\n{r.stderr[-2000:]}")
    rows = read_jsonl(out)
    rate, _ = steady_rate({x["window"]: (x["end_time_ms"], x["tokens"]) for x in rows}, args.skip)
    load = float(r.stderr.split("model built in ")[1].split(" s")[0])
    return {"tokens_per_s": rate, "peak_rss_gib": rss.peak_kib / 2**20, "load_seconds": load}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    p.add_argument("--out-dir", default=f"/tmp/trainstep-llama-bench-{os.getpid()}")
    p.add_argument("--model-dir", default="", help="reuse a model directory (made if missing)")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--windows", type=int, default=6)
    p.add_argument("--skip", type=int, default=2, help="start-up windows left out")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--micro-batch-size", type=int, default=2)
    p.add_argument("--accumulation-steps", type=int, default=2)
    args = p.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    model, data = make_inputs(args)
    plain_spec = spec_for(args, model, data, False)
    ckpt_spec = spec_for(args, model, data, True)
    systems = [
        ("trainstep", lambda: run_trainstep(args, plain_spec, "trainstep")),
        ("trainstep+ckpt", lambda: run_trainstep(args, ckpt_spec, "trainstep-ckpt")),
        ("plain", lambda: run_plain(args, plain_spec, "plain")),
    ]
    results = {name: [] for name, _ in systems}
    for rep in range(args.reps):
        for name, run in systems[rep % 3:] + systems[:rep % 3]:
            t = time.time()
            results[name].append(run())
            print(f"rep {rep + 1} {name}: {results[name][-1]} ({time.time() - t:.0f} s)",
                  flush=True)
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    med = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
           for name, runs in results.items()}
    print(f"model: SmolLM-135M-sized, bf16 in, fp32 AdamW; {args.micro_batch_size} x "
          f"{args.seq_len} tokens per micro-batch, K = {args.accumulation_steps}, "
          f"{args.threads} threads; medians of {args.reps}")
    for name, m in med.items():
        print(f"{name:16s} {m['tokens_per_s']:8.1f} tokens/s  peak RSS {m['peak_rss_gib']:.2f} GiB"
              + (f"  load {m['load_seconds']:.2f} s" if "load_seconds" in m else ""))
    print(f"ratio trainstep / plain: {med['trainstep']['tokens_per_s'] / med['plain']['tokens_per_s']:.2f}")
    print(f"ratio trainstep+ckpt / trainstep: "
          f"{med['trainstep+ckpt']['tokens_per_s'] / med['trainstep']['tokens_per_s']:.2f} tokens/s, "
          f"{med['trainstep+ckpt']['peak_rss_gib'] / med['trainstep']['peak_rss_gib']:.2f} peak RSS")


if __name__ == "__main__":
    main()
