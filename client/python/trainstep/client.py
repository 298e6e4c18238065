"""`trainstep.Client`: the JobService of a trainstep coordinator from Python.

What the `trainstep` CLI does, as functions that return dicts: submit, get, list, cancel,
watch and logs, with the CLI's defaults (address, timeout, retries) and its error classes
(trainstep.errors). Thread-safe: one Client (one gRPC channel) may serve many threads.
"""

import math
import os
import pathlib
import random
import time
import uuid

import grpc

try:
    from trainstep.v1 import job_service_pb2 as _pb
    from trainstep.v1 import job_service_pb2_grpc as _grpc
    from trainstep.v1 import types_pb2 as _types
except ImportError as e:  # pragma: no cover - only without a build
    raise ImportError(
        "trainstep's generated stubs (trainstep/v1/*_pb2.py) are missing: run `make build` "
        "(or `cmake --build build --target trainstep_python_proto`), which writes them into "
        f"client/python/trainstep/v1/ ({e})") from e

from trainstep import errors
from trainstep._security import Security
from trainstep._convert import message_to_dict, record_to_dict, spec_to_json

# Same as the CLI and the workers (common/address.h kDefaultCoordinator).
DEFAULT_ADDRESS = "127.0.0.1:7070"
# The coordinator's receive limit (common/channel.h kMaxMessageBytes).
MAX_MESSAGE_BYTES = 4 * 1024 * 1024

# The channel of the C++ clients (common/channel.cc MakeChannel): keepalive 30 s /
# 10 s, quick reconnection after a coordinator restart, gRPC's transparent retries (on by
# default). Their service-config retry policy (UNAVAILABLE, 5 attempts) is replaced by
# Client's own loop, which retries the same codes until the call's timeout: inside the
# channel, retries that outlast the deadline end in DEADLINE_EXCEEDED, and "not reachable"
# could not be told from "does not answer".
_RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)
_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 30000),
    ("grpc.keepalive_timeout_ms", 10000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 250),
]

_ENDED = (_types.SUCCEEDED, _types.FAILED, _types.CANCELLED)
_WATCH_RETRY_DELAY = 0.5  # between reconnection attempts of a broken watch stream


def _seconds(s):
    return f"{s:g}s"


def _mib(n):
    return f"{n / 1048576:.1f} MiB"


def _from_coordinator(e):
    """Whether the coordinator answered this error itself: it sends a trainstep.v1.ErrorStatus
    in the details (common/grpc_status.h IsCoordinatorError); gRPC's own errors of the same
    code (a message over the size limit) carry none. Never told apart by the words."""
    for key, value in e.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            detail = _types.ErrorStatus()
            try:
                detail.ParseFromString(value)
            except Exception:  # not ours
                return False
            return detail.code == e.code().value[0]
    return False


class Client:
    """A connection to one coordinator.

    address: "host:port"; default $TRAINSTEP_COORDINATOR, else 127.0.0.1:7070 (as the CLI).
    timeout: seconds each call may take (the CLI's --timeout, default 10). Within it, calls
      that find no coordinator (UNAVAILABLE) are retried with backoff; a submit or cancel
      retries with the same request id, so a retry never creates a second job.
    tls_ca, tls_cert, tls_key: PEM files, as the CLI's --tls-ca, --tls-cert, --tls-key
      (defaults $TRAINSTEP_TLS_CA, $TRAINSTEP_TLS_CERT, $TRAINSTEP_TLS_KEY). With tls_ca the
      channel is TLS, the coordinator verified against it; tls_cert and tls_key add a client
      certificate (mTLS). Without any: plaintext.
    token / token_file: a bearer token sent on every call (default $TRAINSTEP_TOKEN), as the
      CLI's --token-file; needs tls_ca. Bad options raise InvalidArgument, as the CLI's exit 2.

    Use as a context manager, or call close(), to release the channel.
    """

    def __init__(self, address=None, *, timeout=10.0, tls_ca=None, tls_cert=None, tls_key=None,
                 token=None, token_file=None):
        if address is None:
            address = os.environ.get("TRAINSTEP_COORDINATOR") or DEFAULT_ADDRESS
        if not isinstance(address, str) or not address:
            raise ValueError(f"address must be a non-empty \"host:port\", got {address!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or \
                not math.isfinite(timeout) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.address = address
        self.timeout = float(timeout)
        self._security = Security(tls_ca, tls_cert, tls_key, token, token_file)
        self._channel = self._security.channel(address, _CHANNEL_OPTIONS)
        self._stub = _grpc.JobServiceStub(self._channel)

    def __repr__(self):
        return f"trainstep.Client({self.address!r}, timeout={self.timeout:g})"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._channel.close()

    # ------------------------------------------------------------------------------------
    # The calls

    def submit(self, spec, request_id=None):
        """Submits a job; returns its id ("job-3").

        spec: a dict (the JSON spec as Python values; os.PathLike values become strings), or
          the path of a JSON file (str or pathlib.Path), sent as is so the coordinator's
          errors point into it.
        request_id: makes the submit idempotent (AIP-155): the same id with the same spec
          returns the job the first submit created, also after a coordinator restart; with
          another spec it raises RequestIdConflict. Default: a fresh id per call, reused by
          this call's own retries.
        Raises InvalidSpec naming the field ("batch.accumulation_steps must be ≥ 1, got 0").
        """
        spec_json, what = self._read_spec(spec)
        request = _pb.SubmitJobRequest(
            request_id=request_id if request_id is not None else f"py-{uuid.uuid4().hex}",
            spec_json=spec_json)
        size = request.ByteSize()
        if size > MAX_MESSAGE_BYTES:
            n = len(spec_json.encode())
            raise errors.InvalidSpec(
                f"the spec {what} is {n} bytes ({_mib(n)}); the coordinator accepts requests of "
                f"at most {MAX_MESSAGE_BYTES} bytes ({_mib(MAX_MESSAGE_BYTES)}): refer to large "
                "data by path instead of inlining it")
        return self._unary("SubmitJob", request, submitting=True).job_id

    def get(self, job_id):
        """The job: exactly the mapping `trainstep job get ID -o json` prints (state, progress,
        the resolved spec with every default; 64-bit integers are strings, as protobuf's JSON
        mapping writes them). job["throughput"] holds tokens_per_second, updates_per_second and
        eta_seconds over the job's last minute; job["progress"]["last_eval_loss"] the latest
        held-out loss of a job with spec.eval."""
        return message_to_dict(self._unary("GetJob", _pb.GetJobRequest(job_id=job_id)))

    def list(self):
        """Every job, as `trainstep job list -o json` prints them. The coordinator pages the
        list so that each response fits gRPC's message limit; every page is fetched."""
        jobs = []
        token = ""
        while True:
            response = self._unary("ListJobs", _pb.ListJobsRequest(page_token=token))
            jobs.extend(message_to_dict(job) for job in response.jobs)
            if not response.next_page_token:
                return jobs
            if response.next_page_token == token:
                raise errors.TrainstepError("the coordinator returned the same page token twice")
            token = response.next_page_token

    def cancel(self, job_id):
        """Cancels the job; returns it (as get does). Cancelling an ended job changes nothing."""
        request = _pb.CancelJobRequest(job_id=job_id, request_id=f"py-{uuid.uuid4().hex}")
        return message_to_dict(self._unary("CancelJob", request))

    def logs(self, job_id, *, page_size=1000):
        """Yields the job's per-update records so far, oldest first, one dict per ended window,
        as `trainstep job logs ID -o jsonl` prints them (64-bit integers as numbers, None for
        a non-finite value; "eval_loss" is None on updates that were not evaluated). Pages are fetched as the iteration needs them."""
        token = ""
        while True:
            response = self._unary("ListUpdates", _pb.ListUpdatesRequest(
                job_id=job_id, page_size=page_size, page_token=token))
            for record in response.updates:
                yield record_to_dict(record)
            token = response.next_page_token
            if not token:
                return

    def watch(self, job_id, *, no_progress_timeout=None):
        """Yields the job's per-update records (as logs does) from its first window on, then
        each new one as it ends, until the job ends; the generator's return value is the final
        job. Like `trainstep job watch`:
          * a job that FAILED or was CANCELLED raises JobFailed / JobCancelled once every
            record was yielded (the exception's `job` holds the final job);
          * a coordinator that cannot be reached, or a broken stream (a coordinator restart),
            is retried for up to `timeout` seconds, resuming after the last record seen
            without repeating one;
          * no_progress_timeout (seconds): raise NoProgress when the job shows neither a new
            state nor a new update for that long; None waits as long as the job runs.
        """
        last_record = None  # (generation, window_id) of the newest record yielded
        job = None  # the latest Job event
        last_job_bytes = None
        last_progress = time.monotonic()
        broken_since = None
        said = None  # the failure to report if the stream stays broken
        while True:
            # Resume right after the last record yielded (exact, by generation and window).
            request = _pb.WatchJobRequest(job_id=job_id)
            if last_record is not None:
                request.after.generation, request.after.window_id = last_record
            deadline = None
            if no_progress_timeout is not None:
                deadline = max(last_progress + no_progress_timeout - time.monotonic(), 0.001)
            call = self._stub.WatchJob(request, timeout=deadline)
            try:
                for event in call:
                    broken_since = None
                    said = None
                    if event.HasField("job"):
                        seen = event.job.SerializeToString(deterministic=True)
                        if seen != last_job_bytes:
                            last_job_bytes = seen
                            last_progress = time.monotonic()
                        job = event.job
                    elif event.HasField("update"):
                        r = event.update
                        # Records arrive in log order, (generation, window_id) increasing: one
                        # not after the last (an older coordinator resends the log) is a duplicate.
                        key = (r.generation, r.window_id)
                        if last_record is not None and key <= last_record:
                            continue
                        last_record = key
                        last_progress = time.monotonic()
                        yield record_to_dict(r)
                break
            except grpc.RpcError as e:
                code = e.code()
                if code == grpc.StatusCode.DEADLINE_EXCEEDED and no_progress_timeout is not None:
                    if time.monotonic() - last_progress < no_progress_timeout:
                        continue  # progress since the stream started: resume
                    raise self._no_progress(job_id, job, no_progress_timeout) from None
                # CANCELLED: the coordinator shut down under the stream (this client cancels
                # only when the caller stops iterating, and then nothing is raised).
                if code in _RETRYABLE or code == grpc.StatusCode.CANCELLED:
                    if broken_since is None:
                        broken_since = time.monotonic()
                    said = self._telling(said, e)
                    if time.monotonic() - broken_since < self.timeout:
                        time.sleep(_WATCH_RETRY_DELAY)
                        continue
                    e = said
                raise self._error(e) from None
            finally:
                call.cancel()  # no-op when it ended; frees it when the caller stops early

        if job is None or job.state not in _ENDED:
            raise errors.TrainstepError(f"the watch of {job_id} ended before the job did")
        final = message_to_dict(job)
        state = _types.JobState.Name(job.state)
        summary = f"{job.job_id} {state}" + (f": {job.message}" if job.message else "")
        if job.state == _types.FAILED:
            raise errors.JobFailed(summary, final)
        if job.state == _types.CANCELLED:
            raise errors.JobCancelled(summary, final)
        return final

    # ------------------------------------------------------------------------------------
    # Helpers

    def _read_spec(self, spec):
        """(JSON text, how to name it in messages)."""
        if isinstance(spec, dict):
            try:
                return spec_to_json(spec), "(a dict)"
            except TypeError as e:
                raise errors.InvalidSpec(str(e)) from None
        if isinstance(spec, (str, pathlib.PurePath)):
            path = os.fspath(spec)
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except IsADirectoryError:
                raise errors.InvalidSpec(
                    f"cannot read SPEC file \"{path}\": it is a directory") from None
            except OSError as e:
                raise errors.InvalidSpec(
                    f"cannot read SPEC file \"{path}\": {e.strerror or e}") from None
            try:
                return data.decode("utf-8"), f"\"{path}\""
            except UnicodeDecodeError as e:
                raise errors.InvalidSpec(
                    f"SPEC file \"{path}\" is not UTF-8 text: byte {e.start} is "
                    f"0x{data[e.start]:02x}") from None
        raise TypeError(
            f"spec must be a dict or the path of a JSON file (str or pathlib.Path), got "
            f"{type(spec).__name__}")

    def _unary(self, method, request, submitting=False):
        """One call within `timeout`, retrying UNAVAILABLE with jittered exponential backoff
        (0.1 s doubling to 2 s), resending the same request: the same request id."""
        rpc = getattr(self._stub, method)
        deadline = time.monotonic() + self.timeout
        delay = 0.1
        unavailable = None  # the last UNAVAILABLE: why the time ran out, if it did
        while True:
            remaining = deadline - time.monotonic()
            try:
                return rpc(request, timeout=max(remaining, 0.001))
            except grpc.RpcError as e:
                if e.code() in _RETRYABLE:
                    unavailable = e = self._telling(unavailable, e)
                elif e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and unavailable is not None:
                    e = unavailable  # the deadline passed while retrying: still unreachable
                pause = delay * random.uniform(0.5, 1.0)
                if e.code() not in _RETRYABLE or time.monotonic() + pause >= deadline:
                    raise self._error(e, submitting) from None
            time.sleep(pause)
            delay = min(delay * 2, 2.0)

    def _telling(self, kept, e):
        """Of two failed attempts, the one to report: the first that shows a TLS problem
        (later attempts, cut short by the deadline, say only "handshaker shutdown"), else the
        latest."""
        if kept is not None and self._security.explain(kept.details() or "", self.address):
            return kept
        return e

    def _error(self, e, submitting=False):
        """The exception for a failed call: client/commands.cc ReportRpcError's classes."""
        code = e.code()
        details = e.details() or ""
        hint = (f"start it with `trainstep-coordinator --listen {self.address}`, or pass "
                "Client(address=...) / set TRAINSTEP_COORDINATOR")
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            cls = errors.InvalidSpec if submitting else errors.InvalidArgument
            return cls(details, code)
        if code == grpc.StatusCode.ALREADY_EXISTS:
            cls = errors.RequestIdConflict if submitting else errors.InvalidArgument
            return cls(details, code)
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and not _from_coordinator(e):
            # Not the coordinator's own limit: gRPC's size limit on a message.
            cls = errors.InvalidSpec if submitting else errors.InvalidArgument
            return cls("the request is larger than the coordinator accepts (bytes sent vs. its "
                       f"limit): {details}", code)
        if code == grpc.StatusCode.NOT_FOUND:
            return errors.NotFound(details, code)
        if code == grpc.StatusCode.UNAVAILABLE:
            return errors.Unavailable(
                self._security.explain(details, self.address) or
                f"coordinator at {self.address} is not reachable: {hint}", code)
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return errors.Unauthenticated(f"not authenticated: {details}", code)
        if code == grpc.StatusCode.PERMISSION_DENIED:
            return errors.PermissionDenied(f"permission denied: {details}", code)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return errors.Unavailable(
                f"coordinator at {self.address} did not answer within {_seconds(self.timeout)} "
                f"(timeout): is it running? {hint}", code)
        return errors.TrainstepError(details or f"call failed with gRPC code {code.name}", code)

    def _no_progress(self, job_id, job, seconds):
        if job is None:
            return errors.NoProgress(
                f"{job_id} made no progress for {_seconds(seconds)} (no_progress_timeout)")
        p = job.progress
        return errors.NoProgress(
            f"{job_id} made no progress for {_seconds(seconds)} (no_progress_timeout): it is "
            f"{_types.JobState.Name(job.state)}, {p.world_size}/{job.spec.workers.count} "
            f"workers, {p.optimizer_update_id} updates", message_to_dict(job))
