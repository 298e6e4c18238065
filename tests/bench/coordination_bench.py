#!/usr/bin/python3
"""The coordination round against the least it costs W processes to agree on one number.

  tests/bench/coordination_bench.py [--build-dir build] [--worlds 2,8,32] [--reps 3]
                                    [--windows 1000] [--skip 100] [--breakdown] [--json FILE]

Two systems, each with W ranks as separate processes on this machine:
  coordinator  the real trainstep-coordinator (journal on --journal-dir, fsync per decision)
               and W simulated ranks (bench/coordination_rank: tests/integration's
               SimulatedWorker, the real WorkerService protocol, no LibTorch). Each rank
               times the round from one decision to the next, no compute between: one
               CompleteWindow per window carrying the next window's begin report (the
               worker's default, --pipeline-begin), for --windows windows after --skip.
  gloo         W processes of tests/bench/gloo_allreduce_rank.py (Debian's python3-torch,
               torch.distributed Gloo on 127.0.0.1): an all-reduce of one float, timed,
               --windows times after --skip.
p50 / p99 over all ranks' timings. Per W, each repetition runs both, back to back, in an
order rotated by one each repetition; the ratio coordinator p50 ÷ gloo p50 is taken
within a repetition, and the headline is the median [min–max] over repetitions.

--breakdown adds, in the same interleaving, where a round's time goes:
  coord-tmpfs  the coordinator with its journal on /dev/shm (fsync ≈ free): the fsync's share;
  coord-2rpc   the coordinator with ranks that send BeginWindow and CompleteWindow apart
               (--pipeline-begin=false): what riding the begin report on CompleteWindow saves;
  unary-1      one client process making two ListJobs calls in a row (each pair timed)
               against a fresh coordinator: the gRPC cost alone, with no barrier or journal;
  unary-W      W such client processes at once: the same calls under the round's load;
  fsync        a 64-byte append + fsync on --journal-dir, in this process.
and the CPU each side spends per round (all its processes), whose half is a floor for a
round on this 2-core machine. See BENCHMARKS.md.
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "worker"))
from worker_bench import loadavg, machine_busy_seconds, own_seconds, wait_for_quiet  # noqa: E402

TORCH_PYTHON = "/usr/bin/python3"
TICK = os.sysconf("SC_CLK_TCK")


def percentile(values, q):
    """The nearest-rank percentile loopback_bench uses."""
    v = sorted(values)
    return v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))]


def proc_cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def wait_all(procs, what, timeout):
    deadline = time.time() + timeout
    for p in procs:
        try:
            rc = p.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise RuntimeError(f"{what}: still running after {timeout} s")
        if rc != 0:
            for q in procs:
                q.kill()
            raise RuntimeError(f"{what}: a process exited with {rc}")


def read_results(paths):
    seconds, cpu, wall = [], 0.0, []
    for path in paths:
        with open(path) as f:
            d = json.load(f)
        seconds += d["seconds"]
        cpu += d["cpu_s"]
        wall.append(d["wall_s"])
    return seconds, cpu, wall


class Coordinator:
    """A trainstep-coordinator process on 127.0.0.1 with its journal in a fresh directory."""

    def __init__(self, args, work, journal_parent):
        self.state_dir = tempfile.mkdtemp(prefix="coordination-bench-state-", dir=journal_parent)
        port_file = os.path.join(work, "ports.json")
        if os.path.exists(port_file):  # the previous coordinator's: it would be read at once
            os.unlink(port_file)
        self.log = open(os.path.join(work, "coordinator.log"), "w")
        self.proc = subprocess.Popen(
            [args.coordinator, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
             "--state-dir", self.state_dir, "--port-file", port_file],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while not os.path.exists(port_file):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the coordinator did not start (see {self.log.name})")
            time.sleep(0.02)
        with open(port_file) as f:
            self.address = f"127.0.0.1:{json.load(f)['grpc_port']}"

    def cpu(self):
        return proc_cpu(self.proc.pid)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.state_dir, ignore_errors=True)


def run_coordinator(args, world, work, journal_parent, pipeline_begin=True):
    rank = os.path.join(args.build_dir, "bench", "coordination_rank")
    windows = args.skip + args.windows
    c = Coordinator(args, work, journal_parent)
    try:
        job = subprocess.run([rank, "--address", c.address, "--submit", "--world", str(world),
                              "--windows", str(windows)],
                             check=True, capture_output=True, text=True).stdout.strip()
        cpu0 = c.cpu()
        outs = [os.path.join(work, f"rank-{r}.json") for r in range(world)]
        procs = [subprocess.Popen([rank, "--address", c.address, "--job", job,
                                   "--name", f"rank-{r}", "--samples", str(world * windows),
                                   "--skip", str(args.skip), "--out", outs[r],
                                   f"--pipeline_begin={str(pipeline_begin).lower()}"])
                 for r in range(world)]
        wait_all(procs, f"coordinator W={world}", args.timeout)
        coordinator_cpu = c.cpu() - cpu0
    finally:
        c.stop()
    seconds, rank_cpu, wall = read_results(outs)
    # The coordinator's CPU covers registration and warm-up too: per window of all of them.
    return {"seconds": seconds, "rank_cpu_per_round": rank_cpu / args.windows,
            "server_cpu_per_round": coordinator_cpu / windows,
            "rounds_per_s": args.windows / statistics.median(wall)}


def run_gloo(args, world, work):
    store = os.path.join(work, "filestore")
    outs = [os.path.join(work, f"gloo-{r}.json") for r in range(world)]
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    procs = [subprocess.Popen([TORCH_PYTHON, os.path.join(HERE, "gloo_allreduce_rank.py"),
                               "--rank", str(r), "--world", str(world), "--store", store,
                               "--iters", str(args.windows), "--skip", str(args.skip),
                               "--out", outs[r]], env=env)
             for r in range(world)]
    wait_all(procs, f"gloo W={world}", args.timeout)
    seconds, rank_cpu, wall = read_results(outs)
    return {"seconds": seconds, "rank_cpu_per_round": rank_cpu / args.windows,
            "server_cpu_per_round": 0.0, "rounds_per_s": args.windows / statistics.median(wall)}


def run_unary(args, clients, work):
    rank = os.path.join(args.build_dir, "bench", "coordination_rank")
    c = Coordinator(args, work, tempfile.gettempdir())
    try:
        cpu0 = c.cpu()
        outs = [os.path.join(work, f"unary-{r}.json") for r in range(clients)]
        procs = [subprocess.Popen([rank, "--address", c.address, "--unary", str(args.windows),
                                   "--skip", str(args.skip), "--out", outs[r]])
                 for r in range(clients)]
        wait_all(procs, f"unary x{clients}", args.timeout)
        server_cpu = c.cpu() - cpu0
    finally:
        c.stop()
    seconds, client_cpu, wall = read_results(outs)
    pairs = clients * (args.skip + args.windows)
    return {"seconds": seconds, "rank_cpu_per_round": client_cpu / args.windows,
            "server_cpu_per_round": server_cpu / (args.skip + args.windows),
            "server_cpu_per_call": server_cpu / (2 * pairs),
            "rounds_per_s": args.windows / statistics.median(wall)}


def run_fsync(args, journal_parent, n=500):
    """A record-sized append + fsync on the journal's file system, n times."""
    fd, path = tempfile.mkstemp(prefix="coordination-bench-fsync-", dir=journal_parent)
    seconds = []
    try:
        for _ in range(n):
            start = time.perf_counter()
            os.write(fd, b"x" * 64)
            os.fsync(fd)
            seconds.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        os.unlink(path)
    return {"seconds": seconds, "rank_cpu_per_round": 0.0, "server_cpu_per_round": 0.0,
            "rounds_per_s": 0.0}


def measure(args, run, what):
    """run() with the load around it: other processes' CPU (cores), retried while above
    --max-foreign-cores (at most --retries times), then kept and marked."""
    for attempt in range(args.retries + 1):
        wait_for_quiet(args.max_foreign_cores, args.quiet_wait)
        load0 = loadavg()
        b0, o0, t0 = machine_busy_seconds(), own_seconds(), time.time()
        r = run()
        wall = time.time() - t0
        r["foreign_cores"] = max(0.0, (machine_busy_seconds() - b0) - (own_seconds() - o0)) / wall
        r["load"] = (load0, loadavg())
        r["p50"] = percentile(r["seconds"], 0.50)
        r["p99"] = percentile(r["seconds"], 0.99)
        r["samples"] = len(r.pop("seconds"))
        if r["foreign_cores"] <= args.max_foreign_cores or attempt == args.retries:
            break
        print(f"    {what}: other processes used {r['foreign_cores']:.2f} cores; measuring again",
              flush=True)
    print(f"  {what}: p50 {r['p50'] * 1e3:.3f} ms, p99 {r['p99'] * 1e3:.3f} ms, "
          f"CPU/round {(r['rank_cpu_per_round'] + r['server_cpu_per_round']) * 1e3:.3f} ms, "
          f"others {r['foreign_cores']:.2f} cores, load {r['load'][0]:.2f}→{r['load'][1]:.2f}",
          flush=True)
    return r


def med(rows, key):
    return statistics.median(r[key] for r in rows)


def mark(rows):
    return "*" if any(r["foreign_cores"] > ARGS.max_foreign_cores for r in rows) else ""


def main():
    global ARGS
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    p.add_argument("--coordinator", help="default: BUILD_DIR/bin/trainstep-coordinator")
    p.add_argument("--worlds", default="2,8,32")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--windows", type=int, default=1000, help="timed rounds per rank")
    p.add_argument("--skip", type=int, default=100, help="warm-up rounds, untimed")
    p.add_argument("--journal-dir", default=tempfile.gettempdir(),
                   help="where the coordinator's journal lives (a disk, as in production)")
    p.add_argument("--breakdown", action="store_true", help="also coord-tmpfs, unary, fsync")
    p.add_argument("--max-foreign-cores", type=float, default=0.3)
    p.add_argument("--retries", type=int, default=1)
    p.add_argument("--quiet-wait", type=float, default=20.0)
    p.add_argument("--timeout", type=float, default=300.0, help="per measurement, seconds")
    p.add_argument("--json", help="also write every measurement here")
    args = ARGS = p.parse_args()
    args.build_dir = os.path.abspath(args.build_dir)
    args.coordinator = args.coordinator or os.path.join(args.build_dir, "bin",
                                                        "trainstep-coordinator")
    for exe in (args.coordinator, os.path.join(args.build_dir, "bench", "coordination_rank")):
        if not os.access(exe, os.X_OK):
            sys.exit(f"{exe} missing: run `make build` (or pass --build-dir)")
    worlds = [int(w) for w in args.worlds.split(",")]
    print(f"coordination_bench: nproc {os.cpu_count()}, load {os.getloadavg()}, "
          f"journal on {args.journal_dir}, {args.windows} rounds after {args.skip}, "
          f"{args.reps} repetitions", flush=True)

    results = {}  # (system, world) -> [one dict per repetition]
    work = tempfile.mkdtemp(prefix="coordination-bench-")
    try:
        for world in worlds:
            systems = [("coordinator", lambda: run_coordinator(args, world, work, args.journal_dir)),
                       ("gloo", lambda: run_gloo(args, world, work))]
            if args.breakdown:
                systems += [
                    ("coord-tmpfs", lambda: run_coordinator(args, world, work, "/dev/shm")),
                    ("coord-2rpc", lambda: run_coordinator(args, world, work, args.journal_dir,
                                                           pipeline_begin=False)),
                    ("unary-1", lambda: run_unary(args, 1, work)),
                    ("unary-W", lambda: run_unary(args, world, work)),
                    ("fsync", lambda: run_fsync(args, args.journal_dir))]
            for rep in range(args.reps):
                order = systems[rep % len(systems):] + systems[:rep % len(systems)]
                for name, run in order:
                    results.setdefault((name, world), []).append(
                        measure(args, run, f"W={world} rep {rep} {name}"))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print("\n| W | coordinator p50 | p99 | Gloo all-reduce p50 | p99 | "
          "**coordinator ÷ Gloo (p50)** | load (1 min) |")
    print("|---|---|---|---|---|---|---|")
    for world in worlds:
        c, g = results[("coordinator", world)], results[("gloo", world)]
        ratios = sorted(a["p50"] / b["p50"] for a, b in zip(c, g))
        loads = [x for r in c + g for x in r["load"]]
        print(f"| {world} | {med(c, 'p50') * 1e3:.3f} ms{mark(c)} | {med(c, 'p99') * 1e3:.2f} ms "
              f"| {med(g, 'p50') * 1e3:.3f} ms{mark(g)} | {med(g, 'p99') * 1e3:.2f} ms "
              f"| **{statistics.median(ratios):.2f}** [{ratios[0]:.2f}–{ratios[-1]:.2f}] "
              f"| {min(loads):.1f}–{max(loads):.1f} |")
    print("\n| W | CPU per round: coordinator side (ranks + server) | Gloo side | "
          "rounds/s coordinator | Gloo |")
    print("|---|---|---|---|---|")
    for world in worlds:
        c, g = results[("coordinator", world)], results[("gloo", world)]
        print(f"| {world} | {med(c, 'rank_cpu_per_round') * 1e3:.2f} + "
              f"{med(c, 'server_cpu_per_round') * 1e3:.2f} ms "
              f"| {med(g, 'rank_cpu_per_round') * 1e3:.2f} ms "
              f"| {med(c, 'rounds_per_s'):.0f} | {med(g, 'rounds_per_s'):.0f} |")
    if args.breakdown:
        print("\n| W | round, journal on disk | round, journal on tmpfs | round, two calls "
              "per window (CPU ranks + server) | two unary calls, 1 client | two unary calls, "
              "W clients | server CPU per unary call | fsync alone |")
        print("|---|---|---|---|---|---|---|---|")
        for world in worlds:
            r = {s: results[(s, world)] for s in
                 ("coordinator", "coord-tmpfs", "coord-2rpc", "unary-1", "unary-W", "fsync")}
            print(f"| {world} | {med(r['coordinator'], 'p50') * 1e3:.3f} ms "
                  f"| {med(r['coord-tmpfs'], 'p50') * 1e3:.3f} ms "
                  f"| {med(r['coord-2rpc'], 'p50') * 1e3:.3f} ms "
                  f"({med(r['coord-2rpc'], 'rank_cpu_per_round') * 1e3:.2f} + "
                  f"{med(r['coord-2rpc'], 'server_cpu_per_round') * 1e3:.2f} ms) "
                  f"| {med(r['unary-1'], 'p50') * 1e3:.3f} ms "
                  f"| {med(r['unary-W'], 'p50') * 1e3:.3f} ms "
                  f"| {med(r['unary-W'], 'server_cpu_per_call') * 1e6:.0f} µs "
                  f"| {med(r['fsync'], 'p50') * 1e3:.3f} ms |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"system": s, "world": w, "rep": i, **r}
                       for (s, w), rows in results.items() for i, r in enumerate(rows)], f,
                      indent=1)


if __name__ == "__main__":
    main()
