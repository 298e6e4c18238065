"""The exceptions of the trainstep client, one class per exit code of the `trainstep` CLI.

Every exception carries the CLI's exit code for the same failure (`exit_code`), the gRPC
status code when a call failed (`code`, else None) and the message the CLI prints after
"error: " (`str(e)`), so a script can report exactly what the CLI would.

    TrainstepError            1  anything else
    ├── InvalidArgument       2  INVALID_ARGUMENT, a request over the size limit
    │   ├── InvalidSpec       2  submit: the spec is refused (the message names the field),
    │   │                          too large, or its file cannot be read
    │   └── RequestIdConflict 2  ALREADY_EXISTS: a request id reused with another spec
    ├── Unavailable           3  UNAVAILABLE, DEADLINE_EXCEEDED: no coordinator answered
    ├── NotFound              4  unknown job
    ├── JobFailed             5  watch: the job FAILED (`job` holds it, `str(e)` its message)
    ├── JobCancelled          6  watch: the job was CANCELLED
    ├── NoProgress            7  watch(no_progress_timeout=...): nothing new for that long
    ├── Unauthenticated       8  UNAUTHENTICATED: no credential, or one the coordinator refuses
    └── PermissionDenied      8  PERMISSION_DENIED: the principal's roles do not allow the call

The mapping mirrors client/commands.cc (ReportRpcError, ExitCodeOfJob); the integration
test compares the two on the same failures.
"""


class TrainstepError(Exception):
    """Any failure of a trainstep call. Subclasses name the kinds a caller may handle."""

    exit_code = 1

    def __init__(self, message, code=None):
        super().__init__(message)
        self.message = message
        self.code = code  # grpc.StatusCode, or None when no call failed


class InvalidArgument(TrainstepError):
    """The coordinator refused a request as invalid; retrying it unchanged cannot help."""

    exit_code = 2


class InvalidSpec(InvalidArgument):
    """submit: the spec was refused. The message is the coordinator's and names the field,
    e.g. "batch.accumulation_steps must be ≥ 1, got 0"."""


class RequestIdConflict(InvalidArgument):
    """submit: the request id was already used for a job with a different spec."""


class Unavailable(TrainstepError):
    """No coordinator answered at the address within the timeout."""

    exit_code = 3


class NotFound(TrainstepError):
    """The coordinator knows no such job."""

    exit_code = 4


class _JobEnded(TrainstepError):
    def __init__(self, message, job):
        super().__init__(message)
        self.job = job  # the final job, as Client.get returns it


class JobFailed(_JobEnded):
    """watch: the job ended FAILED. `job["message"]` says why."""

    exit_code = 5


class JobCancelled(_JobEnded):
    """watch: the job ended CANCELLED."""

    exit_code = 6


class NoProgress(TrainstepError):
    """watch(no_progress_timeout=...): no new state and no new update for that long.
    `job` is the job as last seen (None if it was never seen)."""

    exit_code = 7

    def __init__(self, message, job=None):
        super().__init__(message)
        self.job = job


class Unauthenticated(TrainstepError):
    """The coordinator wants a credential (a client certificate or a bearer token) and got
    none it accepts. The message says which."""

    exit_code = 8


class PermissionDenied(TrainstepError):
    """The caller is known, but its roles do not allow this call (e.g. a viewer's submit, a
    submitter's cancel of another principal's job)."""

    exit_code = 8
