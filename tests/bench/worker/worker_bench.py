#!/usr/bin/python3
"""Worker benchmark: trainstep with W = 2 worker processes against (a) a plain
single-process LibTorch loop and (b) PyTorch DDP (Gloo, no_sync), on the same tiny_gpt,
windows and micro-batch shapes, in one run, interleaved per precision row.

  tests/bench/worker/worker_bench.py [--build-dir build] [--reps 3] [--windows 16] [--skip 5]
                                     [--blas-dir DIR]
                                     [--contention] [--plain-default-malloc]
                                     [--compare-overlap]

Expects `make build` (trainstep-coordinator, trainstep-worker, trainstep, and
bench/plain_loop_bench). Every system gets one compute thread per process and the same BLAS
(OMP_NUM_THREADS=1 for the trainstep workers, which their --threads default follows; --threads
1 in (a), the worker's own thread setup; torch.set_num_threads(1) and OPENBLAS_NUM_THREADS=1
in (b); --blas-dir puts one BLAS first on every system's LD_LIBRARY_PATH, and each row says
which library each system loaded) and the same glibc malloc settings (the worker's
ConfigureMallocForTraining in worker/host/malloc_config.h: by mallopt in the worker and in (a),
by MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ in (b)). Steady state: tokens of windows
skip+1..N over end_time_ms[N] - end_time_ms[skip], the same range for every system.
Each repetition runs the systems one after another in a rotated order; a measurement during
which other processes took CPU is run again (--max-foreign-cores, --retries). Ratios, per
repetition, then the median:
  per-worker = (trainstep total tokens/s / W) / (a)     aim ≥ 0.95
  vs DDP     =  trainstep total tokens/s / (b)          aim ≥ 1.2
Diagnostics (not part of the ratios): the trainstep workers' phase times (their /metrics),
their CPU use; with --contention, (a)x2 — two copies of (a) at once — which shows what
sharing the machine's cores costs any two processes, protocol or not; with
--plain-default-malloc, (a) with glibc's default malloc settings; with --compare-overlap,
trainstep again with --overlap-allreduce=false (the all-reduce after backward instead of
overlapped with the last backward). See BENCHMARKS.md.
"""
import argparse
import ctypes
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
TORCH_PYTHON = "/usr/bin/python3"
# worker/host/malloc_config.h's mallopt settings, as glibc's environment variables.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def model_of(args, precision):
    """(n_layer, n_head, d_model, seq_len) of the row's tiny_gpt."""
    return tuple(int(x) for x in getattr(args, f"{precision}_model").split(","))


def spec_for(args, precision):
    # Every field written out: ddp_bench.py reads the same file without trainstep's defaults.
    n_layer, n_head, d_model, seq_len = model_of(args, precision)
    return {
        "name": f"bench-{precision}",
        "seed": 1,
        "model": {"tiny_gpt": {"n_layer": n_layer, "n_head": n_head,
                               "d_model": d_model, "seq_len": seq_len}},
        "data": {"text": {"paths": [args.data], "seq_len": seq_len}, "shuffle": False},
        "batch": {"micro_batch_size": args.micro_batch_size,
                  "accumulation_steps": args.accumulation_steps, "tail": "dynamic"},
        "precision": precision,
        "loss": {"normalization": "tokens"},
        "optimizer": {"adamw": {"lr": 0.001, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
                                "weight_decay": 0.01}},
        "stop": {"max_updates": args.windows},
        "workers": {"count": args.workers},
    }


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def machine_busy_seconds():
    """CPU seconds every process on the machine has used (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")


def become_subreaper():
    """Orphaned descendants (launch.sh's workers once their supervisor is gone) are then
    reparented to this script, which reaps them, so that their CPU time counts as its own."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def reap_orphans(max_wait=5.0):
    deadline = time.time() + max_wait
    while time.time() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # no descendant left
        if pid == 0:
            time.sleep(0.05)


def own_seconds():
    """CPU seconds of this script and every descendant it has reaped."""
    c, m = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
    return c.ru_utime + c.ru_stime + m.ru_utime + m.ru_stime


def wait_for_quiet(limit_cores, max_wait):
    """Waits (≤ max_wait s) until other processes use < limit_cores; returns what they used."""
    deadline = time.time() + max_wait
    while True:
        b0 = machine_busy_seconds()
        time.sleep(2.0)
        foreign = (machine_busy_seconds() - b0) / 2.0
        if foreign < limit_cores or time.time() >= deadline:
            return foreign


def measured(run, args, what):
    """run() with the CPU that other processes took meanwhile (cores on average); retried
    (after waiting for quiet) while that exceeds --max-foreign-cores, at most --retries times."""
    for attempt in range(args.retries + 1):
        wait_for_quiet(args.max_foreign_cores, args.quiet_wait)
        b0, o0, t0 = machine_busy_seconds(), own_seconds(), time.time()
        result = run()
        reap_orphans()
        wall = time.time() - t0
        foreign = max(0.0, (machine_busy_seconds() - b0) - (own_seconds() - o0)) / wall
        result["foreign_cores"] = foreign
        result["attempts"] = attempt + 1
        if foreign <= args.max_foreign_cores:
            return result
        print(f"    {what}: other processes used {foreign:.2f} cores meanwhile; "
              + ("measuring again" if attempt < args.retries else "keeping it, marked *"),
              flush=True)
    return result


def steady_rate(records, skip):
    """tokens/s over windows skip+1..N from {window: (end_time_ms, tokens)}."""
    ids = sorted(records)
    last = ids[-1]
    if skip not in records or last <= skip:
        raise RuntimeError(f"need windows {skip}..N, got {ids[:3]}..{ids[-3:]}")
    tokens = sum(records[w][1] for w in ids if w > skip)
    seconds = (records[last][0] - records[skip][0]) / 1000.0
    return tokens / seconds, seconds / (last - skip)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class ProcWatch:
    """Polls the trainstep workers of one launch (found, as launch.sh finds them, by their
    --port-file under OUT) for CPU time and thread count, and their /metrics."""

    def __init__(self, out_dir, skip, micro_steps_per_window):
        self.out_dir = out_dir
        self.skip = skip
        self.micro_steps_per_window = micro_steps_per_window
        self.cpu = {}       # pid -> (utime+stime seconds, threads)
        self.metrics = {}   # url -> last /metrics text
        self.at_skip = {}   # url -> the first /metrics text with ≥ skip windows done
        self.first_seen = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _workers(self):
        pids = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().split(b"\0")
            except OSError:
                continue
            if b"--port-file" in cmd and any(
                    a.startswith(f"{self.out_dir}/worker-".encode()) for a in cmd) and \
                    cmd[0].endswith(b"trainstep-worker"):
                pids.append(int(pid))
        return pids

    def _run(self):
        tick = os.sysconf("SC_CLK_TCK")
        while not self._stop.is_set():
            for pid in self._workers():
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    cpu = (int(fields[11]) + int(fields[12])) / tick
                    self.cpu[pid] = (cpu, int(fields[17]))
                    self.first_seen.setdefault(pid, time.time())
                except (OSError, IndexError, ValueError):
                    pass
            endpoints = os.path.join(self.out_dir, "endpoints.json")
            if os.path.exists(endpoints):
                try:
                    with open(endpoints) as f:
                        urls = json.load(f)["worker_metrics"]
                    for url in urls:
                        with urllib.request.urlopen(url, timeout=1) as r:
                            text = r.read().decode()
                        self.metrics[url] = text
                        if url not in self.at_skip and \
                                micro_steps(text) >= self.skip * self.micro_steps_per_window:
                            self.at_skip[url] = text
                except (OSError, ValueError, KeyError):
                    pass
            self._stop.wait(0.5)

    def start(self):
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join()


def micro_steps(text):
    m = re.search(r'^trainstep_worker_micro_steps_total\{[^}]*\} ([0-9.e+-]+)', text, re.M)
    return float(m.group(1)) if m else 0.0


def phase_sums(text):
    """{phase: (sum_seconds, count)} from a worker's trainstep_worker_compute_seconds."""
    out = {}
    for m in re.finditer(
            r'trainstep_worker_compute_seconds_(sum|count)\{[^}]*phase="(\w+)"[^}]*\} ([0-9.e+-]+)',
            text):
        kind, phase, value = m.group(1), m.group(2), float(m.group(3))
        s, c = out.get(phase, (0.0, 0))
        out[phase] = (value, c) if kind == "sum" else (s, int(value))
    return out


def run_trainstep(args, spec_path, out_dir, env, worker_flags=()):
    # A fresh directory: launch.sh would read a previous run's coordinator.ports.
    shutil.rmtree(out_dir, ignore_errors=True)
    watch = ProcWatch(out_dir, args.skip, args.accumulation_steps)
    watch.start()
    start = time.time()
    flags = [a for f in worker_flags for a in ("--worker-flag", f)]
    r = subprocess.run([os.path.join(ROOT, "deploy/local/launch.sh"), "--spec", spec_path,
                        "--out", out_dir, "--bin", os.path.join(args.build_dir, "bin")] + flags,
                       env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.time() - start
    watch.stop()
    if r.returncode != 0:
        raise RuntimeError(f"trainstep run failed ({r.returncode}):\n{r.stderr[-2000:]}")
    updates = read_jsonl(os.path.join(out_dir, "updates.jsonl"))
    records = {u["window_id"]: (u["end_time_ms"], u["global_valid_tokens"])
               for u in updates if u["outcome"] == "commit"}
    rate, per_window = steady_rate(records, args.skip)
    steady = [u for u in updates if u["window_id"] > args.skip]
    result = {
        "tokens_per_s": rate,
        "per_worker_tokens_per_s": rate / args.workers,
        "seconds_per_window": per_window,
        "wall_seconds": wall,
        "allreduce_calls": sorted({u["allreduce_calls"] for u in updates}),
        # Coordinator's view: first BeginWindow report to decision, i.e. the window minus
        # the optimizer step and the next window's planning.
        "coordinator_window_seconds": statistics.mean(u["window_seconds"] for u in steady),
        "worker_cpu": [{"cpu_seconds": c, "threads": t} for c, t in watch.cpu.values()],
    }
    # Phase means per window over the windows between the two scrapes (the first with ≥ skip
    # windows done, the last before the worker exited), averaged over the workers.
    phases = {}
    for url, text in watch.metrics.items():
        before = phase_sums(watch.at_skip.get(url, ""))
        for phase, (s, c) in phase_sums(text).items():
            s0, c0 = before.get(phase, (0.0, 0))
            if c > c0:
                phases.setdefault(phase, []).append((s - s0) / (c - c0))
    result["phase_seconds_per_window"] = {p: statistics.mean(v) for p, v in phases.items()}
    result["blas"] = blas_of(open(os.path.join(out_dir, "logs", "worker-0.log")).read())
    for i, text in enumerate(watch.metrics.values()):
        with open(os.path.join(out_dir, f"worker-{i}.metrics.txt"), "w") as f:
            f.write(text)
    return result


def blas_of(text):
    """The BLAS library a worker or plain_loop_bench reported ("blas: KIND … (PATH); …") or
    ddp_bench ("blas: PATH")."""
    m = re.search(r"blas: [^;\n]*\((/[^)]*)\);", text) or re.search(r"blas: (/\S+)", text)
    return m.group(1) if m else "unknown"


def run_plain(args, spec_path, out_path, copies=1, malloc="worker"):
    binary = os.path.join(args.build_dir, "bench", "plain_loop_bench")
    procs = []
    for i in range(copies):
        path = out_path if copies == 1 else f"{out_path}.{i}"
        procs.append((path, subprocess.Popen(
            [binary, "--spec", spec_path, "--windows", str(args.windows), "--threads", "1",
             "--malloc", malloc, "--out", path], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, env=blas_env(args))))
    rates, note = [], ""
    for path, p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"plain_loop_bench failed ({p.returncode}):\n{err[-2000:]}")
        note = err.strip()
        rows = read_jsonl(path)
        rates.append(steady_rate({r["window"]: (r["end_time_ms"], r["tokens"]) for r in rows},
                                 args.skip))
        steady = [r for r in rows if r["window"] > args.skip]
    return {
        "tokens_per_s": statistics.mean(r for r, _ in rates),
        "seconds_per_window": statistics.mean(s for _, s in rates),
        "compute_seconds_per_window": statistics.mean(r["compute_seconds"] for r in steady),
        "optimizer_seconds_per_window": statistics.mean(r["optimizer_seconds"] for r in steady),
        "note": note,
        "blas": blas_of(note),
    }


def run_ddp(args, spec_path, out_path):
    r = subprocess.run([TORCH_PYTHON, os.path.join(ROOT, "tests/bench/worker/ddp_bench.py"),
                        "--spec", spec_path, "--windows", str(args.windows), "--out", out_path],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                       env=dict(blas_env(args), OMP_NUM_THREADS="1", **MALLOC_ENV))
    if r.returncode != 0:
        raise RuntimeError(f"ddp_bench failed ({r.returncode}):\n{r.stderr[-2000:]}")
    rows = read_jsonl(out_path)
    rate, per_window = steady_rate({x["window"]: (x["end_time_ms"], x["tokens"]) for x in rows},
                                   args.skip)
    note = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    return {"tokens_per_s": rate, "seconds_per_window": per_window, "note": note,
            "blas": blas_of(note)}


def blas_env(args):
    """The environment every system runs in: --blas-dir first on the library path."""
    if not args.blas_dir:
        return dict(os.environ)
    return dict(os.environ, LD_LIBRARY_PATH=":".join(
        d for d in (args.blas_dir, os.environ.get("LD_LIBRARY_PATH", "")) if d))


def cpu_flags():
    """The CPU's model and the flags that decide fp32 and bf16 speed."""
    model, flags = "?", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "?":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    shown = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")
             if f in flags]
    return model, shown


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    p.add_argument("--out-dir", default=f"/tmp/trainstep-worker-bench-{os.getpid()}")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--reps", type=int, default=3,
                   help="interleaved repetitions, medians reported (one is ±5%% on a busy machine)")
    p.add_argument("--windows", type=int, default=16,
                   help="windows per run (≤ 37: the bf16 row's epoch has 37 full windows)")
    p.add_argument("--skip", type=int, default=5, help="start-up windows left out")
    p.add_argument("--workers", type=int, default=2)
    # Both rows train the same tiny_gpt: with OpenBLAS (scripts/install-deps.sh) an fp32
    # window takes a few hundred ms like a bf16 one (compute ≫ RPC). On the reference BLAS
    # (~50x slower) pass a smaller --fp32-model, e.g. 2,4,64,64.
    p.add_argument("--fp32-model", default="4,4,128,128", help="n_layer,n_head,d_model,seq_len")
    p.add_argument("--bf16-model", default="4,4,128,128", help="n_layer,n_head,d_model,seq_len")
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--accumulation-steps", type=int, default=4)
    p.add_argument("--data", default="/usr/share/common-licenses")
    p.add_argument("--blas-dir", default="",
                   help="run every system with this folder first on LD_LIBRARY_PATH, e.g. "
                        "/usr/lib/x86_64-linux-gnu/openblas-pthread (default: libblas.so.3 as "
                        "the alternatives system points it)")
    p.add_argument("--max-foreign-cores", type=float, default=0.15,
                   help="a measurement during which other processes used more CPU (cores on "
                        "average) is disturbed: measured again, or marked *")
    p.add_argument("--retries", type=int, default=2, help="re-measurements of a disturbed run")
    p.add_argument("--quiet-wait", type=float, default=60,
                   help="seconds to wait for other processes to go quiet before each run")
    p.add_argument("--contention", action="store_true",
                   help="also run (a)x2: two copies of (a) at once")
    p.add_argument("--plain-default-malloc", action="store_true",
                   help="also run (a) with glibc's default malloc settings")
    p.add_argument("--compare-overlap", action="store_true",
                   help="also run trainstep with --overlap-allreduce=false (all-reduce after "
                        "backward)")
    args = p.parse_args()
    args.build_dir = os.path.abspath(args.build_dir)
    become_subreaper()
    for b in ("bin/trainstep-worker", "bin/trainstep-coordinator", "bin/trainstep",
              "bench/plain_loop_bench"):
        if not os.access(os.path.join(args.build_dir, b), os.X_OK):
            sys.exit(f"worker_bench: {args.build_dir}/{b} not found: run `make build` first "
                     "(with TRAINSTEP_BUILD_WORKER=ON)")
    os.makedirs(args.out_dir, exist_ok=True)
    env = dict(blas_env(args), OMP_NUM_THREADS="1")
    cpu_model, flags = cpu_flags()
    models = "; ".join(
        f"{pr} tiny_gpt n_layer {m[0]} n_head {m[1]} d_model {m[2]} seq_len {m[3]}"
        for pr, m in ((pr, model_of(args, pr)) for pr in args.precisions.split(",")))
    print(f"worker bench: nproc {os.cpu_count()}, CPU {cpu_model} ({' '.join(flags)}), "
          f"load {loadavg():.2f}; "
          f"{models}; micro_batch_size {args.micro_batch_size} K "
          f"{args.accumulation_steps} W {args.workers}; windows {args.skip + 1}..{args.windows} "
          f"timed; 1 torch thread per process; out {args.out_dir}", flush=True)

    started = time.time()
    results = {}
    for rep in range(args.reps):
        for precision in args.precisions.split(","):
            row_start = time.time()
            spec_path = os.path.join(args.out_dir, f"spec-{precision}.json")
            with open(spec_path, "w") as f:
                json.dump(spec_for(args, precision), f, indent=1)
            tag = f"{precision}-{rep}"
            r = {}
            systems = [
                ("trainstep", lambda: run_trainstep(args, spec_path,
                                                    os.path.join(args.out_dir, f"ts-{tag}"), env)),
                ("plain", lambda: run_plain(args, spec_path,
                                            os.path.join(args.out_dir, f"plain-{tag}.jsonl"))),
                ("ddp", lambda: run_ddp(args, spec_path,
                                        os.path.join(args.out_dir, f"ddp-{tag}.jsonl"))),
            ]
            if args.contention:
                systems.append(("plain_x2", lambda: run_plain(
                    args, spec_path, os.path.join(args.out_dir, f"plain2-{tag}.jsonl"), copies=2)))
            if args.compare_overlap:
                systems.append(("trainstep_no_overlap", lambda: run_trainstep(
                    args, spec_path, os.path.join(args.out_dir, f"ts-no-overlap-{tag}"), env,
                    worker_flags=("--overlap-allreduce=false",))))
            if args.plain_default_malloc:
                systems.append(("plain_glibc", lambda: run_plain(
                    args, spec_path, os.path.join(args.out_dir, f"plain-glibc-{tag}.jsonl"),
                    malloc="default")))
            # Each repetition starts with another system, so a slow drift hits all of them.
            for name, run in systems[rep % len(systems):] + systems[:rep % len(systems)]:
                r[name] = measured(run, args, f"{tag} {name}")
            r["row_seconds"] = time.time() - row_start
            results.setdefault(precision, []).append(r)
            def show(name, label, unit=""):
                if name not in r:
                    return ""
                x = r[name]
                mark = "*" if x["foreign_cores"] > args.max_foreign_cores else ""
                return (f", {label} {x['tokens_per_s']:.0f}{unit}{mark} "
                        f"[others {x['foreign_cores']:.2f} cores]")
            ts = r["trainstep"]
            print(f"  {tag}: trainstep {ts['tokens_per_s']:.0f} tok/s "
                  f"({ts['per_worker_tokens_per_s']:.0f}/worker)"
                  f"{'*' if ts['foreign_cores'] > args.max_foreign_cores else ''} "
                  f"[others {ts['foreign_cores']:.2f} cores]" + show("plain", "(a)") + show("ddp", "(b)")
                  + show("trainstep_no_overlap", "trainstep no overlap")
                  + show("plain_x2", "(a)x2", "/copy") + show("plain_glibc", "(a) glibc malloc")
                  + f"; row {r['row_seconds']:.0f} s", flush=True)
            libs = {name: x["blas"] for name, x in r.items()
                    if isinstance(x, dict) and "blas" in x}
            if len(set(libs.values())) == 1:
                print(f"    blas (every system): {next(iter(libs.values()))}", flush=True)
            else:
                print(f"    WARNING: the systems ran on different BLAS libraries: {libs}",
                      flush=True)

    def med(rows, *path):
        vals = []
        for row in rows:
            v = row
            for k in path:
                v = v[k]
            vals.append(v)
        return statistics.median(vals)

    disturbed = sum(1 for rows in results.values() for r in rows for k, x in r.items()
                    if isinstance(x, dict) and x.get("foreign_cores", 0) > args.max_foreign_cores)
    print()
    if disturbed:
        print(f"{disturbed} measurement(s) kept although other processes used > "
              f"{args.max_foreign_cores} cores meanwhile (marked * above): the medians below are "
              "less trustworthy; run again on a quieter machine.")
    print("tokens/s: medians over repetitions; ratios: median [min-max] of each repetition's ratio")
    print("| precision | trainstep W=2 tok/s | per worker | (a) plain 1 proc | per worker ÷ (a) "
          "(aim ≥ 0.95) | (b) DDP W=2 | trainstep ÷ (b) (aim ≥ 1.2) |")
    print("|---|---|---|---|---|---|---|")
    # Ratios are taken within each repetition (its measurements ran minutes apart at most, so
    # a slow drift of the machine cancels), then the median over repetitions [min-max].
    def ratios(rows, num, den, num_scale=1.0):
        return [r[num]["tokens_per_s"] * num_scale / r[den]["tokens_per_s"] for r in rows]

    def fmt(v):
        return f"{statistics.median(v):.3f} [{min(v):.3f}-{max(v):.3f}]" if len(v) > 1 else f"{v[0]:.3f}"

    summary = {}
    for precision, rows in results.items():
        ts = med(rows, "trainstep", "tokens_per_s")
        a = med(rows, "plain", "tokens_per_s")
        b = med(rows, "ddp", "tokens_per_s")
        rp = ratios(rows, "trainstep", "plain", 1.0 / args.workers)
        rb = ratios(rows, "trainstep", "ddp")
        sm = summary[precision] = {
            "trainstep": ts, "per_worker": ts / args.workers, "plain": a, "ddp": b,
            "ratio_plain": statistics.median(rp), "ratio_ddp": statistics.median(rb),
            "ratio_plain_each": rp, "ratio_ddp_each": rb}
        for extra in ("plain_x2", "plain_glibc", "trainstep_no_overlap"):
            if extra in rows[0]:
                sm[extra] = med(rows, extra, "tokens_per_s")
                sm[extra + "_over_plain_each"] = ratios(rows, extra, "plain")
        print(f"| {precision} | {ts:.0f} | {ts / args.workers:.0f} | {a:.0f} | {fmt(rp)} "
              f"{'ok' if sm['ratio_plain'] >= 0.95 else 'MISSED'} | {b:.0f} | {fmt(rb)} "
              f"{'ok' if sm['ratio_ddp'] >= 1.2 else 'MISSED'} |")
    for precision, sm in summary.items():
        if "plain_x2" in sm:
            print(f"  {precision} diagnostic: (a)x2 {sm['plain_x2']:.0f} tok/s per copy, "
                  f"{fmt(sm['plain_x2_over_plain_each'])} of (a)")
        if "plain_glibc" in sm:
            print(f"  {precision} diagnostic: (a) with glibc's default malloc {sm['plain_glibc']:.0f} "
                  f"tok/s, {fmt(sm['plain_glibc_over_plain_each'])} of (a)")
        if "trainstep_no_overlap" in sm:
            over = ratios(results[precision], "trainstep", "trainstep_no_overlap")
            print(f"  {precision} overlap: trainstep {sm['trainstep']:.0f} tok/s overlapped vs "
                  f"{sm['trainstep_no_overlap']:.0f} with --overlap-allreduce=false: "
                  f"{fmt(over)} (> 1: overlapping helps)")
    print()
    print("Where a window's time goes (seconds per window, medians over repetitions; trainstep "
          "phases from the workers' /metrics, averaged over both workers):")
    for precision, rows in results.items():
        for system in ("trainstep", "trainstep_no_overlap"):
            if system not in rows[0]:
                continue
            phase = {p: statistics.median(r[system]["phase_seconds_per_window"].get(p, 0.0)
                                          for r in rows)
                     for p in ("forward", "backward", "allreduce", "optimizer")}
            # Part of backward's time, not added: the all-reduce in flight behind backward.
            hidden = statistics.median(
                r[system]["phase_seconds_per_window"].get("allreduce_overlapped", 0.0)
                for r in rows)
            wall = med(rows, system, "seconds_per_window")
            coord = med(rows, system, "coordinator_window_seconds")
            ts = rows[len(rows) // 2][system]
            print(f"  {precision} {system}: {wall:.4f} = forward {phase['forward']:.4f} + "
                  f"backward {phase['backward']:.4f} (all-reduce in flight behind it "
                  f"{hidden:.4f}) + allreduce wait {phase['allreduce']:.4f} + optimizer "
                  f"{phase['optimizer']:.4f} + other {wall - sum(phase.values()):.4f} (RPC "
                  f"barriers, planning, collate, unscale/check/norm); coordinator's window_seconds "
                  f"{coord:.4f}; allreduce calls per window {ts['allreduce_calls']}; worker CPU "
                  f"{[round(c['cpu_seconds'], 1) for c in ts['worker_cpu']]} s in "
                  f"{ts['wall_seconds']:.0f} s wall (start-up included), threads "
                  f"{[c['threads'] for c in ts['worker_cpu']]}")
        print(f"  {precision} (a), {args.workers}x a worker's share per window: "
              f"{med(rows, 'plain', 'seconds_per_window'):.4f} = forward+backward "
              f"{med(rows, 'plain', 'compute_seconds_per_window'):.4f} + AdamW step "
              f"{med(rows, 'plain', 'optimizer_seconds_per_window'):.4f}; {rows[0]['plain']['note']}")
        print(f"  {precision} (b): {med(rows, 'ddp', 'seconds_per_window'):.4f}; {rows[0]['ddp']['note']}")
    total = time.time() - started
    print(f"\nworker bench took {total:.0f} s; raw results in {args.out_dir}/results.json")
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump({"args": vars(args), "rows": results, "summary": summary,
                   "seconds": total}, f, indent=1)


if __name__ == "__main__":
    main()
