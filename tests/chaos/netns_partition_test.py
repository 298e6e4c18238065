"""Multi-host in network namespaces (`ctest -R netns`): a rank's link is taken down for
longer than the lease, then brought up, twice; the job succeeds with the weights of the
fault-free run and no lost or doubled update. 1 ms per link one way. Needs root; skips (77)
saying why otherwise."""

import sys

import ctest_campaign

if __name__ == "__main__":
    sys.exit(ctest_campaign.run("netns-partition", [
        "--netns", "--latency-ms", "1", "--kinds", "partition", "--faults", "2",
        "--updates", "250", "--seed", "5"]))
