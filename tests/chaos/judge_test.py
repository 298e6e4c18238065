"""The chaos tool's verdicts (judge.py) on hand-made histories: a judge that passes a broken
run, or fails a good one, would make every campaign meaningless, so each rule is pinned here
without any process."""

import json
import os
import struct
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    import numpy as np  # noqa: E402
except ImportError:  # e.g. the Debian 13 root of check-gpu-build, which has no python3-numpy
    print("SKIP: judge.py reads checkpoints with numpy; install python3-numpy", file=sys.stderr)
    sys.exit(77)

import judge  # noqa: E402


def commit(uid, gen, t_ms, ckpt=0, window=None):
    return {"outcome": "commit", "optimizer_update_id": uid, "generation": gen,
            "end_time_ms": t_ms, "checkpoint_id": ckpt, "window_id": window or uid}


def abort(uid, gen, t_ms):
    return {"outcome": "abort", "optimizer_update_id": uid, "generation": gen,
            "end_time_ms": t_ms, "checkpoint_id": 0, "window_id": uid + 1}


def gen(n, t, rolled_back=False, ckpt=None):
    return {"generation": n, "time": t, "ranks": 3, "source": "BROADCAST",
            "rolled_back": rolled_back, "checkpoint_id": ckpt}


def write_safetensors(path, tensors, bf16=()):
    header, body = {}, b""
    for name, a in tensors.items():
        if name in bf16:
            raw = (np.asarray(a, np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
            dtype = "BF16"
        else:
            raw = np.asarray(a, "<f4").tobytes()
            dtype = "F32"
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [len(body), len(body) + len(raw)]}
        body += raw
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + body)


class SafetensorsTest(unittest.TestCase):
    def test_round_trip_f32_and_bf16(self):
        w = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
        b = np.array([1.5, -2.0], dtype=np.float32)  # exact in bf16
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m.safetensors")
            write_safetensors(path, {"w": w, "b": b}, bf16=("b",))
            got = judge.read_safetensors(path)
        np.testing.assert_array_equal(got["w"], w)
        np.testing.assert_array_equal(got["b"], b)
        self.assertEqual(sorted(got), ["b", "w"])

    def test_truncated_file_is_an_error(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m.safetensors")
            with open(path, "wb") as f:
                f.write(struct.pack("<Q", 1000) + b"{}")
            with self.assertRaises(ValueError):
                judge.read_safetensors(path)


class CompareTest(unittest.TestCase):
    def test_equal_and_within_tolerance(self):
        a = {"w": np.array([1.0, -2.0, 4.0], np.float32)}
        self.assertEqual(judge.compare_tensors(a, a)["max_rel_diff"], 0.0)
        b = {"w": a["w"] * (1 + 1e-7)}
        self.assertLess(judge.compare_tensors(b, a)["max_rel_diff"], 1e-5)

    def test_difference_is_relative_to_the_largest_value(self):
        want = {"w": np.array([100.0, 0.001], np.float32)}
        got = {"w": np.array([100.0, 0.002], np.float32)}
        self.assertAlmostEqual(judge.compare_tensors(got, want)["max_rel_diff"], 1e-5, places=7)

    def test_shape_or_names_differ(self):
        a = {"w": np.zeros((2, 2), np.float32)}
        self.assertEqual(judge.compare_tensors({"w": np.zeros(4, np.float32)}, a)
                         ["max_rel_diff"], float("inf"))
        r = judge.compare_tensors({"w": a["w"], "extra": a["w"]}, a)
        self.assertEqual(r["max_rel_diff"], float("inf"))
        self.assertIn("extra", r["problem"])

    def test_nan_is_never_equal_to_a_number(self):
        want = {"w": np.array([1.0, 2.0], np.float32)}
        got = {"w": np.array([1.0, np.nan], np.float32)}
        self.assertEqual(judge.compare_tensors(got, want)["max_rel_diff"], float("inf"))


class UpdateIdsTest(unittest.TestCase):
    def test_clean_run(self):
        records = [commit(i, 1, 1000 + i) for i in range(1, 11)]
        r = judge.check_update_ids(records, [gen(1, 0)])
        self.assertEqual((r["doubled"], r["lost"], r["redone"], r["final_update"]),
                         ([], [], 0, 10))

    def test_abort_and_retry_is_not_a_double(self):
        records = [commit(1, 1, 1), commit(2, 1, 2), abort(2, 1, 3), commit(3, 2, 4)]
        r = judge.check_update_ids(records, [gen(1, 0), gen(2, 0.003)])
        self.assertEqual((r["doubled"], r["lost"]), ([], []))

    def test_repeat_without_rollback_is_doubled(self):
        records = [commit(1, 1, 1), commit(2, 1, 2), commit(2, 2, 3), commit(3, 2, 4)]
        r = judge.check_update_ids(records, [gen(1, 0), gen(2, 0.0025)])
        self.assertEqual(len(r["doubled"]), 1)
        self.assertEqual(r["doubled"][0]["optimizer_update_id"], 2)

    def test_gap_is_lost(self):
        records = [commit(1, 1, 1), commit(3, 1, 2)]
        r = judge.check_update_ids(records, [gen(1, 0)])
        self.assertEqual(r["lost"], [{"missing_from": 2, "missing_to": 2, "window_id": 3,
                                      "generation": 1}])

    def test_rollback_explains_the_repeat_and_counts_redone(self):
        # Checkpoint 1 holds update 5; gen 2 rolls back to it from update 8.
        records = [commit(i, 1, i, ckpt=1 if i >= 5 else 0) for i in range(1, 9)]
        records += [commit(i, 2, 100 + i, ckpt=1) for i in range(6, 11)]
        gens = [gen(1, 0), gen(2, 0.05, rolled_back=True, ckpt=1)]
        r = judge.check_update_ids(records, gens)
        self.assertEqual((r["doubled"], r["lost"], r["redone"], r["final_update"]),
                         ([], [], 3, 10))

    def test_rollback_to_a_wrong_point_still_shows(self):
        # Logged rollback to checkpoint 1 (update 5), but ids restart at 3: doubled.
        records = [commit(i, 1, i, ckpt=1 if i >= 5 else 0) for i in range(1, 9)]
        records += [commit(3, 2, 200, ckpt=1)]
        r = judge.check_update_ids(records, [gen(1, 0), gen(2, 0.1, True, 1)])
        self.assertEqual(len(r["doubled"]), 1)


class RollbackTest(unittest.TestCase):
    def setUp(self):
        self.records = [commit(i, 1, 1000 * i, ckpt=1 if i >= 2 else 0) for i in range(1, 4)]
        self.gens = [gen(1, 0.5), gen(2, 10.0, rolled_back=True, ckpt=1)]

    def proc(self, name, start, end=None, gens=(1,), stopped=()):
        return {"name": name, "start": start, "end": end, "stopped": list(stopped),
                "partitioned": [], "generations": {g: start + 0.1 for g in gens}}

    def test_rollback_with_every_holder_dead_is_necessary(self):
        procs = [self.proc("s0.0", 0, 9.0), self.proc("s1.0", 0, 9.5),
                 self.proc("s0.1", 9.6, gens=(2,))]
        [r] = judge.judge_rollbacks(self.records, self.gens, procs)
        self.assertFalse(r["unnecessary"])
        self.assertEqual(r["current_update"], 3)
        self.assertEqual({h["name"] for h in r["holders"]}, {"s0.0", "s1.0"})

    def test_rollback_while_a_holder_runs_is_unnecessary(self):
        procs = [self.proc("s0.0", 0, 9.0), self.proc("s1.0", 0)]
        [r] = judge.judge_rollbacks(self.records, self.gens, procs)
        self.assertTrue(r["unnecessary"])

    def test_a_paused_holder_is_reported_apart(self):
        procs = [self.proc("s0.0", 0, 9.0), self.proc("s1.0", 0, stopped=[[8.0, 12.0]])]
        [r] = judge.judge_rollbacks(self.records, self.gens, procs)
        self.assertFalse(r["unnecessary"])
        self.assertTrue(r["holders_unreachable"])

    def test_a_rank_of_a_later_generation_holds_the_update_too(self):
        gens = [gen(1, 0.5), gen(2, 5.0), gen(3, 10.0, rolled_back=True, ckpt=1)]
        records = self.records + [abort(3, 2, 6000)]  # gen 2 got as far as a window
        procs = [self.proc("s0.0", 0, 9.0), self.proc("s2.0", 4.0, gens=(2,))]
        [r] = judge.judge_rollbacks(records, gens, procs)
        self.assertTrue(r["unnecessary"])

    def test_a_generation_that_never_ran_passes_nothing_on(self):
        # All ranks of gen 1 died; their leases expired one by one, so gens 2 and 3 formed
        # with a dead "holder" as the source before gen 4 rolled back: newcomers of 2 and 3
        # never received update 3.
        gens = [gen(1, 0.5), gen(2, 9.0), gen(3, 9.1), gen(4, 9.2, rolled_back=True, ckpt=1)]
        procs = [self.proc("s0.0", 0, 5.0), self.proc("s1.1", 6.0, gens=(2, 3, 4))]
        [r] = judge.judge_rollbacks(self.records, gens, procs)
        self.assertFalse(r["unnecessary"])

    def test_a_holder_gone_within_the_bracket_is_strict_but_flagged(self):
        # The event's time is bracketed [9.8, 10.2]; a holder that exited at 10.0 may have
        # been running at the decision: counted, and marked ambiguous.
        gens = [gen(1, 0.5), dict(gen(2, 9.8, rolled_back=True, ckpt=1), time_hi=10.2)]
        procs = [self.proc("s0.0", 0, 9.0), self.proc("s1.0", 0, 10.0)]
        [r] = judge.judge_rollbacks(self.records, gens, procs)
        self.assertTrue(r["unnecessary"])
        self.assertTrue(r["ambiguous"])
        procs = [self.proc("s0.0", 0, 9.0), self.proc("s1.0", 0, 9.7)]
        [r] = judge.judge_rollbacks(self.records, gens, procs)
        self.assertFalse(r["unnecessary"])

    def test_worker_logs_narrow_the_bracket(self):
        gens = [dict(gen(2, 9.0, rolled_back=True, ckpt=1), time_hi=13.0), gen(3, 20.0)]
        gens[1]["time_hi"] = None
        procs = [self.proc("s0.1", 9.5, gens=(2,)), self.proc("s1.1", 9.2, gens=(2, 3))]
        # proc() logs each generation 0.1 s after the start: gen 2 first at 9.3, gen 3 at 9.3
        judge.tighten_generation_times(gens, procs)
        self.assertAlmostEqual(gens[0]["time_hi"], 9.3)
        self.assertAlmostEqual(gens[0]["time"], 9.0)
        self.assertAlmostEqual(gens[1]["time_hi"], 9.3)
        self.assertAlmostEqual(gens[1]["time"], 9.3)  # never after its own upper bound

    def test_state_at(self):
        p = self.proc("s", 1.0, 5.0, stopped=[[2.0, 3.0]])
        self.assertEqual([judge.state_at(p, t) for t in (0.5, 1.5, 2.5, 4.0, 5.0)],
                         [None, "running", "stopped", "running", None])


class LogParsingTest(unittest.TestCase):
    LINES = [
        '{"time":"2026-12-01T22:56:54.866Z","level":"INFO","msg":"trainstep-coordinator '
        'listening on 127.0.0.1:1 (state in /s)"}',
        '{"time":"2026-12-01T22:56:57.447Z","level":"INFO","msg":"job job-1 generation 1 '
        'formed: 3 ranks, state from INIT"}',
        '{"time":"2026-12-01T22:56:59.000Z","level":"INFO","msg":"job job-1 generation 2 '
        'formed: 3 ranks, state from CHECKPOINT (rolled back to checkpoint 4)"}',
        '{"time":"2026-12-01T22:56:59.500Z","level":"INFO","msg":"job job-2 generation 9 '
        'formed: 3 ranks, state from INIT"}',
        '{"time":"2026-12-01T22:57:0',  # torn by a SIGKILL
    ]

    def test_generations_and_listening(self):
        gens = judge.generations_from_coordinator_log(self.LINES, "job-1")
        self.assertEqual([(g["generation"], g["rolled_back"], g["checkpoint_id"]) for g in gens],
                         [(1, False, None), (2, True, 4)])
        self.assertAlmostEqual(gens[1]["time"] - gens[0]["time"], 1.553, places=3)
        self.assertAlmostEqual(judge.listening_time(self.LINES),
                               judge.parse_log_time("2026-12-01T22:56:54.866Z"))

    EVENTS = [
        '{"time":"2026-12-01T22:56:54.866Z","level":"INFO","msg":"trainstep-coordinator '
        'listening on 127.0.0.1:1 (state in /s)"}',
        '{"event":"generation_formed","training_job":"job-1","generation":1,"worker_ids":'
        '["w-1","w-2","w-3"],"assignment":{"store_prefix":"job-1/g1/","next_window_id":1,'
        '"state_source":"INIT","checkpoint_id":0,"optimizer_update_id":0},"rolled_back":false,'
        '"rollback_to":null}',
        '{"event":"window_ended","training_job":"job-1","window_id":1,"generation":1,'
        '"outcome":"commit","optimizer_update_id":1,"end_time_ms":1796165815000}',
        '{"event":"generation_formed","training_job":"job-2","generation":7,"worker_ids":'
        '["w-9"],"assignment":{"state_source":"INIT"},"rolled_back":false,"rollback_to":null}',
        '{"time":"2026-12-01T22:56:58.900Z","level":"WARN","msg":"job job-1 lost worker w-1: '
        'worker gone"}',
        '{"event":"generation_formed","training_job":"job-1","generation":2,"worker_ids":'
        '["w-4","w-5","w-6"],"assignment":{"state_source":"CHECKPOINT","checkpoint_id":4,'
        '"optimizer_update_id":"100"},"rolled_back":true,"rollback_to":{"checkpoint_id":"4",'
        '"window_id":100,"optimizer_update_id":"100","durable":true}}',
        '{"time":"2026-12-01T22:56:59.100Z","level":"INFO","msg":"job job-1 checkpoint 5 '
        'durable at /c"}',
        '{"event":"generation_formed","training_job":"job-1","generation":3,"worker_ids":'
        '["w-4","w-5"],"assignment":{"state_source":"BROADCAST"},"rolled_back":false,'
        '"rollback_to":null}',
        '{"event":"generation_formed","training_job":"job-1","generation":4,"wor',  # torn
    ]

    def test_generation_formed_events(self):
        gens = judge.generations_from_coordinator_log(self.EVENTS, "job-1")
        self.assertEqual([(g["generation"], g["ranks"], g["source"], g["rolled_back"],
                           g["checkpoint_id"], g["rollback_update"]) for g in gens],
                         [(1, 3, "INIT", False, None, None),
                          (2, 3, "CHECKPOINT", True, 4, 100),
                          (3, 2, "BROADCAST", False, None, None)])
        self.assertEqual(gens[1]["worker_ids"], ["w-4", "w-5", "w-6"])
        # No time of their own: bracketed by the lines around them.
        listen = judge.parse_log_time("2026-12-01T22:56:54.866Z")
        self.assertAlmostEqual(gens[0]["time"], listen)
        self.assertAlmostEqual(gens[0]["time_hi"], 1796165815.0)  # the window's end_time_ms
        self.assertAlmostEqual(gens[1]["time"],
                               judge.parse_log_time("2026-12-01T22:56:58.900Z"))
        self.assertAlmostEqual(gens[1]["time_hi"],
                               judge.parse_log_time("2026-12-01T22:56:59.100Z"))
        self.assertIsNone(gens[2]["time_hi"])  # nothing logged after it

    def test_event_rollback_resets_ids_to_its_own_update(self):
        # The event names the update it rolled back to (100); the log's commits would say
        # checkpoint 4 is update 98 (the first commit naming it), which is not where ids
        # restart.
        records = [commit(i, 1, i, ckpt=4 if i >= 98 else 0) for i in range(1, 103)]
        records += [commit(i, 2, 200 + i, ckpt=4) for i in range(101, 104)]
        gens = [gen(1, 0), dict(gen(2, 0.5, rolled_back=True, ckpt=4), rollback_update=100)]
        r = judge.check_update_ids(records, gens)
        self.assertEqual((r["doubled"], r["lost"], r["redone"], r["final_update"]),
                         ([], [], 2, 103))

    def test_mixed_text_and_events(self):
        # An old coordinator's text lines and a new one's events, one job's history.
        old = judge.generations_from_coordinator_log(self.LINES, "job-1")
        new = judge.generations_from_coordinator_log(self.EVENTS, "job-1")
        merged = judge.merge_generations([old, new])
        self.assertEqual([(g["generation"], g["source"]) for g in merged],
                         [(1, "INIT"), (2, "CHECKPOINT"), (3, "BROADCAST")])

    def test_a_generation_logged_twice_counts_once_the_last_time(self):
        first = [gen(1, 1.0), gen(2, 2.0, rolled_back=True, ckpt=1)]
        second = [gen(2, 3.0)]  # the restarted coordinator formed 2 again: the first was lost
        merged = judge.merge_generations([first, second])
        self.assertEqual([(g["generation"], g["rolled_back"]) for g in merged],
                         [(1, False), (2, False)])

    def test_worker_generations(self):
        lines = ['{"time":"2026-12-01T22:56:57.451Z","level":"INFO","msg":"generation 1: rank 1'
                 ' of 3, from window 1, state from INIT"}',
                 '{"time":"2026-12-01T22:56:58.451Z","level":"INFO","msg":"generation 3: rank 0'
                 ' of 3, from window 9, state from BROADCAST"}']
        self.assertEqual(sorted(judge.worker_generations(lines)), [1, 3])


class FlipAttributionTest(unittest.TestCase):
    """Catches a campaign that counts a flip as attributed when the re-run named another
    worker, a persistent verdict, or a re-run from before the flip was armed."""

    @staticmethod
    def rerun(uid, t_ms, verdict, worker_id):
        r = commit(uid, 1, t_ms)
        r["rerun"] = {"cause": "nonfinite", "verdict": verdict, "worker_id": worker_id}
        return r

    def test_the_first_transient_rerun_after_the_flip_names_its_worker(self):
        records = [self.rerun(1, 900, "transient", "w-1"), commit(2, 1, 1500),
                   self.rerun(3, 2100, "persistent", "w-3"),
                   self.rerun(4, 2200, "transient", "w-2"), self.rerun(5, 2300, "transient", "w-1")]
        f = {"kind": "grad_flip", "inject": 1.0}
        self.assertEqual(judge.flip_attribution(f, records), "w-2")

    def test_no_transient_rerun_after_the_flip_is_nobody(self):
        records = [self.rerun(1, 900, "transient", "w-1"), commit(2, 1, 1500)]
        self.assertIsNone(judge.flip_attribution({"kind": "grad_flip", "inject": 1.0}, records))

    def test_a_victim_that_registered_again_is_named_by_its_new_id(self):
        # Its process was fenced as hung and rejoined as w-5; the flip armed for the slot was
        # consumed under w-5. Another process's id is still a misattribution.
        log = ['{"level":"INFO","msg":"registered as w-3 of job-1 (chaos)"}',
               '{"level":"WARN","msg":"worker w-3 of job-1 was declared lost: register again"}',
               "I registered again as w-5 of job-1 (chaos)"]
        ids = judge.registered_worker_ids(log)
        self.assertEqual(ids, ["w-3", "w-5"])
        flip = {"victim_worker_id": "w-3", "attributed_to": "w-5"}
        self.assertTrue(judge.flip_attributed(flip, ids))
        self.assertFalse(judge.flip_attributed(dict(flip, attributed_to="w-4"), ids))
        self.assertFalse(judge.flip_attributed(dict(flip, attributed_to=None), ids))
        self.assertTrue(judge.flip_attributed({"victim_worker_id": "w-3",
                                               "attributed_to": "w-3"}, []))


class RecoveryTest(unittest.TestCase):
    def test_rank_fault_needs_a_newer_generation(self):
        records = [commit(1, 1, 1000), commit(2, 1, 2050), abort(2, 1, 9000),
                   commit(3, 2, 11000)]
        f = {"kind": "worker_kill", "inject": 2.0, "ref": 2.0}
        # The commit at 2.05 s was already under way: recovery is gen 2's first commit.
        self.assertAlmostEqual(judge.recovery(f, records), 9.0)

    def test_a_hang_counts_the_generation_that_fenced_the_rank(self):
        # The window in flight when the rank was held commits at once in the old generation;
        # the recovery is the first commit after the job re-formed without it.
        records = [commit(4, 1, 9990), commit(5, 1, 10020), commit(6, 2, 16000)]
        fault = {"kind": "hang", "inject": 10.0, "ref": 10.0}
        self.assertAlmostEqual(judge.recovery(fault, records), 6.0)

    def test_a_pause_counts_the_first_window_begun_after_it(self):
        # The window in flight commits the moment the coordinator runs again (t = 10.01);
        # the next one, begun at 10.05, is the one that shows the loop came back.
        records = [dict(commit(5, 1, 10010), window_seconds=6.0),
                   dict(commit(6, 1, 10080), window_seconds=0.03)]
        fault = {"kind": "coordinator_stop", "inject": 4.0, "ref": 10.0}
        self.assertAlmostEqual(judge.recovery(fault, records), 0.08)

    def test_coordinator_fault_counts_from_listening(self):
        records = [commit(1, 1, 1000), commit(2, 1, 5300)]
        f = {"kind": "coordinator_kill", "inject": 2.0, "ref": 5.0}
        self.assertAlmostEqual(judge.recovery(f, records), 0.3)
        self.assertIsNone(judge.recovery({"kind": "coordinator_kill", "inject": 6, "ref": 6},
                                         records))

    def test_percentile(self):
        self.assertIsNone(judge.percentile([], 50))
        self.assertEqual(judge.percentile([3, 1, 2], 50), 2)
        self.assertEqual(judge.percentile([1, 2, 3, 4], 100), 4)


class StorageFaultTest(unittest.TestCase):
    def corrupt(self):
        return {"kind": "checkpoint_corrupt", "number": 4, "damaged_checkpoint_id": 7,
                "generation_before": 2}

    def test_a_damaged_checkpoint_loaded_must_be_reported(self):
        gens = [gen(2, 1.0), gen(3, 5.0, rolled_back=True, ckpt=7),
                gen(4, 6.0, rolled_back=True, ckpt=6)]
        fault = self.corrupt()
        said = ['{"msg":"job j generation 3 ended: checkpoint 7 is damaged: ckpt-7/model..."}']
        self.assertIsNone(judge.storage_fault_problem(fault, gens, said))
        self.assertTrue(fault["damage_detected"])
        fault = self.corrupt()
        self.assertIn("never reported", judge.storage_fault_problem(fault, gens, []))
        # "checkpoint 17 is damaged" is not checkpoint 7's report.
        fault = self.corrupt()
        self.assertIn("never reported", judge.storage_fault_problem(
            fault, gens, ["checkpoint 17 is damaged"]))

    def test_a_damaged_checkpoint_never_loaded_is_a_note_not_a_failure(self):
        gens = [gen(2, 1.0), gen(3, 5.0, rolled_back=True, ckpt=8)]
        fault = self.corrupt()
        self.assertIsNone(judge.storage_fault_problem(fault, gens, []))
        self.assertIn("not loaded", fault["note"])

    def test_a_full_checkpoint_disk_must_be_reported(self):
        fault = {"kind": "checkpoint_full", "number": 2, "failure_reported": False}
        self.assertIn("no failed checkpoint write", judge.storage_fault_problem(fault, [], []))
        fault["failure_reported"] = True
        self.assertIsNone(judge.storage_fault_problem(fault, [], []))


class CampaignBoundsTest(unittest.TestCase):
    """chaos.judge_campaign: which phase each bound holds, and that a miss fails the verdict."""

    @staticmethod
    def fault(kind, commit_s, assigned_s=None, job=0):
        return {"kind": kind, "job": job, "recovery_s": commit_s,
                "phases": {"commit_s": commit_s, "assigned_s": assigned_s}}

    def judge(self, faults):
        import chaos
        return chaos.judge_campaign(faults, [{"job": 0, "pass": True, "problems": []}],
                                    [f["kind"] for f in faults], 10.0, True)

    def test_a_stopped_rank_is_held_to_its_replacement_not_the_commit(self):
        # The bound: "a SIGSTOPped worker is replaced within the lease". A bound on the commit
        # would fail a replacement at 9.9 s whose commit came at 10.1 s.
        per_kind, failures, _ = self.judge([self.fault("worker_stop", 10.1, assigned_s=9.9)])
        self.assertEqual(per_kind["worker_stop"]["over_bound"], 0)
        self.assertEqual(per_kind["worker_stop"]["over_1s"], 1)
        self.assertEqual(failures, [])
        per_kind, failures, bad = self.judge([self.fault("worker_stop", 10.4, assigned_s=10.2)])
        self.assertEqual(bad, ["worker_stop"])
        self.assertEqual(len(failures), 1)

    def test_a_kill_is_held_to_one_second_on_the_commit(self):
        per_kind, failures, bad = self.judge([self.fault("worker_kill", 1.2, assigned_s=0.4)])
        self.assertEqual(bad, ["worker_kill"])
        self.assertEqual(per_kind["worker_kill"]["bound_s"], 1.0)

    def test_restart_gap_kill_is_held_to_the_reconnect_grace_plus_one_second(self):
        per_kind, failures, bad = self.judge([self.fault("restart_gap_kill", 3.5)])
        self.assertEqual(per_kind["restart_gap_kill"]["bound_s"], 4.0)
        self.assertEqual((per_kind["restart_gap_kill"]["over_1s"], bad), (1, []))
        _, _, bad = self.judge([self.fault("restart_gap_kill", 10.4)])  # a whole lease
        self.assertEqual(bad, ["restart_gap_kill"])

    def test_a_fault_never_recovered_is_beyond_its_bound(self):
        _, failures, bad = self.judge([self.fault("worker_kill", 0.2),
                                       {"kind": "worker_kill", "job": 0, "stalled": True}])
        self.assertEqual(bad, ["worker_kill"])


if __name__ == "__main__":
    unittest.main()
