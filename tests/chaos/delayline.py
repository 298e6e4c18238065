"""A userspace delay line: per link, two TAP devices — one inside a node's network namespace
(its "eth0"), one inside the bridge namespace (a bridge port) — and this process copying
Ethernet frames between them, each frame `--delay-ms` late, in order.

Why it exists: the kernel the chaos tests were written on has no sch_netem (CONFIG_NET_SCH_NETEM
unset: `tc qdisc add ... netem` says "Specified qdisc kind is unknown"), and TBF/HTB shape rate,
not latency. netns.py uses `tc netem` where it exists and this otherwise.

Run inside the bridge namespace (`ip netns exec BR python3 delayline.py ...`): each
`--link NODE_NS:NODE_DEV:BRIDGE_DEV` creates BRIDGE_DEV here and NODE_DEV in /run/netns/NODE_NS
(setns for the one ioctl, then back). Prints "ready" once every device exists; the caller
then sets addresses and brings them up. The devices vanish when this process exits (they are
not persistent), so killing it is the cleanup. Exits on SIGTERM or when stdin closes.
"""

import argparse
import ctypes
import fcntl
import heapq
import os
import selectors
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000
CLONE_NEWNET = 0x40000000
MAX_QUEUED = 20000  # frames in flight over all links; beyond it frames drop (a congested link)

_libc = ctypes.CDLL(None, use_errno=True)


def setns(fd):
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def open_tap(name):
    """A TAP device `name` in the current network namespace; returns its fd (non-blocking)."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    ifr = struct.pack("16sH22x", name.encode(), IFF_TAP | IFF_NO_PI)
    fcntl.ioctl(fd, TUNSETIFF, ifr)
    return fd


def open_tap_in(netns, name):
    """A TAP device created inside /run/netns/`netns`: the namespace is entered for the
    creating ioctl only; the fd keeps working from here."""
    home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    target = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns(target)
        try:
            return open_tap(name)
        finally:
            setns(home)
    finally:
        os.close(home)
        os.close(target)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delay-ms", type=float, required=True,
                        help="one-way delay added to every frame, each direction, per link")
    parser.add_argument("--link", action="append", default=[], required=True,
                        help="NODE_NS:NODE_DEV:BRIDGE_DEV (repeatable)")
    args = parser.parse_args()
    delay = args.delay_ms / 1000.0

    peer = {}  # fd → the fd its frames go to
    for spec in args.link:
        node_ns, node_dev, bridge_dev = spec.split(":")
        a = open_tap_in(node_ns, node_dev)
        b = open_tap(bridge_dev)
        peer[a], peer[b] = b, a
    sel = selectors.DefaultSelector()
    for fd in peer:
        sel.register(fd, selectors.EVENT_READ)
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    print("ready", flush=True)

    queue = []  # (due, seq, out fd, frame): constant delay keeps each link's order
    seq = 0
    dropped = 0
    while not stop:
        timeout = None
        if queue:
            timeout = max(0.0, queue[0][0] - time.monotonic())
        timeout = 0.5 if timeout is None else min(timeout, 0.5)
        for key, _ in sel.select(timeout):
            if key.fd == sys.stdin.fileno():
                if not os.read(key.fd, 4096):
                    stop.append(1)
                continue
            for _ in range(256):  # bounded per wake-up, so that due frames are not starved
                try:
                    frame = os.read(key.fd, 65536)
                except (BlockingIOError, OSError):
                    break
                if len(queue) >= MAX_QUEUED:
                    dropped += 1
                    continue
                heapq.heappush(queue, (time.monotonic() + delay, seq, peer[key.fd], frame))
                seq += 1
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, out, frame = heapq.heappop(queue)
            try:
                os.write(out, frame)
            except OSError:
                dropped += 1  # the device is down (a partition): the frame is lost, as on a wire
    if dropped:
        print(f"delayline: dropped {dropped} frames", file=sys.stderr)


if __name__ == "__main__":
    main()
