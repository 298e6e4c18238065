"""Multi-host in network namespaces (`ctest -R netns`): the coordinator and each worker in its
own namespace with its own address on a bridge, 1 ms per link one way (tc netem where the
kernel has it, else the userspace delay line), workers reaching each other through
--collective-host. A job trains to completion, and its weights equal those of the same job on
loopback. Needs root; skips (77) saying why otherwise."""

import sys

import ctest_campaign

if __name__ == "__main__":
    sys.exit(ctest_campaign.run("netns-latency", [
        "--netns", "--latency-ms", "1", "--faults", "0", "--updates", "150"]))
