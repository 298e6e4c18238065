"""Hosts made of network namespaces, for the multi-host chaos tests: one namespace per node
(the coordinator, each worker slot), each with a private address on 10.213.0.0/24, all
joined by a Linux bridge that lives in a namespace of its own. Nothing is created in the
root namespace: links are made inside the bridge namespace with their peer placed straight
into the node's.

Latency: `tc netem` on every node's link where the kernel has sch_netem; elsewhere (this
project's CI kernel has none) a userspace delay line (delayline.py): the node's link is a TAP
pair that a process copies frames across, late by the delay. Either way each link adds
`latency_ms` one way, so node-to-node is 2 × latency_ms one way (two links).

A partition takes a node's bridge port down (the bridge drops its frames both ways); heal
brings it up. Every name carries the creating process's pid ("tsc<pid>-..."), so that
sweep_stale() can remove what a killed run left behind without touching a live run's.
"""

import os
import re
import shutil
import subprocess
import sys
import time

SUBNET = "10.213.0"
_PREFIX = "tsc"


# One ICMP echo: prints the round trip in seconds, exits 1 without an answer in time.
_PING = r"""
import os, socket, struct, sys, time
dst, timeout = sys.argv[1], float(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
s.settimeout(timeout)
ident = os.getpid() & 0xFFFF
def checksum(b):
    b += b"\0" * (len(b) % 2)
    c = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    c = (c >> 16) + (c & 0xFFFF)
    c += c >> 16
    return ~c & 0xFFFF
body = struct.pack("!BBHHH", 8, 0, 0, ident, 1) + b"trainstep"
packet = body[:2] + struct.pack("!H", checksum(body)) + body[4:]
t0 = time.monotonic()
s.sendto(packet, (dst, 0))
try:
    while True:
        data, addr = s.recvfrom(2048)
        icmp = data[(data[0] & 0x0F) * 4:]
        if addr[0] == dst and icmp[0] == 0 and struct.unpack("!H", icmp[4:6])[0] == ident:
            print(time.monotonic() - t0)
            sys.exit(0)
except socket.timeout:
    sys.exit(1)
"""


def _run(argv, check=True, timeout=20):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


def requirement_missing():
    """Why namespaces cannot be made here (a sentence), or None."""
    if os.geteuid() != 0:
        return "multi-host tests need root (network namespaces, veth, a bridge)"
    for tool in ("ip", "setpriv"):
        if shutil.which(tool) is None and shutil.which(tool, path="/usr/sbin:/sbin") is None:
            return f"`{tool}` is not installed (iproute2 / util-linux)"
    probe = f"{_PREFIX}{os.getpid()}-probe"
    r = _run(["ip", "netns", "add", probe], check=False)
    if r.returncode != 0:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    _run(["ip", "netns", "del", probe], check=False)
    return None


def netem_available():
    """Whether `tc ... netem` works on this kernel (probed in a throwaway namespace)."""
    probe = f"{_PREFIX}{os.getpid()}-netem"
    if _run(["ip", "netns", "add", probe], check=False).returncode != 0:
        return False
    try:
        _run(["ip", "-n", probe, "link", "set", "lo", "up"], check=False)
        r = _run(["tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "netem", "delay",
                  "1ms"], check=False)
        return r.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
    finally:
        _run(["ip", "netns", "del", probe], check=False)


def tun_available():
    return os.path.exists("/dev/net/tun")


def sweep_stale(say=print):
    """Deletes namespaces left by chaos runs whose process is gone (a SIGKILLed run)."""
    r = _run(["ip", "netns", "list"], check=False)
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.match(rf"^{_PREFIX}(\d+)-", name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            _run(["ip", "netns", "del", name], check=False)
            say(f"removed stale namespace {name}")


class Topology:
    """Namespaces for `nodes` (names: "coordinator", "w0", "w1", ...). Use as a context
    manager: __exit__ deletes every namespace and stops the delay line, also on errors."""

    def __init__(self, nodes, latency_ms=0.0, say=print):
        self.tag = f"{_PREFIX}{os.getpid()}"
        self.bridge_ns = f"{self.tag}-br"
        self.nodes = list(nodes)
        self.latency_ms = float(latency_ms)
        self.say = say
        self.created = []
        self.delay_line = None
        self.mode = "none"
        self._addr = {n: f"{SUBNET}.{i + 1}" for i, n in enumerate(self.nodes)}

    # Names ------------------------------------------------------------------------------
    def ns(self, node):
        return f"{self.tag}-{node}"

    def address(self, node):
        return self._addr[node]

    def port_dev(self, node):
        return f"p-{node}"[:15]

    def exec_prefix(self, node):
        return ["ip", "netns", "exec", self.ns(node)]

    def worker_node(self, index):
        """The node of worker slot `index`: slot i runs on node "w<i>"."""
        node = f"w{index}"
        if node not in self._addr:
            raise RuntimeError(f"no namespace for worker slot {index}: the topology was made "
                               f"for {self.nodes}")
        return node

    # Life cycle -------------------------------------------------------------------------
    def __enter__(self):
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc):
        self.down()

    def _add_ns(self, name):
        _run(["ip", "netns", "add", name])
        self.created.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

    def up(self):
        self._add_ns(self.bridge_ns)
        _run(["ip", "-n", self.bridge_ns, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", self.bridge_ns, "link", "set", "br0", "up"])
        for node in self.nodes:
            self._add_ns(self.ns(node))
        if self.latency_ms > 0 and netem_available():
            self.mode = "netem"
        elif self.latency_ms > 0:
            if not tun_available():
                raise RuntimeError("latency asked for, but this kernel has no sch_netem and "
                                   "there is no /dev/net/tun for the userspace delay line")
            self.mode = "delayline"
        else:
            self.mode = "veth"
        if self.mode == "delayline":
            links = []
            for node in self.nodes:
                links += ["--link", f"{self.ns(node)}:eth0:{self.port_dev(node)}"]
            self.delay_line = subprocess.Popen(
                ["setpriv", "--pdeathsig", "KILL", "--", "ip", "netns", "exec", self.bridge_ns,
                 sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                              "delayline.py"),
                 "--delay-ms", str(self.latency_ms), *links],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True)
            line = self.delay_line.stdout.readline()
            if line.strip() != "ready":
                err = self.delay_line.stderr.read() if self.delay_line.poll() is not None else ""
                raise RuntimeError(f"the delay line did not start: {line!r} {err}")
        else:
            for node in self.nodes:
                _run(["ip", "-n", self.bridge_ns, "link", "add", self.port_dev(node), "type",
                      "veth", "peer", "name", "eth0", "netns", self.ns(node)])
        for node in self.nodes:
            ns = self.ns(node)
            _run(["ip", "-n", self.bridge_ns, "link", "set", self.port_dev(node), "master",
                  "br0"])
            _run(["ip", "-n", self.bridge_ns, "link", "set", self.port_dev(node), "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.address(node)}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            if self.mode == "netem":
                _run(["tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", "netem", "delay",
                      f"{self.latency_ms}ms"])
        self._wait_reachable()
        self.say(f"netns: {len(self.nodes)} nodes on a bridge in {self.bridge_ns}, latency "
                 f"{self.latency_ms:g} ms per link one way ({self.describe_mode()})")

    def describe_mode(self):
        return {"netem": "tc netem",
                "delayline": "userspace TAP delay line: this kernel has no sch_netem",
                "veth": "veth pairs, no added latency"}[self.mode]

    def ping(self, src, dst, timeout=1.0):
        """Round-trip seconds of one ICMP echo from node `src` to node `dst`, or None (no
        ping(8) needed: a raw socket in a Python child inside `src`'s namespace)."""
        r = _run(self.exec_prefix(src) + [sys.executable, "-c", _PING, self.address(dst),
                                          str(timeout)], check=False, timeout=timeout + 10)
        try:
            return float(r.stdout.strip()) if r.returncode == 0 else None
        except ValueError:
            return None

    def _wait_reachable(self, timeout=20):
        """Every worker node answers a ping from the coordinator's (bridge ports learn)."""
        give_up = time.monotonic() + timeout
        for node in self.nodes[1:]:
            while self.ping(self.nodes[0], node) is None:
                if time.monotonic() > give_up:
                    raise RuntimeError(f"{node} ({self.address(node)}) unreachable from "
                                       f"{self.nodes[0]} after {timeout} s")
                time.sleep(0.2)

    def down(self):
        if self.delay_line is not None:
            if self.delay_line.poll() is None:
                self.delay_line.terminate()
                try:
                    self.delay_line.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.delay_line.kill()
                    self.delay_line.wait()
            self.delay_line = None
        for name in reversed(self.created):
            for _ in range(20):
                if _run(["ip", "netns", "del", name], check=False).returncode == 0:
                    break
                time.sleep(0.1)
        self.created = []

    # Faults -----------------------------------------------------------------------------
    def link_down(self, node):
        _run(["ip", "-n", self.bridge_ns, "link", "set", self.port_dev(node), "down"])

    def link_up(self, node):
        _run(["ip", "-n", self.bridge_ns, "link", "set", self.port_dev(node), "up"])


def enter(ns_name):
    """Moves the calling thread into /run/netns/`ns_name`; threads and children started
    afterwards inherit it. Call it from the main thread before any other thread exists (the
    chaos tool does, so that its gRPC client reaches a coordinator that listens only inside
    its namespace). Python 3.11 has no os.setns."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{ns_name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, 0x40000000) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {ns_name}: {os.strerror(err)}")
    finally:
        os.close(fd)
