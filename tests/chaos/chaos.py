#!/usr/bin/env python3
"""trainstep chaos: real jobs on the real binaries, hurt at random (seeded) times, judged.

Each job: the coordinator with a state directory on a fixed address (restarted there, on
the same state, whenever it exits), W worker slots plus spares (a slot restarts its worker
when it exits with an error; a fault that costs a rank waits until a spare is registered
again, so one is at hand when the rank is lost), and a job
of --updates SGD-momentum updates that checkpoints every --checkpoint-every updates. While it
trains, faults are injected one at a time, each after the previous one has healed and the job
committed again, --gap seconds apart. Jobs follow each other until --faults faults were
injected (--faults-per-job each), so a long campaign runs unattended.

Fault kinds (--kinds, default all that this machine allows):
  worker_kill       SIGKILL of a rank's worker; its slot restarts it
  coordinator_kill  SIGKILL of the coordinator; restarted at once on the same address/state
  restart_gap_kill  coordinator_kill plus SIGKILL of a rank, from 0.5 s before the
                    coordinator's death to 0.3 s after its successor listens: the restarted
                    coordinator loses a rank before it heard from the survivors, the case
                    where a rollback redid updates the survivors still held
  worker_stop       SIGSTOP of a rank for longer than the lease, then SIGCONT (gray failure)
  checkpoint_kill   SIGKILL of rank 0 the moment its checkpoint temp dir appears (inotify)
  journal_full      the journal's device (a tmpfs this tool mounts; root) filled up until the
                    coordinator holds its decisions, then freed: it must resume by itself,
                    without exiting
  fsync_fail        fsync() fails with EIO (an LD_PRELOAD shim built with cc) until the
                    coordinator holds its decisions, then works again (the same)
  worker_retire     SIGKILL of a rank whose slot is not restarted (a machine lost for good);
                    only while a spare is registered, or, with --min-workers below W and no
                    spare, while the world is whole (the job shrinks at once); a new slot is
                    added afterwards (a spare, or the worker the shrunk job grows back with)
  all_ranks_kill    SIGKILL of every rank at once: no replica is left, so the job must roll
                    back to its latest durable checkpoint (a necessary rollback) and still end
                    with the fault-free weights
  partition         (--netns only) a rank's link taken down longer than the lease, then up
  hang              a rank held before its next window, alive and heartbeating (the testing
                    build's --debug-hold-file), until the job committed in a generation
                    without it: it must be fenced as hung, not waited for
  grad_flip         +inf into one rank's local gradient in one window's first run (a transient
                    fault: the job re-runs non-finite windows, spec.validate); judged by the
                    window's `rerun` record, which must name that rank's worker as transient

Judgement, per job (a job passes when all hold):
  1. the job SUCCEEDED;
  2. its final checkpoint's model.safetensors equals that of the same spec run without faults
     (same seed and data, W workers) to --tolerance relative (max|a-b| / max|b| per tensor);
  3. in the per-update log, every commit carries the update id after the previous one (no
     update lost) and no id is committed twice, except right after a logged rollback
     (a {"event":"generation_formed", ..., "rolled_back":true} line of the coordinator's
     json log; older coordinators: "generation G formed ... (rolled back to checkpoint C)");
  4. no rollback while a worker process that held the current update was running (it was a
     rank of the generation that committed it, or of a later one before the rollback);
  5. no fault stalled it: after each fault a commit came within max(60 s, 4 leases + 30 s).
     After a stall no further fault is injected into that job, so none can unstick it.
  6. every grad_flip was attributed to its rank: the first re-run after it is transient and
     names the victim's worker;
  7. no worker process died of a signal the campaign did not send (a peer's death must not
     kill a survivor, as SIGPIPE from a collective's socket would).
Recovery per fault: from the injection (from the restarted coordinator listening, for the
coordinator's faults, after the heal) to the end_time_ms of the next commit, in a newer
generation for the faults that cost a rank. Reported p50/max per kind; with
--enforce-bounds the verdict also requires the recovery bounds: the next commit ≤ 1 s; a stopped
or partitioned rank replaced (the recovering generation's last rank assigned) ≤ lease;
all_ranks_kill, which must start new processes, ≤ lease; restart_gap_kill ≤ the reconnect
grace + 1 s (a rank dead before it reached the new coordinator is told from a slow one only
by the grace). --resummarize DIR judges a finished campaign again without running anything.

Output in --out: summary.json, summary.txt (the table), results.md (to paste into
RELIABILITY.md), faults.jsonl and jobs.jsonl (appended as jobs end), jobs/NNN/ (logs; the
checkpoints are deleted after a passing job unless --keep). Exit code: 0 every job passed,
1 a judgement failed, 2 bad usage, 77 nothing could run here (the reason is printed).

Examples:
  /usr/bin/python3 tests/chaos/chaos.py --faults 16 --seed 3 --out /tmp/chaos
  nice -n 10 /usr/bin/python3 tests/chaos/chaos.py --faults 560 --faults-per-job 8 \\
      --seed 1 --out /tmp/chaos-long                     # the long campaign, unattended
  /usr/bin/python3 tests/chaos/chaos.py --netns --latency-ms 1 --kinds partition --faults 2

Needs Debian's /usr/bin/python3 (grpc, protobuf, numpy) and PYTHONPATH with client/python
(set here from the source tree when missing); the binaries in --bin (default
$TRAINSTEP_BIN_DIR, else build/bin of this checkout).
"""

import argparse
import hashlib
import importlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("TRAINSTEP_SOURCE_DIR") or os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
if os.path.join(SOURCE_DIR, "client", "python") not in sys.path:
    sys.path.append(os.path.join(SOURCE_DIR, "client", "python"))  # PYTHONPATH's wins

SKIP = 77

KINDS = ("worker_kill", "coordinator_kill", "restart_gap_kill", "worker_stop", "checkpoint_kill",
         "journal_full", "fsync_fail", "worker_retire", "all_ranks_kill", "grad_flip", "partition",
         "hang", "coordinator_stop", "checkpoint_full", "checkpoint_corrupt")
# The coordinator's own faults: counted from a new coordinator listening (a kill), or from the
# heal (the journal's and a pause, which the same coordinator outlives).
COORDINATOR_FAULTS = ("coordinator_kill", "journal_full", "fsync_fail", "coordinator_stop")
# Kinds that put a tmpfs under a directory of the job (root).
DEVICE_FAULTS = ("journal_full", "checkpoint_full")
# Faults that cost one rank, which the registered spare replaces: each is injected only once
# a spare is registered again (the campaign's precondition; its wait is reported).
SPARE_FAULTS = ("worker_kill", "worker_retire", "restart_gap_kill", "checkpoint_kill",
                "worker_stop", "partition", "hang")
# Each kind's bound on recovery: (seconds, or "lease", or "grace + 1 s"; the phase of
# judge.phases it holds).
# * 1 s to the next commit for a rank's or the coordinator's SIGKILL; a SIGSTOPped
#   (or cut-off) worker "replaced within the lease": the recovering generation's last rank
#   assigned its place, the commit follows.
# * all_ranks_kill is not one of those faults: no replica survives, so its recovery
#   includes starting new worker processes (the slot's --restart-delay, LibTorch's start,
#   registration) and loading the checkpoint it rolls back to; held to the lease.
# * restart_gap_kill is not one either: a rank dies while the coordinator restarts. When it dies
#   before it reached the new coordinator, nothing but the reconnect grace tells it from a live
#   rank slow to reconnect (a live one takes 0.1-0.3 s): held to the grace + 1 s. The summary
#   counts every kind's recoveries beyond 1 s as well.
# * checkpoint_full costs no commit: training goes on while the write fails (1 s to the next
#   commit after the fill); checkpoint_corrupt is all_ranks_kill with the checkpoint it rolls
#   back to damaged, so two rollbacks: held to the lease as well.
BOUNDS = {"worker_kill": (1.0, "commit_s"), "checkpoint_kill": (1.0, "commit_s"),
          "worker_retire": (1.0, "commit_s"), "coordinator_kill": (1.0, "commit_s"),
          "journal_full": (1.0, "commit_s"), "fsync_fail": (1.0, "commit_s"),
          "restart_gap_kill": ("grace + 1 s", "commit_s"), "all_ranks_kill": ("lease", "commit_s"),
          "worker_stop": ("lease", "assigned_s"), "partition": ("lease", "assigned_s"),
          "grad_flip": (1.0, "commit_s"), "hang": (10.0, "commit_s"),
          "coordinator_stop": (1.0, "commit_s"), "checkpoint_full": (1.0, "commit_s"),
          "checkpoint_corrupt": ("lease", "commit_s")}
# The coordinator's default --reconnect_grace_ms (this tool does not change it), in seconds.
RECONNECT_GRACE_S = 3.0


def bound_of(kind, lease_s):
    """(seconds, phase) that `kind`'s recovery is held to."""
    bound, phase = BOUNDS[kind]
    if bound == "lease":
        return lease_s, phase
    if bound == "grace + 1 s":
        # StepMachine::Recovered's grace: never shorter than 1.5 heartbeats (lease / 5), never
        # longer than the lease.
        return min(lease_s, max(RECONNECT_GRACE_S, 0.3 * lease_s)) + 1.0, phase
    return bound, phase


def log(msg):
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="chaos.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--faults", type=int, default=8, help="faults to inject in all (default 8)")
    p.add_argument("--faults-per-job", type=int, default=8,
                   help="at most this many per job; more jobs follow (default 8)")
    p.add_argument("--seed", type=int, default=1, help="seeds fault order, victims and times")
    p.add_argument("--kinds", default="all",
                   help="comma-separated fault kinds (see above), or all (default)")
    p.add_argument("--out", help="output directory (default: a new /tmp/trainstep-chaos-*)")
    p.add_argument("--bin", help="directory of trainstep-coordinator, trainstep-worker (default "
                   "$TRAINSTEP_BIN_DIR, else build/bin); with grad_flip, its testing/ "
                   "subdirectory when it has one (the testing build's worker takes the flips)")
    p.add_argument("--updates", type=int, default=400, help="updates per job (default 400)")
    p.add_argument("--checkpoint-every", type=int, default=25,
                   help="checkpoint cadence in updates (default 25)")
    p.add_argument("--workers", type=int, default=3, help="ranks W (default 3)")
    p.add_argument("--spares", type=int, default=1, help="spare worker slots (default 1)")
    p.add_argument("--min-workers", type=int,
                   help="the spec's workers.min (default W: the job never shrinks)")
    p.add_argument("--model", choices=("mlp", "tiny_gpt"), default="mlp",
                   help="mlp on synthetic regression data (default), or a small tiny_gpt on a "
                        "text file this tool writes")
    p.add_argument("--job-seed", type=int, default=7, help="the job spec's seed (default 7)")
    p.add_argument("--lease-ms", type=int,
                   help="coordinator --worker-lease-ms (default: the coordinator's, 10000)")
    p.add_argument("--netns", action="store_true",
                   help="multi-host: coordinator and each worker in its own network namespace "
                        "(root)")
    p.add_argument("--latency-ms", type=float, default=1.0,
                   help="--netns: one-way delay per link (default 1: 2 ms node to node)")
    p.add_argument("--gap", default="0.1,1.0",
                   help="MIN,MAX seconds between a fault's recovery and the next (default "
                        "0.1,1.0)")
    p.add_argument("--restart-delay", type=float, default=0.5,
                   help="seconds before a slot restarts its exited worker (default 0.5)")
    p.add_argument("--tolerance", type=float, default=1e-5,
                   help="relative weight tolerance against the fault-free run (default 1e-5)")
    p.add_argument("--enforce-bounds", action="store_true",
                   help="fail the verdict when recovery exceeds its bound")
    p.add_argument("--resummarize", metavar="DIR",
                   help="run nothing: judge the finished campaign in DIR again from its "
                        "faults.jsonl and jobs.jsonl under this tool's bounds, and rewrite its "
                        "summary.json, summary.txt and results.md")
    p.add_argument("--max-minutes", type=float,
                   help="stop starting jobs after this many minutes (the summary says so)")
    p.add_argument("--tmpfs-mb", type=int, default=16,
                   help="size of the journal's tmpfs for journal_full, and of the checkpoints' "
                        "for checkpoint_full (default 16)")
    p.add_argument("--keep", action="store_true", help="keep every job's checkpoints")
    p.add_argument("--nice", type=int, default=0, help="add this to the tool's niceness "
                   "(its processes inherit it)")
    args = p.parse_args(argv)
    if args.faults < 0 or args.faults_per_job < 1 or args.updates < 20 or args.workers < 1 \
            or args.spares < 0 or args.checkpoint_every < 1 \
            or not 1 <= (args.min_workers or args.workers) <= args.workers:
        p.error("--faults ≥ 0, --faults-per-job ≥ 1, --updates ≥ 20, --workers ≥ 1, "
                "--spares ≥ 0, --checkpoint-every ≥ 1, 1 ≤ --min-workers ≤ --workers")
    try:
        lo, hi = (float(x) for x in args.gap.split(","))
        if not 0 <= lo <= hi:
            raise ValueError
        args.gap = (lo, hi)
    except ValueError:
        p.error(f"--gap must be MIN,MAX seconds with 0 ≤ MIN ≤ MAX, got {args.gap!r}")
    if args.kinds == "all":
        args.kinds = [k for k in KINDS if k != "partition" or args.netns]
    else:
        args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
        unknown = [k for k in args.kinds if k not in KINDS]
        if unknown:
            p.error(f"unknown fault kinds {unknown}; known: {', '.join(KINDS)}")
        if "partition" in args.kinds and not args.netns:
            p.error("partition needs --netns (a link to take down)")
    return args


# ---------------------------------------------------------------------------------------
# Preflight

def runtime_missing():
    """Why the tool cannot run at all here (a sentence), or None."""
    for module in ("grpc", "google.protobuf", "numpy"):
        try:
            __import__(module)
        except ImportError as e:
            return (f"{e}: run with Debian's /usr/bin/python3 with python3-grpcio, "
                    "python3-protobuf and python3-numpy")
    try:
        importlib.import_module("trainstep")
    except ImportError as e:
        return f"the Python client does not import ({e}): build first (make build)"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is missing"
    return None


def build_fsync_shim(out_dir):
    """Compiles fsync_fault.c into out_dir; returns (path, None) or (None, why not)."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None, "no C compiler (cc) to build the fsync shim"
    so = os.path.join(out_dir, "fsync_fault.so")
    r = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", so,
                        os.path.join(HERE, "fsync_fault.c"), "-ldl"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None, f"building the fsync shim failed: {r.stderr.strip()[:300]}"
    return so, None


def kinds_available(args, out_dir):
    """(kinds that can run, {kind: why not}, fsync shim path)."""
    skipped = {}
    shim = None
    for kind in DEVICE_FAULTS:
        if kind in args.kinds and os.geteuid() != 0:
            skipped[kind] = "needs root to mount a tmpfs"
    if "fsync_fail" in args.kinds:
        shim, why = build_fsync_shim(out_dir)
        if why:
            skipped["fsync_fail"] = why
    if "worker_retire" in args.kinds and args.spares < 1 and not shrinks(args):
        skipped["worker_retire"] = "needs a spare (--spares ≥ 1) or --min-workers below W"
    if "checkpoint_kill" in args.kinds and not sys.platform.startswith("linux"):
        skipped["checkpoint_kill"] = "needs inotify (Linux)"
    return [k for k in args.kinds if k not in skipped], skipped, shim


def sweep_stale_mounts():
    """Unmounts journal tmpfs left by chaos runs whose process is gone."""
    try:
        with open("/proc/mounts") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return
    for fields in mounts:
        if len(fields) > 1 and fields[0].startswith("trainstep-chaos-"):
            pid = fields[0].rsplit("-", 1)[-1]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                subprocess.run(["umount", fields[1]], capture_output=True)
                log(f"unmounted a stale journal tmpfs at {fields[1]}")


# ---------------------------------------------------------------------------------------
# The job

def write_corpus(path, seed):
    """A deterministic text of ~48 KiB for --model tiny_gpt: words drawn from a small
    vocabulary, so a tiny model has something to learn."""
    rng = random.Random(seed)
    words = ("the", "optimizer", "step", "window", "commit", "rank", "gradient", "loss",
             "scale", "update", "checkpoint", "journal", "lease", "worker", "coordinator")
    text = []
    size = 0
    while size < 48 * 1024:
        w = rng.choice(words)
        text.append(w)
        size += len(w) + 1
    with open(path, "w") as f:
        f.write(" ".join(text))


# What the coordinator logs when its journal cannot be written and it holds its decisions.
HELD_LINE = "the journal cannot be written; every decision is held"


def log_says(proc, text):
    """Whether `proc`'s log holds `text`."""
    try:
        with open(proc.log_path, errors="replace") as f:
            return text in f.read()
    except OSError:
        return False


def shrinks(args):
    """Whether the job's workers.min lets it train on at a smaller world size."""
    return args.min_workers is not None and args.min_workers < args.workers


def make_spec(args, ckpt_dir, data_dir):
    spec = {
        "name": "chaos",
        "seed": args.job_seed,
        "batch": {"micro_batch_size": 8, "accumulation_steps": 2},
        "optimizer": {"sgd": {"lr": 0.01, "momentum": 0.9}},
        "stop": {"max_updates": args.updates},
        "checkpoint": {"dir": ckpt_dir, "every_updates": args.checkpoint_every,
                       "keep_last": 3},
        "workers": {"count": args.workers},
    }
    if shrinks(args):
        spec["workers"]["min"] = args.min_workers
    if "grad_flip" in args.kinds:
        # Non-finite windows are re-run and attributed; flips never drain a worker here (the
        # campaign judges attribution, not the drain).
        spec["validate"] = {"rerun_on": ["nonfinite"], "max_suspect": 1000}
    if args.model == "mlp":
        spec["model"] = {"mlp": {"hidden": 64}}
        spec["data"] = {"synthetic_regression": {"samples": 2048, "in_features": 16},
                        "shuffle": True}
    else:
        corpus = os.path.join(data_dir, "corpus.txt")
        if not os.path.exists(corpus):
            write_corpus(corpus, args.job_seed)
        spec["model"] = {"tiny_gpt": {"n_layer": 1, "n_head": 2, "d_model": 32,
                                      "seq_len": 32}}
        spec["data"] = {"text": {"paths": [corpus], "seq_len": 32}, "shuffle": True}
        spec["optimizer"] = {"sgd": {"lr": 0.05, "momentum": 0.9}}
    return spec


def spec_checkpoint_dir(cluster):
    """The running job's checkpoint.dir (on the checkpoint device with checkpoint_full)."""
    from chaos_cluster import checkpoint_dir
    return checkpoint_dir(cluster.dir) if cluster.checkpoint_device else \
        os.path.join(cluster.dir, "ckpt")


def final_checkpoint(ckpt_dir, updates):
    """The ckpt-N directory holding update `updates` (the highest such N), or None."""
    best = None
    try:
        names = os.listdir(ckpt_dir)
    except OSError:
        return None
    for name in names:
        if not name.startswith("ckpt-") or not name[5:].isdigit():
            continue
        try:
            with open(os.path.join(ckpt_dir, name, "meta.json")) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            continue
        if int(meta.get("optimizer_update_id", -1)) == updates:
            n = int(name[5:])
            if best is None or n > best[0]:
                best = (n, os.path.join(ckpt_dir, name))
    return best[1] if best else None


def job_progress(cluster):
    """(state, progress dict with ints) or (None, None) when the coordinator does not
    answer (it is restarting)."""
    try:
        job = cluster.client().get(cluster.job_id)
    except Exception:  # noqa: BLE001 - any failure here means "not now"
        return None, None
    progress = {}
    for k, v in job.get("progress", {}).items():
        try:
            progress[k] = int(v)
        except (TypeError, ValueError):
            progress[k] = v
    return job.get("state"), progress


ENDED = ("SUCCEEDED", "FAILED", "CANCELLED")


class Campaign:
    def __init__(self, args, out_dir, kinds, skipped, shim, topology):
        self.args = args
        self.out = out_dir
        self.kinds = kinds
        self.skipped = skipped
        self.shim = shim
        self.topology = topology
        self.rng = random.Random(args.seed)
        self.bin_dir = args.bin
        self.lease_s = (args.lease_ms or 10000) / 1000.0
        self.jobs = []
        self.faults = []
        self.reference = None
        self.started = time.time()
        self.stopped_early = None

    # Plan -------------------------------------------------------------------------------
    def plan(self):
        """Fault kinds in injection order: every kind equally often, shuffled per round."""
        order = []
        while len(order) < self.args.faults and self.kinds:
            block = list(self.kinds)
            self.rng.shuffle(block)
            order += block
        return order[:self.args.faults]

    # Reference --------------------------------------------------------------------------
    def run_reference(self):
        """The same spec without faults, without spares, on loopback; cached by spec."""
        from chaos_cluster import Cluster
        import judge
        ref_dir = os.path.join(self.out, "reference")
        spec = make_spec(self.args, os.path.join(ref_dir, "ckpt"), self.out)
        key = hashlib.sha256(json.dumps({k: v for k, v in spec.items() if k != "checkpoint"},
                                        sort_keys=True).encode()).hexdigest()[:16]
        cached = os.path.join(ref_dir, f"model-{key}.safetensors")
        if os.path.exists(cached):
            self.reference = judge.read_safetensors(cached)
            log(f"fault-free reference from {cached}")
            return
        shutil.rmtree(os.path.join(ref_dir, "ckpt"), ignore_errors=True)
        os.makedirs(os.path.join(ref_dir, "ckpt"), exist_ok=True)
        log(f"fault-free reference run: {self.args.updates} updates, W={self.args.workers}")
        cluster = Cluster(self.bin_dir, os.path.join(ref_dir, "run"), lease_ms=self.args.lease_ms,
                          say=log)
        try:
            cluster.start()
            cluster.submit(spec)
            for _ in range(self.args.workers):
                cluster.add_slot()
            deadline = time.monotonic() + 120 + self.args.updates * 0.5
            state = None
            while time.monotonic() < deadline:
                state, _ = job_progress(cluster)
                if state in ENDED:
                    break
                time.sleep(0.2)
            if state != "SUCCEEDED":
                raise RuntimeError(f"the fault-free reference job ended {state}; see "
                                   f"{ref_dir}/run/logs")
            cluster.job_over.set()
        finally:
            cluster.close()
        path = final_checkpoint(os.path.join(ref_dir, "ckpt"), self.args.updates)
        if path is None:
            raise RuntimeError(f"the reference run left no checkpoint of update "
                               f"{self.args.updates} in {ref_dir}/ckpt")
        shutil.copyfile(os.path.join(path, "model.safetensors"), cached)
        self.reference = judge.read_safetensors(cached)
        shutil.rmtree(os.path.join(ref_dir, "ckpt"), ignore_errors=True)

    # Campaign ---------------------------------------------------------------------------
    def run(self):
        self.run_reference()
        queue = self.plan()
        total = len(queue)
        index = 0
        if total == 0:
            self.run_job(0, queue, total)
        max_jobs = max(1, total * 3)
        while queue and index < max_jobs:
            if self.args.max_minutes and time.time() - self.started > self.args.max_minutes * 60:
                self.stopped_early = (f"--max-minutes {self.args.max_minutes:g} reached with "
                                      f"{len(queue)} faults not injected")
                log(self.stopped_early)
                break
            before = len(queue)
            self.run_job(index, queue, total)
            index += 1
            if len(queue) == before and index >= 3 and not any(
                    j["faults"] for j in self.jobs[-3:]):
                self.stopped_early = "three jobs in a row took no fault; giving up"
                log(self.stopped_early)
                break
        return self.summarize()

    def run_job(self, index, queue, total):
        from chaos_cluster import Cluster, checkpoint_dir
        args = self.args
        job_dir = os.path.join(self.out, "jobs", f"{index:03d}")
        on_device = "checkpoint_full" in self.kinds
        # The judge reads the final checkpoint from job_dir/ckpt: a copy of the device's.
        ckpt_dir = checkpoint_dir(job_dir) if on_device else os.path.join(job_dir, "ckpt")
        os.makedirs(os.path.join(job_dir, "ckpt"), exist_ok=True)
        spec = make_spec(args, ckpt_dir, self.out)
        cluster = Cluster(self.bin_dir, job_dir, lease_ms=args.lease_ms, topology=self.topology,
                          state_tmpfs_mb=args.tmpfs_mb if "journal_full" in self.kinds else 0,
                          checkpoint_tmpfs_mb=args.tmpfs_mb if on_device else 0,
                          fsync_shim=self.shim,
                          restart_delay_s=args.restart_delay, say=log,
                          flip_files="grad_flip" in self.kinds,
                          hold_files="hang" in self.kinds)
        faults = []
        result = {"job": index, "dir": job_dir, "faults": 0, "problems": []}
        t_start = time.time()
        records, p = [], None
        try:
            cluster.start()
            cluster.submit(spec)
            for _ in range(args.workers + args.spares):
                cluster.add_slot()
            first = self._wait(
                lambda: (job_progress(cluster)[1] or {}).get("optimizer_update_id", 0) > 0, 120)
            if not first:
                result["problems"].append("no first commit within 120 s")
            budget = 120 + args.updates * 0.25
            while first and queue and len(faults) < args.faults_per_job:
                time.sleep(self.rng.uniform(*args.gap))
                state, p = job_progress(cluster)
                if state in ENDED:
                    break
                if p is None:
                    continue
                if p.get("optimizer_update_id", 0) > args.updates - max(
                        10, args.checkpoint_every // 2):
                    break  # too close to the end for a fault to show its recovery
                kind = queue[0]
                fault = self.inject(kind, cluster, len(self.faults) + len(faults) + 1, total)
                if fault is None:
                    # Not possible now (no victim, no spare, no checkpoint came): try another
                    # kind first, this one later.
                    queue.append(queue.pop(0))
                    continue
                queue.pop(0)
                fault["job"] = index
                faults.append(fault)
                budget += self.lease_s * 3 + 30
                if fault.get("observed_recovery") is None and \
                        job_progress(cluster)[0] not in ENDED:
                    # No commit within the wait: a stall. No more faults here, so that none
                    # can unstick it; the job must now end on its own within its budget.
                    fault["stalled"] = True
                    log(f"job {index}: no commit since fault {fault['number']}; no more "
                        "faults in this job")
                    break
            deadline = time.monotonic() + budget
            if faults and faults[-1].get("stalled"):
                # Past Gloo's default 120 s collective timeout, which can unstick a rank
                # waiting for a paused peer, a stall will not end by itself.
                deadline = min(deadline, time.monotonic() + 150)
            state = None
            while time.monotonic() < deadline:
                state, p = job_progress(cluster)
                if state in ENDED:
                    break
                time.sleep(0.2)
            result["state"] = state
            cluster.job_over.set()
            try:
                records = list(cluster.client().logs(cluster.job_id))
            except Exception as e:  # noqa: BLE001
                result["problems"].append(f"could not read the per-update log: {e}")
            result["progress"] = p
            from chaos_cluster import copy_tree
            if cluster.journal_device:
                copy_tree(cluster.state_dir, os.path.join(job_dir, "state"))
            if cluster.checkpoint_device:
                copy_tree(ckpt_dir, os.path.join(job_dir, "ckpt"))
        except Exception as e:  # noqa: BLE001 - one broken job must not end the campaign
            import traceback
            traceback.print_exc()
            result["problems"].append(f"harness error: {e!r}")
        finally:
            cluster.close()
        result["seconds"] = time.time() - t_start
        with open(os.path.join(job_dir, "updates.jsonl"), "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        self.judge_job(cluster, spec, records, faults, result)
        self.jobs.append(result)
        self.faults += faults
        with open(os.path.join(self.out, "jobs.jsonl"), "a") as f:
            f.write(json.dumps(result, default=str) + "\n")
        with open(os.path.join(self.out, "faults.jsonl"), "a") as f:
            for fault in faults:
                f.write(json.dumps(fault, default=str) + "\n")
        self.summarize(quiet=True)  # a long campaign's progress survives an interruption
        verdict = "PASS" if result["pass"] else "FAIL: " + "; ".join(result["problems"])
        log(f"job {index}: {result.get('state')} after {result['seconds']:.0f} s, "
            f"{len(faults)} faults, {result['rollbacks']} rollbacks, weights rel diff "
            f"{result.get('max_rel_diff')}: {verdict}")
        if result["pass"] and not args.keep:
            shutil.rmtree(os.path.join(job_dir, "ckpt"), ignore_errors=True)

    @staticmethod
    def _wait(predicate, timeout, interval=0.1):
        from chaos_cluster import wait_until
        return wait_until(predicate, timeout, interval)

    # Faults -----------------------------------------------------------------------------
    @staticmethod
    def _spare_registered(cluster):
        states = cluster.workers_by_state()
        return bool(states.get("READY") or states.get("REGISTERED"))

    def _victim(self, cluster):
        active = cluster.workers_by_state().get("ACTIVE", [])
        return self.rng.choice(active) if active else None

    def _await_recovery(self, cluster, g0, c0, rank_fault, timeout, also=None):
        """Polls until the job committed past the fault (a newer generation for a lost rank);
        returns the time seen, or None. `also` runs each round (a scheduled heal). c0 None:
        past the count first read now (a restarted coordinator may show commits that its
        predecessor journaled after we last looked)."""
        give_up = time.monotonic() + timeout
        new_generation = None  # the commit count when a newer generation was first seen
        while time.monotonic() < give_up:
            if also:
                also()
            state, p = job_progress(cluster)
            if state in ENDED:
                return None
            if p and c0 is None:
                c0 = p.get("windows_committed", 0)
                continue
            if p and rank_fault:
                # Commits counted before the new generation formed may be windows that were
                # already under way at the injection: only one after it shows recovery.
                if new_generation is None and p.get("generation", 0) > g0:
                    new_generation = p.get("windows_committed", 0)
                if new_generation is not None and p.get("windows_committed", 0) > new_generation:
                    return time.time()
            elif p and p.get("windows_committed", 0) > c0:
                return time.time()
            time.sleep(0.1)
        return None

    def inject(self, kind, cluster, number, total):
        """Injects one fault of `kind`, heals it, waits for the job to commit past it.
        Returns the fault's record, or None when it could not be injected now."""
        spare_wait = None
        if kind in SPARE_FAULTS and (self.args.spares > 0 or shrinks(self.args)):
            # The previous fault's replacement process may still be starting: without a
            # registered spare the recovery would time LibTorch's start, not trainstep's.
            # Without spares, a job that shrinks is hurt only once it grew back whole (a rank
            # lost while the newcomers receive the state may rightly roll back).
            t0 = time.monotonic()
            ready = (lambda: self._spare_registered(cluster)) if self.args.spares > 0 else \
                (lambda: len(cluster.workers_by_state().get("ACTIVE", [])) >= self.args.workers)
            if not self._wait(ready, 30 if self.args.spares > 0 else 60, interval=0.05):
                return None
            spare_wait = time.monotonic() - t0
        state, p0 = job_progress(cluster)
        if p0 is None or state != "RUNNING":
            return None
        g0, c0 = p0.get("generation", 0), p0.get("windows_committed", 0)
        fault = {"kind": kind, "number": number, "generation_before": g0,
                 "update_before": p0.get("optimizer_update_id", 0), "spare_wait_s": spare_wait}
        timeout = max(60.0, self.lease_s * 4 + 30)
        fault["wait_s"] = timeout
        import judge
        rank_fault = kind in judge.RANK_FAULTS  # the judge's rule, so both count alike
        if kind == "grad_flip":
            victim = self._victim(cluster)
            worker_id = cluster.worker_id(victim) if victim is not None else None
            if worker_id is None:
                return None
            transient_before = p0.get("reruns_transient", 0)
            t = cluster.arm_flip(victim)
            fault.update(inject=t, ref=t, victim=victim.name, victim_worker_id=worker_id)
            # Its window starts once the one in flight ends. Wait until the worker took it and
            # the window's re-run was decided, so that the next fault's window and record come
            # after this one's (the judge attributes each flip to the first transient re-run
            # after it).
            if not self._wait(lambda: not cluster.flip_armed(victim), timeout, interval=0.02):
                fault["note"] = "the flip was not taken: the victim ran no window after it"
            elif not self._wait(lambda: (job_progress(cluster)[1] or {}).get(
                    "reruns_transient", 0) > transient_before, timeout, interval=0.05):
                fault["note"] = "no transient re-run was counted after the flip"
        elif kind == "worker_kill" or kind == "worker_retire":
            if kind == "worker_retire" and not (self._spare_registered(cluster)
                                                or shrinks(self.args)):
                return None  # only while a spare is registered, or the job may shrink
            victim = self._victim(cluster)
            if victim is None:
                return None
            if kind == "worker_retire":
                cluster.slots[victim.slot].retired = True
            t = victim.signal(signal.SIGKILL)
            if t is None:
                return None
            fault.update(inject=t, ref=t, victim=victim.name, pid=victim.pid)
        elif kind == "hang":
            victim = self._victim(cluster)
            if victim is None:
                return None
            t = cluster.hold(victim)
            fault.update(inject=t, ref=t, victim=victim.name, pid=victim.pid)
            # Held until the job committed without it: a job that waits for it never does.
            seen = self._await_recovery(cluster, g0, c0, True, timeout)
            fault["heal"] = cluster.release(victim)
            fault["observed_recovery"] = seen
            self._report(fault, total)
            return fault
        elif kind == "all_ranks_kill":
            active = cluster.workers_by_state().get("ACTIVE", [])
            if len(active) < self.args.workers:
                return None
            times = [p.signal(signal.SIGKILL) for p in active]
            times = [t for t in times if t is not None]
            if not times:
                return None
            fault.update(inject=min(times), ref=min(times),
                         victim="+".join(p.name for p in active))
        elif kind == "worker_stop" or kind == "partition":
            victim = self._victim(cluster)
            if victim is None:
                return None
            hold = self.lease_s + self.rng.uniform(1.0, 3.0)
            if kind == "worker_stop":
                t = victim.signal(signal.SIGSTOP)
                if t is None:
                    return None
            else:
                t = cluster.partition(victim)
            healed = []

            def heal_when_due():
                if not healed and time.time() >= t + hold:
                    healed.append(victim.signal(signal.SIGCONT) if kind == "worker_stop"
                                  else cluster.heal_partition(victim))
            fault.update(inject=t, ref=t, victim=victim.name, pid=victim.pid, hold=hold)
            seen = self._await_recovery(cluster, g0, c0, True, timeout, also=heal_when_due)
            while not healed:
                heal_when_due()
                time.sleep(0.05)
            fault["heal"] = healed[0]
            fault["observed_recovery"] = seen
            self._report(fault, total)
            return fault
        elif kind == "checkpoint_kill":
            from chaos_cluster import CheckpointSniper
            late = self.args.updates - 2 * self.args.checkpoint_every
            if p0.get("optimizer_update_id", 0) > late:
                return None
            sniper = CheckpointSniper(spec_checkpoint_dir(cluster))
            try:
                shot = sniper.wait_and_kill(
                    lambda: {q.pid for q in cluster.worker_procs() if q.running()},
                    timeout=30 + self.args.checkpoint_every * 0.5)
            finally:
                sniper.close()
            if shot is None:
                return None
            t, pid, ckpt_id, mid_write = shot
            victim = next((q for q in cluster.worker_procs() if q.pid == pid), None)
            if victim is not None:
                victim.signals.append((t, "SIGKILL"))
            fault.update(inject=t, ref=t, victim=victim.name if victim else None, pid=pid,
                         checkpoint_id=ckpt_id, mid_write=mid_write)
        elif kind == "coordinator_kill":
            t, killed = cluster.kill_coordinator()
            if t is None:
                return None
            fault.update(inject=t, victim=killed.name)
            fault["ref"] = self._serving_since(cluster, killed, t, fault)
        elif kind == "restart_gap_kill":
            victim = self._victim(cluster)  # chosen while the coordinator can say who is a rank
            if victim is None:
                return None
            # The rank dies up to 0.5 s before the coordinator, or up to 0.3 s after its
            # successor listens: either way the new coordinator learns of the loss before it
            # has heard from every survivor.
            offset = self.rng.uniform(-0.5, 0.3)
            t_worker = None
            if offset < 0:
                t_worker = victim.signal(signal.SIGKILL)
                time.sleep(-offset)
            t, killed = cluster.kill_coordinator()
            if t is None:
                return None
            fault["ref"] = self._serving_since(cluster, killed, t, fault)
            if offset >= 0:
                if fault["ref"] is not None:
                    time.sleep(offset)
                t_worker = victim.signal(signal.SIGKILL)
            fault.update(inject=min(t, t_worker or t), victim=f"{killed.name}+{victim.name}",
                         pid=victim.pid, worker_kill=t_worker, offset_s=offset)
        elif kind in ("journal_full", "fsync_fail"):
            c = cluster.coordinator()
            t = time.time()
            if kind == "journal_full":
                fault["filler_bytes"] = cluster.fill_journal_device()
            else:
                cluster.fail_fsync()
            # The coordinator holds its decisions (its log says so) and keeps running.
            held = self._wait(lambda: c.end is not None or log_says(c, HELD_LINE), 15,
                              interval=0.02)
            stopped = c.end is not None
            fault["coordinator_exit"] = c.end
            fault["coordinator_rc"] = c.rc
            if not held:
                fault["note"] = "the coordinator did not notice the failing journal in 15 s"
            time.sleep(self.rng.uniform(0.3, 1.5))  # its attempts to resume fail meanwhile
            heal = time.time()
            if kind == "journal_full":
                cluster.heal_journal_device()
            else:
                cluster.heal_fsync()
            fault.update(inject=t, heal=heal, victim=c.name)
            fault["ref"] = self._serving_since(cluster, c if stopped else None, heal, fault)
        elif kind == "coordinator_stop":
            # A pause of the whole process (a VM frozen or migrated, a debugger, swapping),
            # sometimes longer than the lease: the coordinator must not expire everyone when it
            # runs again, and the workers must wait for it rather than give up.
            hold = self.rng.uniform(1.0, self.lease_s + 3.0)
            t, c = cluster.stop_coordinator()
            if t is None:
                return None
            time.sleep(hold)
            heal = c.signal(signal.SIGCONT)
            fault.update(inject=t, heal=heal, hold=hold, victim=c.name)
            fault["ref"] = self._serving_since(cluster, None, heal or time.time(), fault)
        elif kind == "checkpoint_full":
            def progress_field(field, default):
                return (job_progress(cluster)[1] or {}).get(field, default)
            failures = p0.get("checkpoint_failures", 0)
            t = time.time()
            fault["filler_bytes"] = cluster.checkpoint_device.fill()
            # Training goes on; the next checkpoint's write fails and is reported.
            reported = self._wait(lambda: progress_field("checkpoint_failures", 0) > failures,
                                  timeout, interval=0.05)
            fault["failure_reported"] = bool(reported)
            if not reported:
                fault["note"] = "no checkpoint failure was reported while the disk was full"
            durable = progress_field("durable_checkpoint_id", -1)
            time.sleep(self.rng.uniform(0.3, 1.5))
            heal = time.time()
            cluster.checkpoint_device.heal()
            # A checkpoint written after the heal is durable again.
            if self._wait(lambda: progress_field("durable_checkpoint_id", -1) > durable,
                          timeout, interval=0.05):
                fault["durable_after_heal_s"] = time.time() - heal
            fault.update(inject=t, ref=t, heal=heal, victim="checkpoint device")
        elif kind == "checkpoint_corrupt":
            # Every rank dies with the checkpoint they must roll back to damaged on disk: the
            # load finds it (meta.json's digests) and the job rolls back past it.
            durable = p0.get("durable_checkpoint_id", -1)
            active = cluster.workers_by_state().get("ACTIVE", [])
            path = os.path.join(spec_checkpoint_dir(cluster), f"ckpt-{durable}",
                                "model.safetensors")
            if durable <= 0 or len(active) < self.args.workers or not os.path.exists(path):
                return None
            size = os.path.getsize(path)
            offset = self.rng.randrange(size)
            with open(path, "r+b") as fh:
                fh.seek(offset)
                byte = fh.read(1)
                fh.seek(offset)
                fh.write(bytes([byte[0] ^ 0x10]))
            times = [t for t in (q.signal(signal.SIGKILL) for q in active) if t is not None]
            if not times:
                return None
            fault.update(inject=min(times), ref=min(times), damaged_checkpoint_id=durable,
                         offset=offset, victim="+".join(q.name for q in active))
        else:
            raise ValueError(kind)
        fault["observed_recovery"] = self._await_recovery(
            cluster, g0, None if kind in COORDINATOR_FAULTS + ("restart_gap_kill",) else c0,
            rank_fault, timeout)
        if kind == "worker_retire":
            cluster.add_slot()  # the cluster gets a new spare, as an autoscaler would
        self._report(fault, total)
        return fault

    def _serving_since(self, cluster, gone, since, fault, timeout=60):
        """When a coordinator other than `gone` served, no earlier than `since` (recorded in
        `fault` so that the judge can redo it with the coordinator's own log time)."""
        def f():
            c = cluster.coordinator()
            if c is None or c is gone or c.listen is None or not c.running():
                return None
            return c
        c = self._wait(f, timeout, interval=0.02)
        if c is None:
            return None
        fault["serving"] = c.name
        fault["since"] = since
        return max(c.listen, since)

    def _report(self, fault, total):
        seen = fault.get("observed_recovery")
        ref = fault.get("ref") or fault.get("inject")
        extra = ""
        if fault["kind"] == "checkpoint_kill":
            when = "mid-write" if fault.get("mid_write") else "after its write"
            extra = f" ckpt {fault.get('checkpoint_id')} {when}"
        since = ("the coordinator listened" if fault["kind"] in ("coordinator_kill",
                                                                 "restart_gap_kill")
                 else "the heal" if fault["kind"] in COORDINATOR_FAULTS else "injection")
        outcome = (f"committing again ~{seen - ref:.2f} s after {since}" if seen and ref
                   else "no commit seen after it")
        log(f"fault {fault['number']}/{total} {fault['kind']} {fault.get('victim') or ''}"
            f"{extra}: {outcome}")

    # Judgement --------------------------------------------------------------------------
    def judge_job(self, cluster, spec, records, faults, result):
        import judge
        problems = result["problems"]
        if result.get("state") != "SUCCEEDED":
            problems.append(f"job ended {result.get('state')} (expected SUCCEEDED)")
        # Weights.
        path = final_checkpoint(os.path.join(result["dir"], "ckpt"), self.args.updates)
        if path is None:
            problems.append(f"no checkpoint of update {self.args.updates}")
            result["max_rel_diff"] = None
        else:
            try:
                cmp = judge.compare_tensors(
                    judge.read_safetensors(os.path.join(path, "model.safetensors")),
                    self.reference)
            except (OSError, ValueError, KeyError) as e:
                cmp = {"max_rel_diff": float("inf"), "problem": str(e)}
            result["max_rel_diff"] = cmp["max_rel_diff"]
            result["final_checkpoint"] = path
            if cmp.get("problem"):
                problems.append(cmp["problem"])
            if not cmp["max_rel_diff"] <= self.args.tolerance:
                problems.append(f"final weights differ from the fault-free run by "
                                f"{cmp['max_rel_diff']:.3g} relative ({cmp.get('worst_tensor')})")
        # Generations and rollbacks, from every coordinator incarnation's log.
        per_incarnation = []
        detections = []
        coordinator_lines = []
        for c in cluster.coordinators:
            with open(c.log_path, errors="replace") as f:
                lines = f.read().splitlines()
            coordinator_lines += lines
            per_incarnation.append(judge.generations_from_coordinator_log(lines, cluster.job_id))
            detections += judge.coordinator_detections(lines, cluster.job_id)
            listened = judge.listening_time(lines)
            if listened is not None:
                c.listen = listened  # the coordinator's own clock beats our port-file poll
        generations = judge.merge_generations(per_incarnation)
        ids = judge.check_update_ids(records, generations)
        result["commits"] = ids["commits"]
        result["final_update"] = ids["final_update"]
        result["doubled"] = ids["doubled"]
        result["lost"] = ids["lost"]
        result["redone"] = ids["redone"]
        if ids["doubled"]:
            problems.append(f"{len(ids['doubled'])} updates committed twice without a rollback: "
                            f"{ids['doubled'][:3]}")
        if ids["lost"]:
            problems.append(f"updates lost: {ids['lost'][:3]}")
        if records and ids["final_update"] != self.args.updates:
            problems.append(f"the log ends at update {ids['final_update']}, not "
                            f"{self.args.updates}")
        procs = []
        for p in cluster.worker_procs():
            d = p.as_dict()
            with open(p.log_path, errors="replace") as f:
                lines = f.read().splitlines()
            d["generations"] = judge.worker_generations(lines)
            d["registered"] = judge.worker_registered(lines)
            procs.append(d)
        judge.tighten_generation_times(generations, procs)
        # A peer's death must not kill a survivor (SIGPIPE from a collective's socket, say).
        collateral = [d for d in procs if d.get("rc") is not None and d["rc"] < 0
                      and not d.get("signals")]
        result["collateral_deaths"] = len(collateral)
        if collateral:
            problems.append(f"{len(collateral)} worker processes died of a signal nobody sent: "
                            + ", ".join(f"{d['name']} (signal {-d['rc']})"
                                        for d in collateral[:3]))
        rollbacks = judge.judge_rollbacks(records, generations, procs)
        result["rollbacks"] = len(rollbacks)
        result["rollback_details"] = rollbacks
        prog_rollbacks = (result.get("progress") or {}).get("rollbacks")
        if prog_rollbacks is not None:
            result["progress_rollbacks"] = prog_rollbacks
        unnecessary = [r for r in rollbacks if r["unnecessary"]]
        result["unnecessary_rollbacks"] = len(unnecessary)
        if unnecessary:
            problems.append(
                f"{len(unnecessary)} rollbacks while a replica holding the current update was "
                "running: " + ", ".join(
                    f"gen {r['generation']} back to ckpt {r['checkpoint_id']} from update "
                    f"{r['current_update']} (running: "
                    f"{[h['name'] for h in r['holders'] if h['state'] == 'running']})"
                    for r in unnecessary[:3]))
        # Recovery, and which fault each rollback followed. The coordinator's faults count
        # from when the serving incarnation listened by its own log (its "listening" line
        # comes before the port file we polled).
        listened = {c.name: c.listen for c in cluster.coordinators}
        for f in faults:
            if f.get("serving") in listened and listened[f["serving"]] is not None:
                f["ref"] = max(listened[f["serving"]], f["since"])
        for f in faults:
            problem = judge.storage_fault_problem(f, generations, coordinator_lines)
            if problem:
                problems.append(problem)
            if f["kind"] in ("journal_full", "fsync_fail") and f.get("coordinator_exit"):
                problems.append(f"fault {f['number']} ({f['kind']}): the coordinator exited "
                                f"(rc {f.get('coordinator_rc')}) instead of holding its "
                                "decisions until the journal could be written")
            if f["kind"] == "grad_flip":
                f["attributed_to"] = judge.flip_attribution(f, records)
                f["attributed"] = judge.flip_attributed(
                    f, victim_registrations(cluster.dir, f["victim"]))
                if not f["attributed"]:
                    problems.append(
                        f"fault {f['number']} (grad_flip on {f['victim_worker_id']}): the next "
                        f"re-run named {f['attributed_to'] or 'nobody'} as transient")
        for f in faults:
            f["recovery_s"] = judge.recovery(f, records)
            f["phases"] = judge.phases(f, records, generations, procs, detections)
            f["rollbacks"] = 0
            f["unnecessary_rollbacks"] = 0
        for r in rollbacks:
            before = [f for f in faults
                      if r["time"] is not None and f["inject"] <= r["time"]]
            if before:
                before[-1]["rollbacks"] += 1
                before[-1]["unnecessary_rollbacks"] += int(r["unnecessary"])
        last_commit = max((x["end_time_ms"] / 1000.0 for x in records
                           if x.get("outcome") == "commit"), default=0)
        for f in faults:
            if f.get("stalled"):
                problems.append(
                    f"fault {f['number']} ({f['kind']}) stalled the job: no commit within "
                    f"{f.get('wait_s', 60):.0f} s" + (f"; the next came {f['recovery_s']:.1f} s "
                                                      "after it" if f["recovery_s"] else ""))
            if f["recovery_s"] is None:
                if f.get("stalled"):
                    f["note"] = (f.get("note", "") + " no commit after it: stalled; the job "
                                 f"ended {result.get('state')}").strip()
                elif f.get("ref") and f["ref"] > last_commit and result.get("state") in ENDED:
                    f["note"] = (f.get("note", "") +
                                 " no commit after it: the job had ended").strip()
                else:
                    problems.append(f"fault {f['number']} ({f['kind']}): no recovery found in "
                                    "the log")
        result["faults"] = len(faults)
        result["pass"] = not problems
        with open(os.path.join(result["dir"], "processes.json"), "w") as fh:
            json.dump({"coordinators": [c.as_dict() for c in cluster.coordinators],
                       "workers": procs, "generations": generations}, fh, indent=1, default=str)

    # Summary ----------------------------------------------------------------------------
    def summarize(self, quiet=False):
        """Writes summary.json, summary.txt and results.md from every job so far; prints the
        table unless `quiet`."""
        per_kind, failures, bounds_failed = judge_campaign(
            self.faults, self.jobs, self.kinds if self.args.faults else [], self.lease_s,
            self.args.enforce_bounds)
        diffs = [j["max_rel_diff"] for j in self.jobs if j.get("max_rel_diff") is not None]
        summary = {
            "seed": self.args.seed, "faults_requested": self.args.faults,
            "faults_injected": len(self.faults), "jobs": len(self.jobs),
            "jobs_succeeded": sum(1 for j in self.jobs if j.get("state") == "SUCCEEDED"),
            "jobs_passed": sum(1 for j in self.jobs if j["pass"]),
            "lost_updates": sum(len(j.get("lost", [])) for j in self.jobs),
            "doubled_updates": sum(len(j.get("doubled", [])) for j in self.jobs),
            "stalls": sum(1 for f in self.faults if f.get("stalled")),
            "rollbacks": sum(j.get("rollbacks", 0) for j in self.jobs),
            "unnecessary_rollbacks": sum(j.get("unnecessary_rollbacks", 0) for j in self.jobs),
            "redone_updates": sum(j.get("redone", 0) for j in self.jobs),
            "max_weight_rel_diff": max(diffs) if diffs else None,
            "lease_s": self.lease_s, "updates_per_job": self.args.updates,
            "workers": self.args.workers, "spares": self.args.spares, "model": self.args.model,
            "netns": bool(self.topology),
            "latency": (f"{self.topology.latency_ms:g} ms per link one way "
                        f"({self.topology.describe_mode()})") if self.topology else None,
            "kinds_skipped": self.skipped, "per_kind": per_kind,
            "bounds_exceeded": bounds_failed, "enforce_bounds": self.args.enforce_bounds,
            "failures": failures, "stopped_early": self.stopped_early,
            "minutes": (time.time() - self.started) / 60.0,
            "pass": not failures and bool(self.jobs),
            "goodput": campaign_goodput(self.jobs),
        }
        write_summary(self.out, summary, quiet)
        return summary


def judge_campaign(faults, jobs, kinds, lease_s, enforce_bounds):
    """Per-kind figures of `faults` (judge.phases in each), the campaign's failures and the
    kinds beyond their bounds. `kinds`: those requested, listed even when none was injected."""
    import judge
    per_kind = {}
    for kind in KINDS:
        fs = [f for f in faults if f["kind"] == kind]
        if not fs and kind not in kinds:
            continue
        rec = [f["recovery_s"] for f in fs if f.get("recovery_s") is not None]
        bound, phase = bound_of(kind, lease_s)
        ph = [f["phases"] for f in fs if f.get("phases")]
        # A recovery without the bounded phase recorded is held to its commit, which follows it.
        bounded = []
        for f in fs:
            if f.get("recovery_s") is not None:
                at = (f.get("phases") or {}).get(phase)
                bounded.append(f["recovery_s"] if at is None else at)
        per_kind[kind] = {
            "injected": len(fs), "recovered": len(rec),
            "p50_s": judge.percentile(rec, 50), "p90_s": judge.percentile(rec, 90),
            "max_s": max(rec) if rec else None,
            "stalls": sum(1 for f in fs if f.get("stalled")),
            "rollbacks": sum(f.get("rollbacks", 0) for f in fs),
            "unnecessary_rollbacks": sum(f.get("unnecessary_rollbacks", 0) for f in fs),
            "failed_jobs": len({f["job"] for f in fs if not jobs[f["job"]]["pass"]}),
            "bound_s": bound, "bound_phase": phase[:-2],
            "within_bound": bool(bounded) and len(bounded) == len(fs) and max(bounded) <= bound,
            "over_bound": sum(1 for x in bounded if x > bound),
            "over_1s": sum(1 for x in rec if x > 1.0),
        }
        waits = [f["spare_wait_s"] for f in fs if f.get("spare_wait_s") is not None]
        per_kind[kind]["spare_wait_max_s"] = max(waits) if waits else None
        if kind == "checkpoint_kill":
            per_kind[kind]["mid_write"] = sum(1 for f in fs if f.get("mid_write"))
        if kind == "grad_flip":
            per_kind[kind]["attributed"] = sum(1 for f in fs if f.get("attributed"))
        # Where the time went: p50 and max of each phase, in seconds from the fault's
        # reference time.
        per_kind[kind]["phases"] = {
            name: {"p50": judge.percentile(vals, 50), "max": max(vals) if vals else None,
                   "n": len(vals)}
            for name in PHASES
            for vals in [[x[name] for x in ph if x.get(name) is not None]]}
        per_kind[kind]["rebuilt_generations"] = sum(
            1 for x in ph if (x.get("generations") or 0) > 1)
        per_kind[kind]["restarted_ranks"] = sum(
            1 for x in ph if (x.get("restarted_ranks") or 0) > 0)
    failures = [f"job {j['job']}: {p}" for j in jobs for p in j["problems"]]
    bounds_failed = [k for k, v in per_kind.items() if v["injected"] and not v["within_bound"]]
    if enforce_bounds and bounds_failed:
        failures.append(f"recovery beyond the bounds for {bounds_failed}")
    return per_kind, failures, bounds_failed


def write_summary(out, summary, quiet=False):
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    table = render_table(summary)
    with open(os.path.join(out, "summary.txt"), "w") as f:
        f.write(table)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(render_markdown(summary))
    if not quiet:
        print(table, flush=True)


def victim_registrations(job_dir, victim):
    """The worker ids process `victim` of the job in `job_dir` registered as (its log)."""
    import judge
    try:
        with open(os.path.join(job_dir, "logs", f"worker-{victim}.log"), errors="replace") as fh:
            return judge.registered_worker_ids(fh)
    except OSError:
        return []


def rejudge_flips(out, faults, jobs):
    """Judges each grad_flip's attribution again from its victim's log, clearing a failure
    of a campaign judged before a process's later ids counted (a flip consumed after the
    process rejoined under a new id)."""
    import judge
    for f in faults:
        if f["kind"] != "grad_flip" or f.get("attributed"):
            continue
        job = jobs[f["job"]]
        if judge.flip_attributed(f, victim_registrations(
                os.path.join(out, "jobs", f"{f['job']:03d}"), f["victim"])):
            f["attributed"] = True
            stale = f"fault {f['number']} (grad_flip"
            job["problems"] = [p for p in job["problems"] if not p.startswith(stale)]
            job["pass"] = not job["problems"]


def resummarize(out, enforce_bounds):
    """Judges a finished campaign in `out` again from its faults.jsonl and jobs.jsonl (the
    measurements unchanged) under this tool's bounds; rewrites its summary files."""
    def load(name):
        with open(os.path.join(out, name)) as fh:
            return [json.loads(line) for line in fh if line.strip()]
    with open(os.path.join(out, "summary.json")) as fh:
        summary = json.load(fh)
    jobs = sorted(load("jobs.jsonl"), key=lambda j: j["job"])
    if [j["job"] for j in jobs] != list(range(len(jobs))):
        raise ValueError(f"{out}/jobs.jsonl: job numbers are not 0..{len(jobs) - 1}")
    enforce = enforce_bounds or summary.get("enforce_bounds", False)
    faults = load("faults.jsonl")
    rejudge_flips(out, faults, jobs)
    per_kind, failures, bounds_failed = judge_campaign(
        faults, jobs, list(summary["per_kind"]), summary["lease_s"], enforce)
    summary.update({"per_kind": per_kind, "failures": failures, "bounds_exceeded": bounds_failed,
                    "jobs_passed": sum(1 for j in jobs if j["pass"]),
                    "enforce_bounds": enforce, "pass": not failures and bool(jobs)})
    write_summary(out, summary)
    return summary


PHASES = ("detect_s", "formed_s", "assigned_s", "started_s", "window_s", "commit_s")


def _fmt(v, digits=2):
    return "-" if v is None else f"{v:.{digits}f}"


def _fmt_diff(v):
    return "-" if v is None else format(v, ".2g")


def _bound_text(v):
    phase = v.get("bound_phase", "commit")
    return f"{v['bound_s']:g}" + ("" if phase == "commit" else f" ({phase})")


GOODPUT_CAUSES = ("reform", "rollback", "skipped", "storage")


def goodput_line(g):
    if not g or g.get("ratio") is None:
        return "  goodput: none reported"
    lost = ", ".join(f"{c} {g['lost_seconds'][c]:.1f} s" for c in GOODPUT_CAUSES)
    return (f"  goodput {100 * g['ratio']:.2f}% of {g['wall_seconds']:.0f} s from each job's "
            f"first commit (worst job {100 * g['worst_job_ratio']:.2f}%); lost: {lost}")


def campaign_goodput(jobs):
    """The jobs' goodput (job get's, from their final progress) pooled: productive ÷ wall
    seconds over every job, the lost seconds by cause, and the worst job's ratio; None before
    any job reported one."""
    reports = [(j.get("progress") or {}).get("goodput") for j in jobs]
    reports = [g for g in reports if g and g.get("wall_seconds")]
    if not reports:
        return None
    wall = sum(g["wall_seconds"] for g in reports)
    productive = sum(g.get("productive_seconds", 0.0) for g in reports)
    return {"ratio": productive / wall if wall > 0 else None, "wall_seconds": wall,
            "lost_seconds": {c: sum(g.get(f"{c}_seconds", 0.0) for g in reports)
                             for c in GOODPUT_CAUSES},
            "worst_job_ratio": min(g.get("ratio", 0.0) for g in reports)}


def render_table(s):
    lines = [f"chaos campaign, seed {s['seed']}: {s['faults_injected']} faults over {s['jobs']} "
             f"jobs ({s['jobs_succeeded']} succeeded, {s['jobs_passed']} passed), "
             f"{s['minutes']:.1f} min",
             f"  lease {s['lease_s']:g} s, {s['updates_per_job']} updates/job, W={s['workers']} "
             f"+{s['spares']} spare, {s['model']}" +
             (f", netns: {s['latency']}" if s["netns"] else ", loopback"),
             f"  lost updates {s['lost_updates']}, doubled {s['doubled_updates']}, stalls "
             f"{s['stalls']}, rollbacks "
             f"{s['rollbacks']} (unnecessary {s['unnecessary_rollbacks']}, updates redone "
             f"{s['redone_updates']}), max weight rel diff "
             f"{_fmt_diff(s['max_weight_rel_diff'])}",
             goodput_line(s.get("goodput")),
             "",
             f"  {'kind':<17}{'count':>6}{'recov':>6}{'p50 s':>8}{'p90 s':>8}{'max s':>8}"
             f"{'bound':>14}{'stall':>6}{'rollb':>6}{'unnec':>6}{'infail':>8}"]
    for kind, v in s["per_kind"].items():
        lines.append(f"  {kind:<17}{v['injected']:>6}{v['recovered']:>6}{_fmt(v['p50_s']):>8}"
                     f"{_fmt(v['p90_s']):>8}{_fmt(v['max_s']):>8}{_bound_text(v):>14}"
                     f"{v['stalls']:>6}{v['rollbacks']:>6}{v['unnecessary_rollbacks']:>6}"
                     f"{v['failed_jobs']:>8}")
    for kind, why in s["kinds_skipped"].items():
        lines.append(f"  {kind:<17} skipped: {why}")
    lines.append("")
    lines.append(f"  {'p50 / max s':<17}" + "".join(f"{n[:-2]:>14}" for n in PHASES) +
                 f"{'over':>6}{'>1 s':>6}{'rebuilt':>8}")
    for kind, v in s["per_kind"].items():
        ph = v.get("phases") or {}
        cells = "".join(
            f"{(_fmt(x['p50']) + '/' + _fmt(x['max'])) if x.get('n') else '-':>14}"
            for x in (ph.get(n) or {} for n in PHASES))
        lines.append(f"  {kind:<17}{cells}{v.get('over_bound', 0):>6}"
                     f"{v.get('over_1s', '-'):>6}{v.get('rebuilt_generations', 0):>8}")
    flips = s["per_kind"].get("grad_flip")
    if flips and flips["injected"]:
        lines.append(f"  grad_flip: {flips.get('attributed', 0)} of {flips['injected']} "
                     "attributed to the flipped rank's worker (transient)")
    if s["stopped_early"]:
        lines.append(f"  stopped early: {s['stopped_early']}")
    lines.append("")
    lines.append("  PASS" if s["pass"] else "  FAIL:\n" + "\n".join(
        f"    {x}" for x in s["failures"][:40]))
    return "\n".join(lines) + "\n"


def render_markdown(s):
    out = [f"Campaign: seed {s['seed']}, {s['faults_injected']} faults over {s['jobs']} jobs "
           f"({s['jobs_succeeded']} succeeded, {s['jobs_passed']} passed every judgement), "
           f"{s['minutes']:.0f} minutes; lease {s['lease_s']:g} s; {s['updates_per_job']} "
           f"updates per job, W = {s['workers']} + {s['spares']} spare, {s['model']}; " +
           (f"network namespaces, {s['latency']}." if s["netns"] else "loopback."),
           "",
           f"Lost updates: {s['lost_updates']}. Doubled updates: {s['doubled_updates']}. "
           f"Stalls (no commit within the wait after a fault): {s['stalls']}. "
           f"Rollbacks: {s['rollbacks']} (unnecessary: {s['unnecessary_rollbacks']}; updates "
           f"redone: {s['redone_updates']}). Largest relative weight difference from the "
           f"fault-free run: "
           f"{_fmt_diff(s['max_weight_rel_diff'])}.",
           "",
           "| fault | injected | recovered | recovery p50 (s) | p90 (s) | max (s) | bound (s) | "
           "stalls | rollbacks | unnecessary | in failed jobs |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind, v in s["per_kind"].items():
        out.append(f"| `{kind}` | {v['injected']} | {v['recovered']} | {_fmt(v['p50_s'])} | "
                   f"{_fmt(v['p90_s'])} | {_fmt(v['max_s'])} | {_bound_text(v)} | "
                   f"{v['stalls']} | {v['rollbacks']} | {v['unnecessary_rollbacks']} | "
                   f"{v['failed_jobs']} |")
    for kind, why in s["kinds_skipped"].items():
        out.append(f"| `{kind}` | skipped: {why} | | | | | | | | | |")
    flips = s["per_kind"].get("grad_flip")
    if flips and flips["injected"]:
        out.append("")
        out.append(f"Gradient flips attributed to the flipped rank's worker (a transient "
                   f"re-run naming it): {flips.get('attributed', 0)} of {flips['injected']}.")
    out.append("")
    out.append("Where the time went, per kind: p50 / max seconds from the fault's reference "
               "time (judge.phases) to the coordinator's first sign of it (detect), the "
               "recovering generation's first and last rank learning their place (formed, "
               "assigned), a restarted rank process starting (started, where one was needed), "
               "the recovering window's first BeginWindow (window) and its commit; over bound: "
               "recoveries whose bounded phase (the commit, or the one the bound names) came "
               "after the bound; over 1 s: commits more than 1 s after the reference time; "
               "rebuilt: recoveries that needed more than one new generation.")
    out.append("")
    out.append("| fault | over bound | over 1 s | detect | formed | assigned | started | window "
               "| commit | rebuilt |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind, v in s["per_kind"].items():
        ph = v.get("phases") or {}
        cells = []
        for name in PHASES:
            x = ph.get(name) or {}
            cells.append("-" if not x.get("n") else f"{_fmt(x['p50'])} / {_fmt(x['max'])}")
        out.append(f"| `{kind}` | {v.get('over_bound', 0)} | {v.get('over_1s', '-')} | " +
                   " | ".join(cells) +
                   f" | {v.get('rebuilt_generations', 0)} |")
    out.append("")
    if s["failures"]:
        out.append("Failures:")
        out += [f"* {x}" for x in s["failures"][:40]]
    else:
        out.append("Every job passed every judgement.")
    return "\n".join(out) + "\n"



def worker_takes_fault_flags(bin_dir):
    """Whether bin_dir's worker is the testing build: its --help lists the fault flags."""
    try:
        out = subprocess.run([os.path.join(bin_dir, "trainstep-worker"), "--help"],
                             capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--debug-flip-grad-file" in out


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.resummarize:
        try:
            summary = resummarize(os.path.abspath(args.resummarize), args.enforce_bounds)
        except (OSError, ValueError, KeyError) as e:
            print(f"chaos: --resummarize {args.resummarize}: {e}", file=sys.stderr)
            return 2
        return 0 if summary["pass"] else 1
    why = runtime_missing()
    if why:
        print(f"SKIP: {why}", file=sys.stderr)
        return SKIP
    args.bin = args.bin or os.environ.get("TRAINSTEP_BIN_DIR") or os.path.join(
        SOURCE_DIR, "build", "bin")
    testing_bin = os.path.join(args.bin, "testing")
    needs_testing = [k for k in ("grad_flip", "hang") if k in args.kinds]
    if needs_testing and os.access(os.path.join(testing_bin, "trainstep-worker"), os.X_OK):
        args.bin = testing_bin
    for b in ("trainstep-coordinator", "trainstep-worker"):
        if not os.access(os.path.join(args.bin, b), os.X_OK):
            print(f"chaos: {args.bin}/{b} not found (build first, or pass --bin)",
                  file=sys.stderr)
            return 1
    if needs_testing and not worker_takes_fault_flags(args.bin):
        print(f"chaos: {', '.join(needs_testing)} needs the testing build's worker (its "
              f"--debug-* flags); {args.bin}/trainstep-worker is the shipped one: pass --bin "
              "build/bin/testing", file=sys.stderr)
        return 1
    if args.nice:
        os.nice(args.nice)
    out = args.out or tempfile.mkdtemp(prefix="trainstep-chaos-")
    os.makedirs(out, exist_ok=True)
    out = os.path.abspath(out)
    for name in ("jobs.jsonl", "faults.jsonl"):
        try:
            os.unlink(os.path.join(out, name))
        except FileNotFoundError:
            pass
    kinds, skipped, shim = kinds_available(args, out)
    for kind, reason in skipped.items():
        log(f"skipping {kind}: {reason}")
    if args.faults and not kinds:
        print(f"SKIP: no requested fault kind can run here: {skipped}", file=sys.stderr)
        return SKIP
    import netns as netns_mod
    topology = None
    if os.geteuid() == 0:
        sweep_stale_mounts()
        netns_mod.sweep_stale(say=log)
    # A CTest timeout or Ctrl-C must still unmount and delete namespaces: SIGTERM unwinds.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        if args.netns:
            why = netns_mod.requirement_missing()
            if why:
                print(f"SKIP: {why}", file=sys.stderr)
                return SKIP
            reserve = args.faults_per_job if "worker_retire" in kinds else 0
            nodes = ["coordinator"] + [f"w{i}" for i in range(args.workers + args.spares +
                                                             reserve)]
            topology = netns_mod.Topology(nodes, latency_ms=args.latency_ms, say=log)
            topology.__enter__()
            # Before any thread exists: the client must reach the coordinator's private
            # address, so this process lives in the coordinator's namespace.
            netns_mod.enter(topology.ns("coordinator"))
        os.environ["TRAINSTEP_CHAOS_PID"] = str(os.getpid())
        log(f"out {out}; binaries {args.bin}; kinds {', '.join(kinds) or '-'}; "
            f"{args.faults} faults, ≤ {args.faults_per_job} per job, seed {args.seed}")
        campaign = Campaign(args, out, kinds, skipped, shim, topology)
        summary = campaign.run()
    finally:
        if topology is not None:
            topology.down()
    log(f"summary: {out}/summary.json, table {out}/summary.txt, for RELIABILITY.md "
        f"{out}/results.md")
    return 0 if summary["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
