"""A real trainstep cluster on 127.0.0.1 for the Python tests: the coordinator binary and
worker binaries as separate processes, free ports from --port-file, the `trainstep` CLI, and
bounded waits. The Python twin of process_cluster.cc. Everything it started is killed by
close() (also on an exception inside `with`).

Environment (set by CMake): TRAINSTEP_BIN_DIR (build/bin), TRAINSTEP_SOURCE_DIR.
"""

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

BIN_DIR = os.environ.get("TRAINSTEP_BIN_DIR", "")
SOURCE_DIR = os.environ.get("TRAINSTEP_SOURCE_DIR", "")
SKIP = 77  # CTest's SKIP_RETURN_CODE for these tests


def require_runtime():
    """Exits with SKIP, saying why, when the client's runtime packages are missing."""
    try:
        for module in ("grpc", "google.protobuf"):
            importlib.import_module(module)
    except ImportError as e:
        print(f"SKIP: {e}: install python3-grpcio and python3-protobuf "
              "(scripts/install-deps.sh does)", file=sys.stderr)
        sys.exit(SKIP)
    if not BIN_DIR or not os.path.isdir(BIN_DIR):
        print(f"TRAINSTEP_BIN_DIR={BIN_DIR!r} is not the build's bin directory", file=sys.stderr)
        sys.exit(1)


def wait_until(predicate, timeout, what, interval=0.05):
    """Polls `predicate` until it returns a true value (returned), or fails after `timeout`."""
    give_up = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > give_up:
            raise AssertionError(f"{what} within {timeout} s")
        time.sleep(interval)


class ProcessCluster:
    def __init__(self, name, worker_lease_ms=10000, coordinator_flags=()):
        self.dir = tempfile.mkdtemp(prefix=f"trainstep-py-{name}-")
        self._procs = []  # (Popen, log path)
        self.workers = []
        ports = os.path.join(self.dir, "ports.json")
        self.coordinator = self._spawn(
            [os.path.join(BIN_DIR, "trainstep-coordinator"), "--listen", "127.0.0.1:0",
             "--state-dir", os.path.join(self.dir, "state"), "--metrics-listen", "127.0.0.1:0",
             "--port-file", ports, f"--worker-lease-ms={worker_lease_ms}",
             "--shutdown-grace-ms=200", *coordinator_flags], "coordinator.log")

        def port():
            try:
                with open(ports) as f:
                    return json.load(f).get("grpc_port")
            except (OSError, ValueError):
                return None
        try:
            self.address = f"127.0.0.1:{wait_until(port, 30, 'the coordinator to listen')}"
        except AssertionError:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _spawn(self, argv, log_name, env=None):
        log_path = os.path.join(self.dir, log_name)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        self._procs.append((proc, log_path))
        return proc

    def start_worker(self, job_id, *flags):
        """One trainstep-worker process for `job_id`; its log is worker-N.log."""
        n = len(self.workers)
        proc = self._spawn([os.path.join(BIN_DIR, "trainstep-worker"), "--coordinator",
                            self.address, "--job", job_id, "--name", f"worker-{n}", *flags],
                           f"worker-{n}.log")
        self.workers.append(proc)
        return proc

    def spawn(self, argv, log_name, env=None):
        """Any other process the test needs killed at the end (its log: log_name)."""
        return self._spawn(argv, log_name, env)

    def cli(self, *args, timeout=60, env=None):
        """The `trainstep` CLI against this coordinator: CompletedProcess (text). `env`:
        variables added to this process's environment."""
        return subprocess.run([os.path.join(BIN_DIR, "trainstep"), *args, "--coordinator",
                               self.address], capture_output=True, text=True, timeout=timeout,
                              env=None if env is None else {**os.environ, **env})

    def wait_for_workers(self, timeout=60):
        """Exit codes of every started worker; a worker still running after `timeout` is
        killed and counts as None."""
        codes = []
        give_up = time.monotonic() + timeout
        for w in self.workers:
            try:
                codes.append(w.wait(timeout=max(0.1, give_up - time.monotonic())))
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()
                codes.append(None)
        return codes

    def logs(self, lines=30):
        """The last `lines` lines of every log, for failure messages."""
        out = []
        for _, path in self._procs:
            try:
                with open(path, errors="replace") as f:
                    tail = f.read().splitlines()[-lines:]
            except OSError:
                tail = []
            out.append(f"---- {path}\n" + "\n".join(tail))
        return "\n".join(out)

    def close(self, keep=False):
        """Kills the workers and other processes, stops the coordinator (SIGTERM, then
        SIGKILL after 10 s), and removes the directory unless `keep`."""
        for proc, _ in reversed(self._procs):
            if proc.poll() is not None:
                continue
            if proc is self.coordinator:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                    continue
                except subprocess.TimeoutExpired:
                    pass
            proc.kill()
            proc.wait()
        if not keep and not os.environ.get("TRAINSTEP_KEEP_TEST_DIRS"):
            shutil.rmtree(self.dir, ignore_errors=True)
