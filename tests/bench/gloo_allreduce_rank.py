#!/usr/bin/python3
"""One rank of coordination_bench.py's baseline: a Gloo all-reduce of one float among
--world processes (torch.distributed, Debian's python3-torch), --skip + --iters times back
to back, each timed. Writes {"seconds": [...the timed ones], "cpu_s", "wall_s"} to --out.

Rendezvous through a FileStore (--store); Gloo's own connections use the loopback interface
(GLOO_SOCKET_IFNAME=lo, set here unless given). One compute thread, as the ranks of the
coordinator side have none to speak of.
"""
import argparse
import json
import os
import time

os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import torch  # noqa: E402  (after the environment it reads)
import torch.distributed as dist  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--store", required=True, help="FileStore path (the same for every rank)")
    p.add_argument("--iters", type=int, default=1000)
    p.add_argument("--skip", type=int, default=100, help="untimed warm-up all-reduces")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    torch.set_num_threads(1)
    store = dist.FileStore(args.store, args.world)
    dist.init_process_group("gloo", store=store, rank=args.rank, world_size=args.world)
    x = torch.zeros(1)
    seconds = []
    cpu0 = wall0 = 0.0
    for i in range(args.skip + args.iters):
        if i == args.skip:
            cpu0, wall0 = time.process_time(), time.perf_counter()
        start = time.perf_counter()
        dist.all_reduce(x)  # SUM, synchronous: returns holding the result
        if i >= args.skip:
            seconds.append(time.perf_counter() - start)
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    # The sum of W ranks' zeros and ones: every all-reduce really combined all W values.
    x.fill_(1.0)
    dist.all_reduce(x)
    if int(x.item()) != args.world:
        raise SystemExit(f"all-reduce of ones gave {x.item()}, not {args.world}")
    dist.barrier()  # nobody leaves while another still needs its connections
    with open(args.out, "w") as f:
        json.dump({"seconds": seconds, "cpu_s": cpu_s, "wall_s": wall_s}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
