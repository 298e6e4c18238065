"""trainstep.Client against a fake coordinator: a JobService written here in Python on
127.0.0.1, scripted per test, so that retries, request ids, reconnection, paging and every
error class are exercised deterministically. The real coordinator is in
tests/integration/python_client_test.py.
"""

import json
import math
import os
import pathlib
import re
import sys
import tempfile
import threading
import time
import unittest
from concurrent import futures

try:
    import grpc
except ImportError as e:
    print(f"SKIP: {e}: install python3-grpcio and python3-protobuf", file=sys.stderr)
    sys.exit(77)

import trainstep
from trainstep import client as client_module
from trainstep.v1 import job_service_pb2 as pb
from trainstep.v1 import job_service_pb2_grpc as pb_grpc
from trainstep.v1 import types_pb2

SOURCE_DIR = os.environ.get("TRAINSTEP_SOURCE_DIR",
                            str(pathlib.Path(__file__).resolve().parents[4]))

SPEC = {"model": {"mlp": {}}, "data": {"synthetic_regression": {}}}


def job(state=types_pb2.RUNNING, message="", job_id="job-7"):
    return types_pb2.Job(job_id=job_id, state=state, message=message)


def record(window, generation=1, outcome="commit", **fields):
    return types_pb2.UpdateRecord(window_id=window, generation=generation, outcome=outcome,
                                  optimizer_update_id=window, **fields)


def wait_inactive(context, limit=30):
    """Blocks until the client cancels the call or its deadline passes (bounded)."""
    give_up = time.monotonic() + limit
    while context.is_active() and time.monotonic() < give_up:
        time.sleep(0.01)


class FakeJobService(pb_grpc.JobServiceServicer):
    """Records every request; each test sets what the calls answer."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests = {}  # method -> [request]
        self.submit_failures = 0  # the first N SubmitJob calls answer UNAVAILABLE
        # method -> (code, details[, from_coordinator=True]), answered to every call; the
        # coordinator's own errors carry its ErrorStatus detail, gRPC's own (False) none.
        self.errors = {}
        self.delay = 0  # seconds GetJob takes
        self.records = []
        self.throughput = None  # GetJob answers with it when set
        self.watch_streams = []  # generator functions (request, context), one per WatchJob
        self.watch_ended = threading.Event()

    def _record(self, method, request, context):
        with self.lock:
            self.requests.setdefault(method, []).append(request)
        if method in self.errors:
            code, details, *own = self.errors[method]
            if own == [] or own[0]:
                detail = types_pb2.ErrorStatus(code=code.value[0], message=details)
                context.set_trailing_metadata(
                    (("grpc-status-details-bin", detail.SerializeToString()),))
            context.abort(code, details)

    def SubmitJob(self, request, context):
        self._record("SubmitJob", request, context)
        if len(self.requests["SubmitJob"]) <= self.submit_failures:
            context.abort(grpc.StatusCode.UNAVAILABLE, "restarting")
        return job(types_pb2.PENDING)

    def GetJob(self, request, context):
        self._record("GetJob", request, context)
        time.sleep(self.delay)
        answer = job(job_id=request.job_id)
        if self.throughput is not None:
            answer.throughput.CopyFrom(self.throughput)
        return answer

    def ListJobs(self, request, context):
        self._record("ListJobs", request, context)
        return pb.ListJobsResponse(jobs=[job(job_id="job-1"), job(job_id="job-2")])

    def CancelJob(self, request, context):
        self._record("CancelJob", request, context)
        return job(types_pb2.CANCELLED, "cancelled by the user", request.job_id)

    def ListUpdates(self, request, context):
        self._record("ListUpdates", request, context)
        start = int(request.page_token or 0)
        end = start + request.page_size
        return pb.ListUpdatesResponse(
            updates=self.records[start:end],
            next_page_token=str(end) if end < len(self.records) else "")

    def WatchJob(self, request, context):
        self._record("WatchJob", request, context)
        with self.lock:  # the last stream serves every further call
            stream = self.watch_streams.pop(0) if len(self.watch_streams) > 1 \
                else self.watch_streams[0]
        try:
            yield from stream(request, context)
        finally:
            self.watch_ended.set()


class ClientTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeJobService()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pb_grpc.add_JobServiceServicer_to_server(self.fake, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.address = f"127.0.0.1:{port}"
        self.client = trainstep.Client(self.address, timeout=20)
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.client.close()
        self.server.stop(0)
        self.tmp.cleanup()

    def calls(self, method):
        return self.fake.requests.get(method, [])

    # Catches: a retry that generates a new request id (a second job after a lost answer),
    # retries only as many as the channel's five attempts, or one id shared by two submits.
    def test_submit_retries_unavailable_with_one_request_id(self):
        self.fake.submit_failures = 7
        self.assertEqual(self.client.submit(SPEC), "job-7")
        ids = [r.request_id for r in self.calls("SubmitJob")]
        self.assertEqual(len(ids), 8)
        self.assertEqual(len(set(ids)), 1, ids)
        self.assertTrue(ids[0].startswith("py-"), ids[0])
        self.client.submit(SPEC)
        self.assertNotEqual(self.calls("SubmitJob")[-1].request_id, ids[0])
        self.client.submit(SPEC, request_id="mine")
        self.assertEqual(self.calls("SubmitJob")[-1].request_id, "mine")
        # Cancel: one id per call too, resent as is.
        self.client.cancel("job-7")
        self.client.cancel("job-7")
        cancel_ids = [r.request_id for r in self.calls("CancelJob")]
        self.assertEqual(len(set(cancel_ids)), 2)

    # Catches: a spec file not sent byte for byte (the coordinator's errors point into it),
    # a dict turned into invalid JSON (NaN) or refused for a path, a bad value without the
    # field, or a spec over the limit sent anyway.
    def test_submit_reads_and_checks_specs(self):
        path = os.path.join(self.tmp.name, "spec.json")
        text = '{"model": {"mlp": {}},\n "data": {"synthetic_regression": {}}, "name": "é"}\n'
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        self.client.submit(path)
        self.client.submit(pathlib.Path(path))
        self.assertEqual([r.spec_json for r in self.calls("SubmitJob")], [text, text])

        self.client.submit({"name": "x", "clip": {"max_grad_norm": math.nan},
                            "optimizer": {"sgd": {"lr": math.inf}},
                            "data": {"text": {"paths": [pathlib.Path("/c"), "/d"]}}})
        sent = json.loads(self.calls("SubmitJob")[-1].spec_json)
        self.assertEqual(sent["clip"]["max_grad_norm"], "NaN")  # protobuf's JSON spelling
        self.assertEqual(sent["optimizer"]["sgd"]["lr"], "Infinity")
        self.assertEqual(sent["data"]["text"]["paths"], ["/c", "/d"])

        sent_before = len(self.calls("SubmitJob"))
        with self.assertRaises(trainstep.InvalidSpec) as e:
            self.client.submit({"data": {"text": {"paths": [{"/c"}]}}})
        self.assertEqual(str(e.exception),
                         "data.text.paths[0]: set cannot be written as JSON, got {'/c'}")
        with self.assertRaises(trainstep.InvalidSpec) as e:
            self.client.submit({"name": "x" * (4 * 1024 * 1024)})
        self.assertRegex(str(e.exception),
                         r"^the spec \(a dict\) is 4194316 bytes \(4\.0 MiB\); the coordinator "
                         r"accepts requests of at most 4194304 bytes \(4\.0 MiB\): refer to "
                         r"large data by path instead of inlining it$")
        self.assertEqual(e.exception.exit_code, 2)
        with self.assertRaises(trainstep.InvalidSpec) as e:
            self.client.submit(self.tmp.name)
        self.assertEqual(str(e.exception),
                         f"cannot read SPEC file \"{self.tmp.name}\": it is a directory")
        missing = os.path.join(self.tmp.name, "missing.json")
        with self.assertRaises(trainstep.InvalidSpec) as e:
            self.client.submit(missing)
        self.assertEqual(str(e.exception),
                         f"cannot read SPEC file \"{missing}\": No such file or directory")
        latin = os.path.join(self.tmp.name, "latin1.json")
        with open(latin, "wb") as f:
            f.write(b'{"name": "caf\xe9"}')
        with self.assertRaises(trainstep.InvalidSpec) as e:
            self.client.submit(latin)
        self.assertEqual(str(e.exception),
                         f"SPEC file \"{latin}\" is not UTF-8 text: byte 13 is 0xe9")
        self.assertEqual(len(self.calls("SubmitJob")), sent_before)  # none of them was sent
        with self.assertRaises(TypeError):
            self.client.submit(42)

    # Catches: a status mapped to another class or exit code than the CLI's (client/commands.cc
    # ReportRpcError), an INVALID_ARGUMENT outside submit called a spec error, or a call that
    # hangs past its timeout.
    def test_errors_are_the_clis_classes(self):
        C = grpc.StatusCode
        cases = [
            ("SubmitJob", C.INVALID_ARGUMENT, "batch.micro_batch_size must be ≥ 1, got 0",
             trainstep.InvalidSpec, "batch.micro_batch_size must be ≥ 1, got 0"),
            ("SubmitJob", C.ALREADY_EXISTS, "request_id \"r\" was already used",
             trainstep.RequestIdConflict, "request_id \"r\" was already used"),
            ("SubmitJob", C.RESOURCE_EXHAUSTED, "Received message larger than max (5 vs. 4)",
             trainstep.InvalidSpec, "the request is larger than the coordinator accepts (bytes "
             "sent vs. its limit): Received message larger than max (5 vs. 4)", False),
            # gRPC's size limit told by the missing detail, whatever its words.
            ("SubmitJob", C.RESOURCE_EXHAUSTED, "too big", trainstep.InvalidSpec,
             "the request is larger than the coordinator accepts (bytes sent vs. its limit): "
             "too big", False),
            # The coordinator's own limit, even in the words of gRPC's.
            ("SubmitJob", C.RESOURCE_EXHAUSTED, "larger than max", trainstep.TrainstepError,
             "larger than max"),
            ("GetJob", C.INVALID_ARGUMENT, "job_id is required", trainstep.InvalidArgument,
             "job_id is required"),
            ("GetJob", C.NOT_FOUND, "no job job-9 (trainstep job list shows them)",
             trainstep.NotFound, "no job job-9 (trainstep job list shows them)"),
            ("GetJob", C.RESOURCE_EXHAUSTED, "quota", trainstep.TrainstepError, "quota"),
            ("GetJob", C.INTERNAL, "", trainstep.TrainstepError,
             "call failed with gRPC code INTERNAL"),
            ("GetJob", C.PERMISSION_DENIED, "vic may not", trainstep.PermissionDenied,
             "permission denied: vic may not"),
            ("GetJob", C.UNAUTHENTICATED, "GetJob needs a credential", trainstep.Unauthenticated,
             "not authenticated: GetJob needs a credential"),
        ]
        for method, code, details, cls, message, *own in cases:
            with self.subTest(method=method, code=code, details=details):
                self.fake.errors = {method: (code, details, *own)}
                with self.assertRaises(trainstep.TrainstepError) as e:
                    if method == "SubmitJob":
                        self.client.submit(SPEC)
                    else:
                        self.client.get("job-9")
                self.assertIs(type(e.exception), cls)
                self.assertEqual(str(e.exception), message)
                self.assertEqual(e.exception.code, code)
        self.assertFalse(issubclass(trainstep.InvalidArgument, trainstep.InvalidSpec))

        # UNAVAILABLE for good: retried until the timeout, then Unavailable with the hint.
        self.fake.errors = {"ListJobs": (C.UNAVAILABLE, "down")}
        with trainstep.Client(self.address, timeout=1) as short:
            with self.assertRaises(trainstep.Unavailable) as e:
                short.list()
        self.assertEqual(str(e.exception),
                         f"coordinator at {self.address} is not reachable: start it with "
                         f"`trainstep-coordinator --listen {self.address}`, or pass "
                         "Client(address=...) / set TRAINSTEP_COORDINATOR")
        self.assertGreater(len(self.calls("ListJobs")), 1)
        # A watch too, although its stream has no deadline.
        self.fake.errors = {"WatchJob": (C.UNAVAILABLE, "down")}
        with trainstep.Client(self.address, timeout=1) as short:
            with self.assertRaises(trainstep.Unavailable):
                list(short.watch("job-1"))
        self.assertGreater(len(self.calls("WatchJob")), 1)
        # No answer in time.
        self.fake.errors = {}
        self.fake.delay = 5
        with trainstep.Client(self.address, timeout=0.3) as short:
            with self.assertRaises(trainstep.Unavailable) as e:
                short.get("job-1")
        self.assertIn(f"coordinator at {self.address} did not answer within 0.3s (timeout)",
                      str(e.exception))
        self.assertEqual(e.exception.code, C.DEADLINE_EXCEEDED)

    # Catches: the classes' exit codes drifting from the CLI's (client/args.h ExitCode).
    def test_exit_codes_are_the_clis(self):
        with open(os.path.join(SOURCE_DIR, "client", "args.h")) as f:
            codes = dict(re.findall(r"(kExit\w+) = (\d+)", f.read()))
        expected = {
            trainstep.TrainstepError: "kExitError", trainstep.InvalidArgument: "kExitUsage",
            trainstep.InvalidSpec: "kExitUsage", trainstep.RequestIdConflict: "kExitUsage",
            trainstep.Unavailable: "kExitUnavailable", trainstep.NotFound: "kExitNotFound",
            trainstep.JobFailed: "kExitJobFailed", trainstep.JobCancelled: "kExitJobCancelled",
            trainstep.NoProgress: "kExitNoProgress", trainstep.Unauthenticated: "kExitDenied",
            trainstep.PermissionDenied: "kExitDenied",
        }
        for cls, name in expected.items():
            self.assertEqual(cls.exit_code, int(codes[name]), cls.__name__)
        self.assertEqual(set(expected.values()), set(codes) - {"kExitOk"})

    # Catches: a default address, message limit or channel behaviour (keepalive, reconnect
    # backoff, which codes are retried) that differs from the C++ clients' (common/address.h,
    # common/channel.*).
    def test_defaults_are_the_cpp_clients(self):
        with open(os.path.join(SOURCE_DIR, "common", "address.h")) as f:
            self.assertIn(f'kDefaultCoordinator[] = "{trainstep.DEFAULT_ADDRESS}"', f.read())
        with open(os.path.join(SOURCE_DIR, "common", "channel.h")) as f:
            factors = re.search(r"kMaxMessageBytes = ([\d *]+);", f.read()).group(1).split("*")
        self.assertEqual(client_module.MAX_MESSAGE_BYTES, math.prod(int(x) for x in factors))
        with open(os.path.join(SOURCE_DIR, "common", "channel.cc")) as f:
            cc = f.read()
        service_config = re.search(r'kServiceConfig\[\] = R"\((.*?)\)";', cc, re.S).group(1)
        policy = json.loads(service_config)["methodConfig"][0]["retryPolicy"]
        self.assertEqual([c.name for c in client_module._RETRYABLE], policy["retryableStatusCodes"])
        cpp_options = {"grpc." + name.lower(): int(value)
                       for name, value in re.findall(r"args\.SetInt\(GRPC_ARG_(\w+), (\d+)\)", cc)}
        self.assertEqual(cpp_options.pop("grpc.enable_retries"), 1)  # gRPC's default
        self.assertEqual(dict(client_module._CHANNEL_OPTIONS), cpp_options)

        os.environ["TRAINSTEP_COORDINATOR"] = "10.1.2.3:99"
        try:
            self.assertEqual(trainstep.Client().address, "10.1.2.3:99")
            os.environ["TRAINSTEP_COORDINATOR"] = ""
            self.assertEqual(trainstep.Client().address, "127.0.0.1:7070")
            del os.environ["TRAINSTEP_COORDINATOR"]
            self.assertEqual(trainstep.Client().address, "127.0.0.1:7070")
            self.assertEqual(trainstep.Client("h:1").address, "h:1")
        finally:
            os.environ.pop("TRAINSTEP_COORDINATOR", None)
        for bad in ({"address": ""}, {"timeout": 0}, {"timeout": -1}, {"timeout": math.nan},
                    {"timeout": "10"}):
            with self.assertRaises(ValueError, msg=str(bad)):
                trainstep.Client(**{"address": "h:1", **bad})

    # Catches: get/list/cancel not returning protobuf's JSON mapping with every field (the
    # shape `trainstep job get -o json` prints; compared for real in the integration test).
    def test_jobs_are_protobufs_json_mapping(self):
        got = self.client.get("job-3")
        self.assertEqual(got["job_id"], "job-3")
        self.assertEqual(got["state"], "RUNNING")
        self.assertEqual(got["submit_time_ms"], "0")  # int64: a string, every field present
        self.assertEqual(got["message"], "")
        self.assertEqual([j["job_id"] for j in self.client.list()], ["job-1", "job-2"])
        cancelled = self.client.cancel("job-4")
        self.assertEqual((cancelled["state"], cancelled["message"]),
                         ("CANCELLED", "cancelled by the user"))

    # Catches: logs that stop after the first page, lose or reorder records, or render a
    # record unlike `job logs -o jsonl` (non-finite numbers, int64, key order).
    def test_logs_pages_and_records(self):
        self.fake.records = [record(w, loss=0.5 * w) for w in range(1, 8)]
        self.fake.records[2].grad_norm_pre_clip = math.inf
        self.fake.records[3].loss = math.nan
        out = list(self.client.logs("job-7", page_size=3))
        self.assertEqual([r["window_id"] for r in out], list(range(1, 8)))
        self.assertEqual([r.page_token for r in self.calls("ListUpdates")], ["", "3", "6"])
        self.assertEqual(list(out[0]), [f.name for f in types_pb2.UpdateRecord.DESCRIPTOR.fields])
        self.assertIsNone(out[2]["grad_norm_pre_clip"])
        self.assertIsNone(out[3]["loss"])
        self.assertEqual(out[4]["loss"], 2.5)
        self.assertIsInstance(out[0]["cumulative_tokens"], int)
        self.assertEqual(json.loads(json.dumps(out[2]))["grad_norm_pre_clip"], None)
        # Unset optional fields are None, set ones (even 0) their value; nested messages and
        # repeated fields as dicts and lists with int64 as int (as RecordToJson writes them).
        self.assertIsNone(out[0]["grad_norm_scaled"])
        self.assertIsNone(out[0]["dropped_tail"])
        self.fake.records[0].grad_norm_scaled = 0.0
        self.fake.records[0].dropped_tail.epoch = 3
        self.fake.records[0].dropped_tail.sample_ids.extend([1 << 40, 2])
        first = next(iter(self.client.logs("job-7")))
        self.assertEqual(first["grad_norm_scaled"], 0.0)
        self.assertEqual(first["dropped_tail"],
                         {"epoch": 3, "samples": 0, "first_position": 0,
                          "sample_ids": [1 << 40, 2]})

    # Catches: an update that was not evaluated reading eval_loss 0.0 (protobuf's default for an
    # unset optional double) instead of None, or an evaluated one losing its value.
    def test_records_carry_eval_loss_only_when_evaluated(self):
        self.fake.records = [record(1), record(2)]
        self.fake.records[1].eval_loss = 2.25
        self.fake.records[1].eval_valid_tokens = 4096
        out = list(self.client.logs("job-7"))
        self.assertIsNone(out[0]["eval_loss"])
        self.assertEqual(out[0]["eval_valid_tokens"], 0)
        self.assertEqual(out[1]["eval_loss"], 2.25)
        self.assertEqual(out[1]["eval_valid_tokens"], 4096)

    # Catches: the coordinator's throughput (tokens/s, updates/s, ETA) missing from get().
    def test_get_exposes_throughput(self):
        self.fake.throughput = types_pb2.Throughput(tokens_per_second=1500.0, updates_per_second=2.5,
                                             windows_per_second=2.5, span_seconds=60.0,
                                             eta_seconds=12.0)
        got = self.client.get("job-3")["throughput"]
        self.assertEqual(got["tokens_per_second"], 1500.0)
        self.assertEqual(got["updates_per_second"], 2.5)
        self.assertEqual(got["eta_seconds"], 12.0)

    # Catches: a broken stream (coordinator restart) ending the watch, a resumed stream
    # repeating records, a retried window (same id, next generation) dropped as a duplicate,
    # or a resume that starts from the beginning.
    def test_watch_resumes_a_broken_stream_without_repeating(self):
        def first(request, context):
            yield pb.WatchJobEvent(job=job())
            for r in (record(1), record(2), record(3, outcome="abort")):
                yield pb.WatchJobEvent(update=r)
            context.abort(grpc.StatusCode.UNAVAILABLE, "coordinator restarting")

        def second(request, context):
            yield pb.WatchJobEvent(job=job())
            for r in (record(3, outcome="abort"), record(3, generation=2), record(4, 2)):
                yield pb.WatchJobEvent(update=r)
            yield pb.WatchJobEvent(job=job(types_pb2.SUCCEEDED))

        self.fake.watch_streams = [first, second]
        out = []
        gen = self.client.watch("job-7")
        while True:
            try:
                out.append(next(gen))
            except StopIteration as stop:
                final = stop.value
                break
        self.assertEqual([(r["generation"], r["window_id"], r["outcome"]) for r in out],
                         [(1, 1, "commit"), (1, 2, "commit"), (1, 3, "abort"), (2, 3, "commit"),
                          (2, 4, "commit")])
        calls = self.calls("WatchJob")
        self.assertEqual([r.from_window_id for r in calls], [0, 0])
        self.assertEqual([(r.HasField("after"), r.after.generation, r.after.window_id)
                          for r in calls], [(False, 0, 0), (True, 1, 3)])
        self.assertEqual(final["state"], "SUCCEEDED")

    # Catches: a resume by window id alone (from_window_id), which skips a rollback's records
    # (their window ids restart below the last one seen): here generation 2's evaluated update 2.
    def test_watch_resumes_exactly_after_the_last_record_across_a_rollback(self):
        log = [record(1), record(2, eval_loss=2.5), record(3, outcome="abort"),
               record(2, generation=2, eval_loss=2.25), record(3, generation=2)]
        positions = [(r.generation, r.window_id) for r in log]

        def first(request, context):
            yield pb.WatchJobEvent(job=job())
            for r in log[:3]:
                yield pb.WatchJobEvent(update=r)
            context.abort(grpc.StatusCode.UNAVAILABLE, "coordinator restarting")

        def rest(request, context):
            # The coordinator's rule: after `after` when set, else from from_window_id on.
            if request.HasField("after"):
                at = positions.index((request.after.generation, request.after.window_id))
                sent = log[at + 1:]
            else:
                sent = [r for r in log if r.window_id >= request.from_window_id]
            yield pb.WatchJobEvent(job=job())
            for r in sent:
                yield pb.WatchJobEvent(update=r)
            yield pb.WatchJobEvent(job=job(types_pb2.SUCCEEDED))

        self.fake.watch_streams = [first, rest]
        out = list(self.client.watch("job-7"))
        self.assertEqual([(r["generation"], r["window_id"]) for r in out], positions)
        self.assertEqual([r["eval_loss"] for r in out], [None, 2.5, None, 2.25, None])

    # Catches: a failed or cancelled job ending the watch silently (a script would carry on
    # as if it trained), the records before the end lost, or the final job not attached.
    def test_watch_raises_after_the_last_record_of_a_failed_or_cancelled_job(self):
        for state, cls, code in ((types_pb2.FAILED, trainstep.JobFailed, 5),
                                 (types_pb2.CANCELLED, trainstep.JobCancelled, 6)):
            def stream(request, context, state=state):
                yield pb.WatchJobEvent(job=job())
                yield pb.WatchJobEvent(update=record(1))
                yield pb.WatchJobEvent(job=job(state, "/d/train.bin: token 5 is 300"))

            self.fake.watch_streams = [stream]
            seen = []
            with self.assertRaises(cls) as e:
                for r in self.client.watch("job-7"):
                    seen.append(r["window_id"])
            self.assertEqual(seen, [1])
            self.assertEqual(e.exception.exit_code, code)
            self.assertEqual(e.exception.job["state"], types_pb2.JobState.Name(state))
            self.assertEqual(str(e.exception), f"job-7 {types_pb2.JobState.Name(state)}: "
                                               "/d/train.bin: token 5 is 300")
        # A stream that ends before the job does is an error, not a success.
        self.fake.watch_streams = [lambda request, context: iter([pb.WatchJobEvent(job=job())])]
        with self.assertRaises(trainstep.TrainstepError) as e:
            list(self.client.watch("job-7"))
        self.assertEqual(str(e.exception), "the watch of job-7 ended before the job did")

    # Catches: no_progress_timeout never firing on a silent job.
    def test_watch_no_progress_timeout(self):
        def silent(request, context):
            yield pb.WatchJobEvent(job=job())
            wait_inactive(context)

        self.fake.watch_streams = [silent]
        with self.assertRaises(trainstep.NoProgress) as e:
            list(self.client.watch("job-7", no_progress_timeout=0.3))
        self.assertEqual(e.exception.exit_code, 7)
        self.assertTrue(str(e.exception).startswith(
            "job-7 made no progress for 0.3s (no_progress_timeout): it is RUNNING"),
            str(e.exception))

    # Catches: no_progress_timeout firing although the job made progress during the stream
    # (the stream's deadline passed, the job did not stall). The fake ends the stream with the
    # deadline's status itself, so that this does not depend on how fast a loaded machine runs.
    def test_watch_resumes_after_a_deadline_with_progress(self):
        def progress_then_deadline(request, context):
            yield pb.WatchJobEvent(job=job())
            yield pb.WatchJobEvent(update=record(1))
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

        def done(request, context):
            yield pb.WatchJobEvent(update=record(2))
            yield pb.WatchJobEvent(job=job(types_pb2.SUCCEEDED))

        self.fake.watch_streams = [progress_then_deadline, done]
        out = list(self.client.watch("job-7", no_progress_timeout=60))
        self.assertEqual([r["window_id"] for r in out], [1, 2])
        self.assertEqual([(r.after.generation, r.after.window_id) for r in self.calls("WatchJob")],
                         [(0, 0), (1, 1)])

    # Catches: a caller that stops iterating leaving the stream open on the coordinator.
    def test_stopping_a_watch_cancels_the_stream(self):
        def endless(request, context):
            yield pb.WatchJobEvent(job=job())
            yield pb.WatchJobEvent(update=record(1))
            wait_inactive(context)

        self.fake.watch_streams = [endless]
        gen = self.client.watch("job-7")
        self.assertEqual(next(gen)["window_id"], 1)
        gen.close()
        self.assertTrue(self.fake.watch_ended.wait(20))


if __name__ == "__main__":
    unittest.main()
