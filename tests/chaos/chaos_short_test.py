"""CI's short chaos campaign (`ctest -R chaos`, under 4 minutes): one fault of every kind
this machine allows, on loopback, with the coordinator's default lease, judged as chaos.py
judges (job succeeds, weights equal the fault-free run, no lost or doubled update, no
unnecessary rollback). Recovery bounds are reported, not enforced (RELIABILITY.md)."""

import sys

import ctest_campaign

if __name__ == "__main__":
    sys.exit(ctest_campaign.run("chaos-short", [
        "--faults", "14", "--faults-per-job", "5", "--seed", "13", "--max-minutes", "3.5"]))
