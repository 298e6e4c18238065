"""A supervised trainstep cluster for the chaos tool: the real coordinator on a fixed address
and state directory (restarted there whenever it exits, as a StatefulSet would), and worker
slots whose processes are restarted when they exit with an error (as a Kubernetes Job
would), plus the primitives that hurt them. Every process incarnation is recorded (start,
end, signals, pauses, partitions, its log) for the judge.

Unlike tests/integration/process_cluster.py, which starts each process once on a free port,
this cluster owns its processes for their whole life: restarts must reuse the address and
the state, and the judge needs the history of every incarnation. It borrows that helper's
bounded waits and its close()-kills-everything rule.

Processes run under `setpriv --pdeathsig KILL`, so that they die with the supervising
thread even when the chaos tool itself is SIGKILLed (a CTest timeout), and, in multi-host
mode, under `ip netns exec NS`. Both exec, so the pid we signal is the binary's.
"""

import ctypes
import errno
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time

DEFAULT_LEASE_MS = 10000  # the coordinator's --worker-lease-ms default


def free_port(host="127.0.0.1"):
    """A port nothing listens on now; the coordinator keeps it across its restarts."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout, interval=0.05):
    """Polls `predicate` until it returns a true value (returned) or `timeout` passes (None)."""
    give_up = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > give_up:
            return None
        time.sleep(interval)


class Proc:
    """One incarnation of a process: what it was, when it lived, what was done to it."""

    def __init__(self, role, name, argv, log_path, slot=None):
        self.role = role  # "coordinator" | "worker"
        self.name = name  # worker: the --name it registered with ("s2.1": slot 2, 2nd life)
        self.slot = slot
        self.argv = argv
        self.log_path = log_path
        self.popen = None
        self.start = None
        self.end = None
        self.rc = None
        self.listen = None  # coordinator: when it served (its port file appeared)
        self.signals = []  # (time, signal name)
        self.stopped = []  # [start, end] of SIGSTOP pauses (end None while paused)
        self.partitioned = []  # [start, end] of link-down intervals
        self.lock = threading.Lock()

    @property
    def pid(self):
        return self.popen.pid if self.popen else None

    def running(self):
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig):
        """Sends `sig` if the process still runs; returns the time it was sent, or None."""
        with self.lock:
            if not self.running():
                return None
            t = time.time()
            try:
                os.kill(self.popen.pid, sig)
            except ProcessLookupError:
                return None
            self.signals.append((t, signal.Signals(sig).name))
            if sig == signal.SIGSTOP:
                self.stopped.append([t, None])
            elif sig == signal.SIGCONT and self.stopped and self.stopped[-1][1] is None:
                self.stopped[-1][1] = t
            return t

    def as_dict(self):
        """What the judge reads (judge.state_at and judge_rollbacks)."""
        return {"role": self.role, "name": self.name, "slot": self.slot, "pid": self.pid,
                "start": self.start, "end": self.end, "rc": self.rc, "listen": self.listen,
                "signals": self.signals, "stopped": self.stopped,
                "partitioned": self.partitioned, "log": self.log_path}


class Slot:
    """A place for one worker: its process is restarted when it exits with an error, until
    the job ends or the slot is retired (a machine lost for good)."""

    def __init__(self, index, node):
        self.index = index
        self.node = node  # multi-host: the namespace node it runs in
        self.procs = []
        self.retired = False
        self.thread = None

    def current(self):
        return self.procs[-1] if self.procs else None


class Cluster:
    """Coordinator + worker slots for one job. Not reusable: start(), run, close()."""

    def __init__(self, bin_dir, work_dir, *, lease_ms=None, topology=None, state_tmpfs_mb=0,
                 checkpoint_tmpfs_mb=0, fsync_shim=None, worker_threads=1, restart_delay_s=0.5,
                 say=print, flip_files=False, hold_files=False):
        self.bin_dir = bin_dir
        self.dir = work_dir
        os.makedirs(os.path.join(work_dir, "logs"), exist_ok=True)
        self.lease_ms = lease_ms
        self.topology = topology
        self.worker_threads = worker_threads
        self.restart_delay_s = restart_delay_s
        self.say = say
        # grad_flip: each slot's worker flips its next window's gradient when its file exists.
        self.flip_dir = os.path.join(work_dir, "flips") if flip_files else None
        if self.flip_dir:
            os.makedirs(self.flip_dir, exist_ok=True)
        # hang: each slot's worker holds before its next window while its file exists.
        self.hold_dir = os.path.join(work_dir, "holds") if hold_files else None
        if self.hold_dir:
            os.makedirs(self.hold_dir, exist_ok=True)
        self.stopping = threading.Event()
        self.job_over = threading.Event()
        self.lock = threading.Lock()
        self.coordinators = []
        self.slots = []
        self.job_id = None
        self.fsync_shim = fsync_shim
        self.fsync_trigger = os.path.join(work_dir, "fsync-fail.on")
        self.journal_device = None
        if state_tmpfs_mb:
            self.journal_device = TmpfsDevice(os.path.join(work_dir, "journal-device"),
                                              state_tmpfs_mb)
            self.state_dir = os.path.join(self.journal_device.path, "state")
        else:
            self.state_dir = os.path.join(work_dir, "state")
        # checkpoint_full: the job's checkpoint.dir is `checkpoint_dir(work_dir)`, on its own
        # tmpfs.
        self.checkpoint_device = None
        if checkpoint_tmpfs_mb:
            self.checkpoint_device = TmpfsDevice(os.path.dirname(checkpoint_dir(work_dir)),
                                                 checkpoint_tmpfs_mb)
        if topology is not None:
            host = topology.address("coordinator")
        else:
            host = "127.0.0.1"
        self.port = free_port("127.0.0.1")
        self.address = f"{host}:{self.port}"
        self._coordinator_thread = None
        self._client = None

    # ------------------------------------------------------------------------------------
    # Life cycle

    def start(self, timeout=60):
        """Mounts the journal's and the checkpoints' tmpfs (if asked), starts the coordinator
        and waits until it serves. Raises RuntimeError when it does not."""
        if self.journal_device:
            self.journal_device.mount()
            os.makedirs(self.state_dir, exist_ok=True)
        if self.checkpoint_device:
            self.checkpoint_device.mount()
            os.makedirs(checkpoint_dir(self.dir), exist_ok=True)
        self._coordinator_thread = threading.Thread(target=self._coordinator_loop,
                                                    name="coordinator", daemon=True)
        self._coordinator_thread.start()
        if not wait_until(lambda: self.coordinators and self.coordinators[-1].listen, timeout):
            raise RuntimeError(f"the coordinator did not listen on {self.address} within "
                               f"{timeout} s; see {self.dir}/logs")
        return self

    def client(self):
        """A trainstep.Client on this coordinator (short per-call timeout: the tool polls)."""
        if self._client is None:
            import trainstep
            self._client = trainstep.Client(self.address, timeout=5.0)
        return self._client

    def submit(self, spec):
        self.job_id = self.client().submit(spec)
        return self.job_id

    def add_slot(self):
        """Starts one more worker slot (a spare when the job's ranks are all filled)."""
        with self.lock:
            index = len(self.slots)
            node = self.topology.worker_node(index) if self.topology else None
            slot = Slot(index, node)
            self.slots.append(slot)
        slot.thread = threading.Thread(target=self._worker_loop, args=(slot,),
                                       name=f"slot-{index}", daemon=True)
        slot.thread.start()
        return slot

    def close(self):
        """Stops everything: resumes paused workers, heals links, SIGKILLs workers still
        running, SIGTERMs the coordinator (SIGKILL after 5 s), unmounts the tmpfs."""
        self.stopping.set()
        self.heal_fsync()
        for device in (self.journal_device, self.checkpoint_device):
            if device:
                device.heal()
        for slot in self.slots:
            p = slot.current()
            if p and p.running():
                if p.stopped and p.stopped[-1][1] is None:
                    p.signal(signal.SIGCONT)
                if p.partitioned and p.partitioned[-1][1] is None and self.topology:
                    self.heal_partition(p)
                p.signal(signal.SIGKILL)
        c = self.coordinators[-1] if self.coordinators else None
        if c and c.running():
            if c.stopped and c.stopped[-1][1] is None:
                c.signal(signal.SIGCONT)
            c.signal(signal.SIGTERM)
            try:
                c.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                c.signal(signal.SIGKILL)
        threads = [s.thread for s in self.slots] + [self._coordinator_thread]
        for t in threads:
            if t is not None:
                t.join(timeout=10)
        if self._client is not None:
            self._client.close()
        # The judge copied what it needs; the journal and the checkpoints go with the mounts.
        for device in (self.journal_device, self.checkpoint_device):
            if device:
                device.unmount()

    # ------------------------------------------------------------------------------------
    # Supervision

    def _prefix(self, node):
        prefix = ["setpriv", "--pdeathsig", "KILL", "--"]
        if self.topology is not None and node is not None:
            prefix += self.topology.exec_prefix(node)
        return prefix

    def _spawn(self, proc, env=None):
        with open(proc.log_path, "ab") as log:
            proc.popen = subprocess.Popen(proc.argv, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=env,
                                          start_new_session=True)
        proc.start = time.time()

    def _coordinator_argv(self):
        argv = [os.path.join(self.bin_dir, "trainstep-coordinator"), "--listen", self.address,
                "--state-dir", self.state_dir, "--metrics-listen=",
                "--port-file", os.path.join(self.dir, "coordinator.ports"),
                "--log-format", "json", "--shutdown-grace-ms", "200"]
        if self.lease_ms:
            argv.append(f"--worker-lease-ms={self.lease_ms}")
        if self.topology is not None:
            argv.append("--insecure")
        return argv

    def _coordinator_loop(self):
        """Runs the coordinator; restarts it on the same address and state when it exits.
        Quick successive failures (a full journal device) back off up to 1 s."""
        ports = os.path.join(self.dir, "coordinator.ports")
        env = dict(os.environ)
        if self.fsync_shim:
            env["LD_PRELOAD"] = self.fsync_shim
            env["TRAINSTEP_CHAOS_FSYNC_FAIL"] = self.fsync_trigger
        delay = 0.05
        for n in range(100000):
            if self.stopping.is_set():
                return
            try:
                os.unlink(ports)
            except FileNotFoundError:
                pass
            p = Proc("coordinator", f"coordinator.{n}", self._prefix("coordinator") +
                     self._coordinator_argv(),
                     os.path.join(self.dir, "logs", f"coordinator.{n}.log"))
            self._spawn(p, env)
            with self.lock:
                self.coordinators.append(p)
            while p.popen.poll() is None:
                if p.listen is None and os.path.exists(ports):
                    p.listen = time.time()
                try:
                    p.popen.wait(timeout=0.01 if p.listen is None else 0.5)
                except subprocess.TimeoutExpired:
                    pass
            p.rc = p.popen.returncode
            p.end = time.time()
            if self.stopping.is_set():
                return
            lived = p.end - p.start
            delay = 0.05 if lived > 2 else min(1.0, delay * 2)
            time.sleep(delay)

    def _worker_argv(self, slot, name):
        argv = [os.path.join(self.bin_dir, "trainstep-worker"), "--coordinator", self.address,
                "--job", self.job_id, "--name", name, "--metrics-listen=",
                f"--threads={self.worker_threads}", "--log-format", "json"]
        if self.topology is not None:
            argv += ["--collective-host", self.topology.address(slot.node)]
        if self.flip_dir:
            argv.append(f"--debug-flip-grad-file={os.path.join(self.flip_dir, str(slot.index))}")
        if self.hold_dir:
            argv.append(f"--debug-hold-file={os.path.join(self.hold_dir, str(slot.index))}")
        return argv

    def _worker_loop(self, slot):
        """Runs slot's worker; restarts it after restart_delay_s when it exits with an error,
        until the job is over or the slot retired. Exit 0 means the job ended."""
        for n in range(100000):
            if self.stopping.is_set() or slot.retired or self.job_over.is_set():
                return
            name = f"s{slot.index}.{n}"
            p = Proc("worker", name, self._prefix(slot.node) + self._worker_argv(slot, name),
                     os.path.join(self.dir, "logs", f"worker-{name}.log"), slot=slot.index)
            self._spawn(p)
            with self.lock:
                slot.procs.append(p)
            p.rc = p.popen.wait()
            p.end = time.time()
            if p.rc == 0:
                return
            give_up = time.monotonic() + self.restart_delay_s
            while time.monotonic() < give_up:
                if self.stopping.is_set() or slot.retired or self.job_over.is_set():
                    return
                time.sleep(0.05)

    # ------------------------------------------------------------------------------------
    # Views

    def coordinator(self):
        return self.coordinators[-1] if self.coordinators else None

    def worker_procs(self):
        with self.lock:
            return [p for s in self.slots for p in s.procs]

    def all_procs(self):
        with self.lock:
            return list(self.coordinators) + [p for s in self.slots for p in s.procs]

    def _workers(self):
        """The job's WorkerInfo list from ListWorkers; [] when the coordinator does not answer
        (it is restarting)."""
        try:
            from trainstep.v1 import job_service_pb2 as pb
            return list(self.client()._unary("ListWorkers", pb.ListWorkersRequest(
                job_id=self.job_id)).workers)
        except Exception:  # noqa: BLE001 - a restarting coordinator: nothing to choose from
            return []

    def workers_by_state(self):
        """{"ACTIVE": [Proc...], "READY": [...], ...} of the running worker processes, from
        ListWorkers (names map to incarnations). {} when the coordinator does not answer."""
        from trainstep.v1 import types_pb2
        by_name = {p.name: p for p in self.worker_procs() if p.running()}
        out = {}
        for w in self._workers():
            p = by_name.get(w.name)
            if p is None:
                continue
            out.setdefault(types_pb2.WorkerState.Name(w.state), []).append(p)
        return out

    def worker_id(self, proc):
        """The worker id `proc` holds now (ListWorkers by name: its latest registration, the
        earlier ones LOST when it rejoined), or None."""
        from trainstep.v1 import types_pb2
        mine = [w for w in self._workers() if w.name == proc.name]
        live = [w for w in mine if w.state != types_pb2.LOST]
        return (live or mine)[-1].worker_id if mine else None

    # ------------------------------------------------------------------------------------
    # Faults

    def flip_armed(self, proc):
        return os.path.exists(os.path.join(self.flip_dir, str(proc.slot)))

    def arm_flip(self, proc):
        """grad_flip: `proc`'s worker flips the gradient of its next window's first run.
        Returns the time it was armed."""
        path = os.path.join(self.flip_dir, str(proc.slot))
        with open(path + ".tmp", "w") as f:
            f.write("armed by chaos.py\n")
        os.replace(path + ".tmp", path)  # whole, or not there
        return time.time()

    def hold(self, proc):
        """hang: `proc`'s worker stops before its next window, alive and heartbeating, until
        release(). Returns the time it was held."""
        with open(os.path.join(self.hold_dir, str(proc.slot)), "w") as f:
            f.write("held by chaos.py\n")
        return time.time()

    def release(self, proc):
        try:
            os.unlink(os.path.join(self.hold_dir, str(proc.slot)))
        except FileNotFoundError:
            pass
        return time.time()

    def kill_coordinator(self):
        """SIGKILL; the supervisor restarts it. Returns (kill time, the killed Proc)."""
        c = self.coordinator()
        return (c.signal(signal.SIGKILL) if c else None), c

    def wait_new_coordinator(self, after_proc, after_time=0.0, timeout=60):
        """The first coordinator incarnation after `after_proc` that listened at or after
        `after_time`; None on timeout."""
        def found():
            with self.lock:
                later = self.coordinators[self.coordinators.index(after_proc) + 1:] \
                    if after_proc in self.coordinators else list(self.coordinators)
            for c in later:
                if c.listen is not None and c.listen >= after_time:
                    return c
            return None
        return wait_until(found, timeout, interval=0.02)

    def fill_journal_device(self):
        """Fills the journal's tmpfs until ENOSPC; returns the bytes written."""
        return self.journal_device.fill()

    def heal_journal_device(self):
        self.journal_device.heal()

    def stop_coordinator(self):
        """SIGSTOP of the coordinator. Returns (the time, the stopped Proc)."""
        c = self.coordinator()
        return (c.signal(signal.SIGSTOP) if c else None), c

    def fail_fsync(self):
        with open(self.fsync_trigger, "w") as f:
            f.write("fsync fails while this file exists\n")

    def heal_fsync(self):
        try:
            os.unlink(self.fsync_trigger)
        except FileNotFoundError:
            pass

    def partition(self, proc):
        t = time.time()
        self.topology.link_down(self.slots[proc.slot].node)
        proc.partitioned.append([t, None])
        return t

    def heal_partition(self, proc):
        self.topology.link_up(self.slots[proc.slot].node)
        t = time.time()
        if proc.partitioned and proc.partitioned[-1][1] is None:
            proc.partitioned[-1][1] = t
        return t


def checkpoint_dir(work_dir):
    """The job's checkpoint.dir when its checkpoints are on their own tmpfs (Cluster's
    checkpoint_tmpfs_mb)."""
    return os.path.join(work_dir, "checkpoint-device", "checkpoints")


class TmpfsDevice:
    """A small tmpfs the tool mounts (root) at `path`, so that a test can take its free
    space away (a filler file written until ENOSPC) and give it back."""

    def __init__(self, path, size_mb):
        self.path = path
        self.size_mb = size_mb
        self._filler = os.path.join(path, "filler")

    def mount(self):
        os.makedirs(self.path, exist_ok=True)
        # The pid in the name lets a later run unmount what a killed one left (chaos.py).
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m",
                        f"trainstep-chaos-{os.getpid()}", self.path], check=True)

    def fill(self):
        """Writes the filler until ENOSPC; returns the bytes written."""
        written = 0
        fd = os.open(self._filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for chunk in (1 << 20, 1 << 12, 1):
                block = b"\0" * chunk
                while True:
                    try:
                        n = os.write(fd, block)
                    except OSError as e:
                        if e.errno == errno.ENOSPC:
                            break
                        raise
                    written += n
                    if n < chunk:
                        break
        finally:
            os.close(fd)
        return written

    def heal(self):
        try:
            os.unlink(self._filler)
        except FileNotFoundError:
            pass

    def unmount(self):
        if not os.path.ismount(self.path):
            return
        for _ in range(50):
            if subprocess.run(["umount", self.path], capture_output=True).returncode == 0:
                return
            time.sleep(0.1)


# ---------------------------------------------------------------------------------------
# A worker killed while it writes a checkpoint

_IN_CREATE, _IN_MOVED_TO = 0x100, 0x80
_TEMP_DIR = re.compile(r"^\.ckpt-(\d+)\.tmp-(\d+)$")  # worker/checkpoint/checkpoint_dir.cc


class CheckpointSniper:
    """Watches a checkpoint directory with inotify and SIGKILLs the writer as soon as a
    checkpoint's temp dir (".ckpt-<id>.tmp-<pid>", written by rank 0) appears: the pid is in
    the name. Polling would miss a write of a small model, which takes a few milliseconds."""

    def __init__(self, directory):
        self.directory = directory
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        wd = self._libc.inotify_add_watch(self._fd, directory.encode(), _IN_CREATE | _IN_MOVED_TO)
        if wd < 0:
            err = ctypes.get_errno()
            os.close(self._fd)
            raise OSError(err, f"inotify_add_watch {directory}")

    def close(self):
        os.close(self._fd)

    def wait_and_kill(self, pids, timeout):
        """Blocks until a temp dir whose pid is in `pids` (a callable returning the live
        worker pids) appears, SIGKILLs that pid and returns (kill time, pid, checkpoint id,
        whether the temp dir was still there after the kill: killed mid-write). None on
        timeout."""
        import select
        give_up = time.monotonic() + timeout
        while time.monotonic() < give_up:
            ready, _, _ = select.select([self._fd], [], [], 0.2)
            if not ready:
                continue
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                continue
            offset = 0
            while offset + 16 <= len(data):
                _, _, _, length = struct.unpack_from("iIII", data, offset)
                name = data[offset + 16:offset + 16 + length].split(b"\0", 1)[0].decode()
                offset += 16 + length
                m = _TEMP_DIR.match(name)
                if not m or int(m.group(2)) not in pids():
                    continue
                pid = int(m.group(2))
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                t = time.time()
                mid_write = os.path.exists(os.path.join(self.directory, name))
                return t, pid, int(m.group(1)), mid_write
        return None


def copy_tree(src, dst):
    """Best-effort copy (the journal before its tmpfs is unmounted)."""
    try:
        shutil.copytree(src, dst, dirs_exist_ok=True)
    except (OSError, shutil.Error):
        pass


def read_json(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default
