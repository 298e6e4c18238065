#!/usr/bin/python3
"""Which BLAS serves the trainstep worker best, and how many threads per worker.

  tests/bench/worker/blas_bench.py [--build-dir build] [--reps 3] [--windows 16]

Runs the demo's tiny_gpt (deploy/local/demo-spec.json: n_layer 3, d_model 128, seq_len 64,
micro_batch_size 8, K = 4) with deploy/local/launch.sh, the real workers and coordinator,
on each BLAS Debian offers as libblas.so.3, chosen per run with LD_LIBRARY_PATH:

  reference         /usr/lib/<arch>/blas + lapack (netlib; Debian's default)
  openblas-pthread  libopenblas0-pthread (OpenBLAS with its own thread pool)
  openblas-openmp   libopenblas0-openmp (OpenBLAS on LibTorch's OpenMP pool)

in three thread layouts on this host's C cores:

  split      W = 2 workers, each C/2 threads (the default: LOCAL_WORLD_SIZE from launch.sh)
  one        W = 1 worker with C threads
  oversub    W = 2 workers with C threads each (what every worker taking every core gives)

fp32 and bf16 rows (bf16 GEMMs are oneDNN's, not the BLAS's: that row shows the thread
pools' interplay). Steady state as in worker_bench.py (tokens of windows skip+1..N), each
repetition in a rotated order, disturbed measurements retried. The reference BLAS is slow
in fp32 (~50x): it runs the split layout only, with --reference-windows windows.
See BENCHMARKS.md, "BLAS".
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import worker_bench as wb  # noqa: E402

ARCH_LIB = "/usr/lib/x86_64-linux-gnu"
BLAS = {
    "reference": f"{ARCH_LIB}/blas:{ARCH_LIB}/lapack",
    "openblas-pthread": f"{ARCH_LIB}/openblas-pthread",
    "openblas-openmp": f"{ARCH_LIB}/openblas-openmp",
}


def run(args, precision, blas, layout, windows, out_dir):
    cores = len(os.sched_getaffinity(0))
    workers, threads = {"split": (2, 0), "one": (1, 0), "oversub": (2, cores)}[layout]
    with open(os.path.join(wb.ROOT, "deploy/local/demo-spec.json")) as f:
        spec = json.load(f)
    spec["precision"] = precision
    spec["stop"] = {"max_updates": windows}
    spec["workers"] = {"count": workers}
    spec["data"]["shuffle"] = False
    spec.pop("checkpoint", None)
    spec.pop("schedule", None)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    spec_path = os.path.join(out_dir, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    env = dict(os.environ, LD_LIBRARY_PATH=BLAS[blas])
    env.pop("OMP_NUM_THREADS", None)
    env.pop("LOCAL_WORLD_SIZE", None)
    cmd = [os.path.join(wb.ROOT, "deploy/local/launch.sh"), "--spec", spec_path,
           "--out", os.path.join(out_dir, "run"), "--bin", os.path.join(args.build_dir, "bin")]
    if threads:
        cmd += ["--worker-flag", f"--threads={threads}"]
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{blas} {layout} {precision} failed:\n{r.stderr[-2000:]}")
    updates = wb.read_jsonl(os.path.join(out_dir, "run", "updates.jsonl"))
    rate, per_window = wb.steady_rate(
        {u["window_id"]: (u["end_time_ms"], u["global_valid_tokens"]) for u in updates
         if u["outcome"] == "commit"}, args.skip)
    with open(os.path.join(out_dir, "run", "logs", "worker-0.log")) as f:
        log = f.read()
    line = next((l for l in log.splitlines() if "blas: " in l), "")
    return {"tokens_per_s": rate, "seconds_per_window": per_window, "blas": wb.blas_of(log),
            "threads": line.rsplit("threads: ", 1)[-1] if line else "?"}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default=os.path.join(wb.ROOT, "build"))
    p.add_argument("--out-dir", default=f"/tmp/trainstep-blas-bench-{os.getpid()}")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--windows", type=int, default=16)
    p.add_argument("--reference-windows", type=int, default=7)
    p.add_argument("--skip", type=int, default=5, help="start-up windows left out")
    p.add_argument("--max-foreign-cores", type=float, default=0.15)
    p.add_argument("--retries", type=int, default=2)
    p.add_argument("--quiet-wait", type=float, default=60)
    args = p.parse_args()
    args.build_dir = os.path.abspath(args.build_dir)
    wb.become_subreaper()
    blases = [b for b, d in BLAS.items() if os.path.exists(d.split(":")[0] + "/libblas.so.3")]
    model, flags = wb.cpu_flags()
    print(f"blas bench: nproc {os.cpu_count()}, CPU {model} ({' '.join(flags)}), load "
          f"{wb.loadavg():.2f}; demo tiny_gpt; BLAS {', '.join(blases)}; out {args.out_dir}",
          flush=True)
    cases = [(b, layout) for b in blases for layout in ("split", "one", "oversub")
             if b != "reference" or layout == "split"]
    results = {}
    started = time.time()
    for rep in range(args.reps):
        for precision in args.precisions.split(","):
            order = cases[rep % len(cases):] + cases[:rep % len(cases)]
            for blas, layout in order:
                windows = args.reference_windows if blas == "reference" else args.windows
                skip = args.skip
                if blas == "reference":
                    args.skip = min(args.skip, windows - 3)
                out = os.path.join(args.out_dir, f"{precision}-{blas}-{layout}-{rep}")
                r = wb.measured(lambda: run(args, precision, blas, layout, windows, out), args,
                                f"{precision} {blas} {layout}")
                args.skip = skip
                results.setdefault((precision, blas, layout), []).append(r)
                mark = "*" if r["foreign_cores"] > args.max_foreign_cores else ""
                print(f"  {precision} rep {rep} {blas:16} {layout:8} {r['tokens_per_s']:7.0f} tok/s"
                      f"{mark} ({r['seconds_per_window'] * 1e3:.0f} ms/window; threads "
                      f"{r['threads']}; {r['blas']}) [others {r['foreign_cores']:.2f} cores]",
                      flush=True)
    print()
    print("tokens/s (all workers), median over repetitions; ratio to openblas-pthread split, "
          "median [min-max] of each repetition's ratio")
    print("| precision | BLAS | layout | tok/s | ÷ openblas-pthread split |")
    print("|---|---|---|---|---|")
    summary = []
    for (precision, blas, layout), rows in results.items():
        base = results.get((precision, "openblas-pthread", "split"))
        ratios = [r["tokens_per_s"] / b["tokens_per_s"] for r, b in zip(rows, base or [])]
        med = statistics.median(r["tokens_per_s"] for r in rows)
        ratio = (f"{statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]"
                 if ratios else "-")
        print(f"| {precision} | {blas} | {layout} | {med:.0f} | {ratio} |")
        summary.append({"precision": precision, "blas": blas, "layout": layout,
                        "tokens_per_s": [r["tokens_per_s"] for r in rows], "ratios": ratios})
    print(f"\nblas bench took {time.time() - started:.0f} s")
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
