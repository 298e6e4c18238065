"""The chaos tool's verdicts, as pure functions of what a run left behind: the per-update
log, the rollbacks the coordinator logged, what each worker process was doing when, and the
faults injected. No processes, no sockets: judge_test.py feeds these functions by hand, so a
verdict can be trusted before it is used on a real cluster.

Times are seconds since the epoch (float) throughout; the per-update log's end_time_ms is
converted where it is read.
"""

import json
import math
import re
import struct

import numpy as np

# safetensors dtype names → numpy dtypes (the formats our checkpoints write).
_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
    "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}

# Fault kinds whose recovery needs a new generation (a rank is gone); the others (the
# coordinator's) need only a commit after the restarted coordinator listens.
PAUSE_FAULTS = ("coordinator_stop",)
# Faults that cost a rank: past them once a newer generation commits (a hung rank is fenced
# like a lost one). The others are past once anything commits.
RANK_FAULTS = ("worker_kill", "worker_stop", "checkpoint_kill", "worker_retire", "partition",
               "restart_gap_kill", "all_ranks_kill", "checkpoint_corrupt", "hang")


def read_safetensors(path):
    """{name: ndarray} of a .safetensors file, read with numpy only: 8 bytes little-endian
    header length, a JSON header of {name: {dtype, shape, data_offsets}}, then the data.
    Written here rather than imported so that the judge does not trust the product's own
    reader. bf16 comes back as float32 (numpy has no bf16)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: {len(data)} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError(f"{path}: header of {n} bytes runs past the end ({len(data)} bytes)")
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = body[begin:end]
        if info["dtype"] == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            array = bits.view(np.float32)
        else:
            array = np.frombuffer(raw, dtype=np.dtype(_DTYPES[info["dtype"]]).newbyteorder("<"))
        tensors[name] = array.reshape(info["shape"])
    return tensors


def compare_tensors(got, want):
    """How far `got` is from `want` ({name: ndarray} each): per tensor max|got - want| /
    max|want| (the relative error the issue bounds by 1e-5). Returns a dict with the worst
    tensor, its error, and the names present in only one of them."""
    worst_name, worst = None, 0.0
    for name in sorted(set(got) & set(want)):
        a = got[name].astype(np.float64)
        b = want[name].astype(np.float64)
        if a.shape != b.shape:
            return {"max_rel_diff": math.inf, "worst_tensor": name,
                    "problem": f"{name}: shape {list(a.shape)} != {list(b.shape)}"}
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
            rel = 0.0 if np.array_equal(a, b, equal_nan=True) else math.inf
        else:
            scale = max(float(np.max(np.abs(b))) if b.size else 0.0, 1e-30)
            rel = float(np.max(np.abs(a - b))) / scale if a.size else 0.0
        if rel > worst or worst_name is None:
            worst_name, worst = name, rel
    only = sorted(set(got) ^ set(want))
    out = {"max_rel_diff": worst, "worst_tensor": worst_name, "tensors": len(want)}
    if only:
        out["max_rel_diff"] = math.inf
        out["problem"] = f"tensors in only one checkpoint: {only}"
    return out


# ---------------------------------------------------------------------------------------
# The coordinator's event log (--log-format json) and the workers' logs

_ROLLBACK = re.compile(r"job (\S+) generation (\d+) formed: (\d+) ranks, state from (\S+)"
                       r"(?: \(rolled back to checkpoint (\d+)\))?")
_LISTENING = re.compile(r"trainstep-coordinator listening on")
_REGISTERED = re.compile(r"registered(?: again)? as (\S+) of (\S+)")
_RANK = re.compile(r"generation (\d+): rank (\d+) of (\d+)")


def parse_log_time(text):
    """'2026-12-01T22:56:54.866Z' → seconds since the epoch (UTC)."""
    import datetime
    t = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ")
    return t.replace(tzinfo=datetime.timezone.utc).timestamp()


def json_lines(lines):
    """The JSON objects among `lines` (a log may hold a torn last line after a SIGKILL, and
    startup noise from libraries that print without our logger)."""
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            yield json.loads(line)
        except ValueError:
            continue


def _line_time(obj):
    """The time a json log object carries, in seconds: a plain line's "time", a
    window_ended event's end_time_ms; None for other events (generation_formed has none)."""
    if "time" in obj:
        try:
            return parse_log_time(obj["time"])
        except (TypeError, ValueError):
            return None
    if obj.get("event") == "window_ended" and obj.get("end_time_ms") is not None:
        try:
            return int(obj["end_time_ms"]) / 1000.0
        except (TypeError, ValueError):
            return None
    return None


def generations_from_coordinator_log(lines, job_id):
    """Every generation one coordinator incarnation's json log says was formed for `job_id`,
    as {generation, time, time_hi, ranks, worker_ids, source, rolled_back, checkpoint_id,
    rollback_update}.

    Since commit 13ac1a4 the coordinator writes a {"event":"generation_formed", ...} line
    (coordinator/event_log.cc: the journal record, with worker_ids, the assignment and
    rollback_to) instead of the text "job J generation G formed: N ranks, state from S
    (rolled back to checkpoint C)"; the text form is still read for older logs. The event
    carries no time of its own: `time` is the latest time logged before it (a plain line's
    time or a window's end_time_ms), `time_hi` the first one after it (None at the log's
    end), so the generation formed within [time, time_hi]. The text form has one time
    (time_hi = time). rollback_update is the rolled-back-to checkpoint's update id where the
    log says it (the event's rollback_to), else None."""
    out = []
    last_time = None
    waiting = []  # events still without a time after them
    for obj in json_lines(lines):
        t = _line_time(obj)
        if t is not None:
            for g in waiting:
                g["time_hi"] = t
                if g["time"] is None:
                    g["time"] = t
            waiting = []
            last_time = t
        if obj.get("event") == "generation_formed":
            if obj.get("training_job") != job_id:
                continue
            rolled_back = bool(obj.get("rolled_back"))
            rollback_to = obj.get("rollback_to") or {}
            assignment = obj.get("assignment") or {}
            workers = list(obj.get("worker_ids") or [])
            g = {"generation": int(obj["generation"]), "time": last_time, "time_hi": None,
                 "ranks": len(workers), "worker_ids": workers,
                 "source": assignment.get("state_source"), "rolled_back": rolled_back,
                 "checkpoint_id": (int(rollback_to.get("checkpoint_id", 0))
                                   if rolled_back else None),
                 "rollback_update": (int(rollback_to["optimizer_update_id"])
                                     if rolled_back and rollback_to.get("optimizer_update_id")
                                     is not None else None)}
            out.append(g)
            waiting.append(g)
            continue
        m = _ROLLBACK.search(obj.get("msg", "") or "")
        if not m or m.group(1) != job_id or t is None:
            continue
        out.append({
            "generation": int(m.group(2)), "time": t, "time_hi": t,
            "ranks": int(m.group(3)), "worker_ids": None, "source": m.group(4),
            "rolled_back": m.group(5) is not None,
            "checkpoint_id": int(m.group(5)) if m.group(5) is not None else None,
            "rollback_update": None,
        })
    return out


def listening_time(lines):
    """When this coordinator incarnation started serving (its "listening on" line), or None."""
    for obj in json_lines(lines):
        if _LISTENING.search(obj.get("msg", "")):
            return parse_log_time(obj["time"])
    return None


def worker_generations(lines):
    """{generation: time} of the generations one worker process was a rank of, from its
    json log ("generation G: rank r of W ...")."""
    out = {}
    for obj in json_lines(lines):
        m = _RANK.search(obj.get("msg", ""))
        if m:
            out.setdefault(int(m.group(1)), parse_log_time(obj["time"]))
    return out


def worker_registered(lines):
    """When one worker process first registered ("registered as w-N of J"), or None."""
    for obj in json_lines(lines):
        if _REGISTERED.search(obj.get("msg", "") or "") and "time" in obj:
            return parse_log_time(obj["time"])
    return None


_DETECTION = re.compile(r"job (\S+) (?:lost worker (\S+): .*|generation (\d+) ended: .*)")


def coordinator_detections(lines, job_id):
    """The times one coordinator incarnation noticed that a generation could not go on:
    "lost worker W: ..." and "generation G ended: ..." lines, and windows it aborted because
    a worker was lost (window_ended, outcome abort, WORKER_LOST). [(time, text)]."""
    out = []
    for obj in json_lines(lines):
        if obj.get("event") == "window_ended":
            if obj.get("training_job") == job_id and obj.get("outcome") == "abort" and \
                    "WORKER_LOST" in str(obj.get("reason_code", "")) + str(obj.get("reason", "")):
                t = _line_time(obj)
                if t is not None:
                    out.append((t, f"window {obj.get('window_id')} aborted (worker lost)"))
            continue
        m = _DETECTION.search(obj.get("msg", "") or "")
        if m and m.group(1) == job_id and "time" in obj:
            out.append((parse_log_time(obj["time"]), obj["msg"][len(f"job {job_id} "):]))
    return out


def merge_generations(per_incarnation):
    """One list of formed generations from every coordinator incarnation's, in order. A
    "formed" line is logged before its record is fsynced, so a coordinator killed in between
    can log a generation that never happened; its successor then forms that number again.
    The last line for a number is the one that counted."""
    by_number = {}
    for gens in per_incarnation:
        for g in gens:
            by_number[g["generation"]] = g
    return [by_number[n] for n in sorted(by_number)]


def tighten_generation_times(generations, procs):
    """Narrows each generation's [time, time_hi] with the workers' logs: a rank logs
    "generation G: rank r" once it learned its place, so the generation had formed by the
    first such line. `procs`: dicts with "generations" ({G: time}). Returns `generations`."""
    first = {}
    for p in procs:
        for g, t in (p.get("generations") or {}).items():
            if t is not None and (g not in first or t < first[g]):
                first[g] = t
    for g in generations:
        t = first.get(g["generation"])
        if t is None:
            continue
        if g.get("time_hi") is None or t < g["time_hi"]:
            g["time_hi"] = t
        if g.get("time") is None or g["time"] > g["time_hi"]:
            g["time"] = g["time_hi"]
    return generations


# ---------------------------------------------------------------------------------------
# The per-update log

def commit_records(records):
    return [r for r in records if r.get("outcome") == "commit"]


def checkpoint_updates(records):
    """{checkpoint_id: optimizer_update_id} from the log's commits (checkpoint 0 holds the
    initial weights, update 0)."""
    out = {0: 0}
    for r in commit_records(records):
        out.setdefault(int(r["checkpoint_id"]), int(r["optimizer_update_id"]))
    return out


def check_update_ids(records, generations):
    """Walks the commits in log order. Each must carry the update id after the previous one,
    except right after a rollback, where ids restart after the checkpoint rolled back to.
    Returns {commits, doubled: [...], lost: [...], redone: n, rollbacks_seen: n}: a doubled
    update is an id committed again with no rollback to explain it, a lost one an id skipped;
    `redone` counts the updates rollbacks made the job compute again."""
    ckpt_update = checkpoint_updates(records)
    rollbacks = sorted((g for g in generations if g["rolled_back"]),
                       key=lambda g: g["generation"])
    doubled, lost = [], []
    redone, applied = 0, 0
    last = 0
    pending = list(rollbacks)
    commits = 0
    for r in records:
        gen = int(r.get("generation", 0))
        while pending and pending[0]["generation"] <= gen:
            rb = pending.pop(0)
            back_to = rb.get("rollback_update")
            if back_to is None:
                back_to = ckpt_update.get(rb["checkpoint_id"])
            if back_to is None:
                # Not recoverable from the log: the checkpoint's commit is not in it.
                back_to = last
            redone += max(0, last - back_to)
            last = back_to
            applied += 1
        if r.get("outcome") != "commit":
            continue
        commits += 1
        uid = int(r["optimizer_update_id"])
        if uid <= last:
            doubled.append({"optimizer_update_id": uid, "window_id": r.get("window_id"),
                            "generation": gen, "previous": last})
        elif uid > last + 1:
            lost.append({"missing_from": last + 1, "missing_to": uid - 1,
                         "window_id": r.get("window_id"), "generation": gen})
        if uid > last:
            last = uid
    return {"commits": commits, "doubled": doubled, "lost": lost, "redone": redone,
            "rollbacks_seen": applied, "final_update": last}


# ---------------------------------------------------------------------------------------
# Rollbacks and who held the current update

def state_at(proc, t):
    """What a worker process was at time t: None (not running yet or exited), "running",
    "stopped" (SIGSTOP) or "partitioned" (its link down)."""
    if proc["start"] > t:
        return None
    if proc.get("end") is not None and proc["end"] <= t:
        return None
    for a, b in proc.get("stopped", []):
        if a <= t and (b is None or t < b):
            return "stopped"
    for a, b in proc.get("partitioned", []):
        if a <= t and (b is None or t < b):
            return "partitioned"
    return "running"


def judge_rollbacks(records, generations, procs):
    """For each logged rollback: the update the job had reached (the last commit before the
    rollback's generation), the generation that committed it, and the worker processes that
    held it then — ranks of that generation, or of a later one before the rollback that got
    as far as ending a window (so every rank had received the state: a generation formed
    while its source was already dead, unbeknown to the coordinator, passes nothing on) —
    with what each was doing at the rollback's time. A rollback while a holder was running is
    unnecessary; one whose holders were only paused or cut off is reported
    as such. `procs`: dicts with name, start, end, stopped, partitioned, generations.

    A generation_formed event has no time of its own, only the bracket [time, time_hi] of
    the lines around it (generations_from_coordinator_log). A holder running at `time`
    counts as running (the strict reading: the rollback may have been decided then); if it
    was gone by `time_hi` the rollback's detail says `ambiguous`, so that a reader can
    check the order by hand."""
    out = []
    ran = {int(r["generation"]) for r in records}  # generations that ended a window
    for rb in (g for g in generations if g["rolled_back"]):
        t_lo = rb["time"] if rb.get("time") is not None else rb.get("time_hi")
        t_hi = rb.get("time_hi") if rb.get("time_hi") is not None else t_lo
        before = [r for r in commit_records(records) if int(r["generation"]) < rb["generation"]]
        if not before:
            out.append({"generation": rb["generation"], "time": t_lo, "time_hi": t_hi,
                        "checkpoint_id": rb["checkpoint_id"], "current_update": 0,
                        "holders": [], "unnecessary": False})
            continue
        last = before[-1]
        g_commit = int(last["generation"])
        holder_gens = {n for n in ran if g_commit < n < rb["generation"]} | {g_commit}
        holders = []
        for p in procs:
            if holder_gens & set(p.get("generations", {})):
                if t_lo is None:
                    holders.append({"name": p["name"], "state": "unknown",
                                    "state_after": "unknown"})
                    continue
                holders.append({"name": p["name"], "state": state_at(p, t_lo),
                                "state_after": state_at(p, t_hi)})
        running = [h for h in holders if h["state"] == "running"]
        out.append({
            "generation": rb["generation"], "time": t_lo, "time_hi": t_hi,
            "checkpoint_id": rb["checkpoint_id"],
            "current_update": int(last["optimizer_update_id"]), "committed_in": g_commit,
            "holders": holders, "unnecessary": bool(running),
            "ambiguous": any(h["state_after"] != "running" for h in running),
            "time_unknown": t_lo is None,
            "holders_unreachable": bool(holders) and not running and any(
                h["state"] in ("stopped", "partitioned") for h in holders),
        })
    return out


# ---------------------------------------------------------------------------------------
# Recovery times

def flip_attribution(fault, records):
    """The worker the first re-run after a grad_flip fault's injection names as transient
    (its record's `rerun`), or None when no re-run after it found a transient fault. The flip
    lands in the victim's next window, so that re-run is the flip's."""
    for r in records:
        rerun = r.get("rerun")
        if r["end_time_ms"] / 1000.0 < fault["inject"] or not rerun:
            continue
        if rerun.get("verdict") == "transient":
            return rerun.get("worker_id")
    return None


# A worker's log line on each registration (worker/link/coordinator_link.cc), text or JSON.
_REGISTERED = re.compile(r"registered(?: again)? as (\S+) of ")


def registered_worker_ids(log_lines):
    """Every worker id a worker process registered as, in order. One process holds several
    when the coordinator declared it lost (fenced as hung, paused past its lease) and it
    registered again to rejoin."""
    return [m.group(1) for line in log_lines for m in [_REGISTERED.search(line)] if m]


def flip_attributed(fault, victim_ids):
    """Whether a grad_flip's re-run named the process it was injected into: the id it had
    when armed, or any id it registered as (a flip armed before the process rejoined under a
    new id is consumed under that id)."""
    named = fault.get("attributed_to")
    return named is not None and (named == fault.get("victim_worker_id") or named in victim_ids)


def storage_fault_problem(fault, generations, coordinator_lines):
    """What a checkpoint fault got wrong (a sentence), or None; notes what it did not test.
    checkpoint_full: a failed write must have been counted while the disk was full.
    checkpoint_corrupt: a generation that rolled back to the damaged checkpoint must have had
    the damage reported ("checkpoint C is damaged" in the coordinator's log); sets
    fault["damage_detected"], and a note when a later checkpoint became durable before the
    kill, so the damaged one was never loaded."""
    if fault["kind"] == "checkpoint_full" and not fault.get("failure_reported"):
        return (f"fault {fault['number']} (checkpoint_full): no failed checkpoint write was "
                "reported while the disk was full")
    if fault["kind"] != "checkpoint_corrupt":
        return None
    damaged = fault["damaged_checkpoint_id"]
    fault["damage_detected"] = any(f"checkpoint {damaged} is damaged" in line
                                   for line in coordinator_lines)
    loaded = any(g["rolled_back"] and g["checkpoint_id"] == damaged
                 and g["generation"] > fault["generation_before"] for g in generations)
    if loaded and not fault["damage_detected"]:
        return (f"fault {fault['number']} (checkpoint_corrupt): checkpoint {damaged} was "
                "loaded and its damage never reported")
    if not loaded:
        fault["note"] = (f"checkpoint {damaged} was not loaded: a later one became durable "
                         "before the kill")
    return None


def recovery(fault, records):
    """Seconds from the fault's reference time to the end of the next commit that shows the
    job past the fault: for a lost rank (RANK_FAULTS) a commit of a newer generation than the
    one in force at injection, for a pause (PAUSE_FAULTS) a commit of a window begun after it
    ended, for the coordinator's other faults any commit after the restarted coordinator
    listened (fault["ref"]). None if no such commit exists."""
    ref = fault.get("ref")
    if ref is None:
        return None
    newer_than = None
    # A pause ends with the window that was in flight committing at once: only a window begun
    # after it shows that the workers' own calls came back.
    begun_after = fault["kind"] in PAUSE_FAULTS
    if fault["kind"] in RANK_FAULTS:
        ended_before = [r for r in records if r["end_time_ms"] / 1000.0 <= fault["inject"]]
        newer_than = int(ended_before[-1]["generation"]) if ended_before else 0
    for r in commit_records(records):
        t = r["end_time_ms"] / 1000.0
        if t < ref:
            continue
        if newer_than is not None and int(r["generation"]) <= newer_than:
            continue
        if begun_after and t - float(r.get("window_seconds") or 0.0) < ref:
            continue
        return t - ref
    return None


def phases(fault, records, generations, procs, detections):
    """Where one fault's recovery time went, in seconds from its reference time (None where
    the logs do not say):
      detect_s     the coordinator's first sign of it (a worker lost, a generation ended, a
                   window aborted for a lost worker) — rank faults only;
      formed_s     the recovering generation formed: the first of its ranks to log
                   "generation G: rank r" (pushed on the Attach stream at once);
      assigned_s   the last of its ranks to log it (a replacement process that had to start
                   first shows here);
      started_s    the latest start of a rank process that was not yet running at the
                   reference time (a restarted slot), if any;
      window_s     the recovering window's first BeginWindow (end_time_ms - window_seconds):
                   assigned → window is the rendezvous plus the state broadcast or checkpoint
                   load;
      commit_s     its commit (= the recovery);
      generations  how many generations formed in between (> 1: one broke before it ran).
    `procs` as for judge_rollbacks (with "generations" and "registered" per process),
    `detections` [(time, text)] from coordinator_detections over every incarnation."""
    ref = fault.get("ref")
    rec = fault.get("recovery_s")
    if ref is None or rec is None:
        return None
    end = ref + rec
    commit = next((r for r in commit_records(records)
                   if abs(r["end_time_ms"] / 1000.0 - end) < 1e-3), None)
    if commit is None:
        return None
    g = int(commit["generation"])
    out = {"commit_s": rec, "generation": g}
    ws = commit.get("window_seconds")
    out["window_s"] = (end - float(ws) - ref) if ws is not None else None
    members = [p for p in procs if g in (p.get("generations") or {})]
    times = [p["generations"][g] for p in members]
    if times and min(times) < ref:
        times = []  # formed before the fault (a coordinator fault): no formation to time
    out["formed_s"] = (min(times) - ref) if times else None
    out["assigned_s"] = (max(times) - ref) if times else None
    fresh = [p["start"] for p in members if p.get("start") is not None and p["start"] > ref]
    out["started_s"] = (max(fresh) - ref) if fresh else None
    out["restarted_ranks"] = len(fresh)
    if fault["kind"] in RANK_FAULTS:
        seen = sorted(t for t, _ in detections if ref <= t <= end)
        out["detect_s"] = (seen[0] - ref) if seen else None
        first = sorted((t, text) for t, text in detections if ref <= t <= end)
        out["detected_by"] = first[0][1] if first else None
    before = int(fault.get("generation_before") or 0)
    out["generations"] = len([x for x in generations if before < x["generation"] <= g]) or None
    return out


def percentile(values, q):
    """The q-th percentile (0..100) by linear interpolation, None for no values."""
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)
