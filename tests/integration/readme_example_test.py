"""README.md's Python example, extracted and run as written against real processes, so it
cannot rot: every ```python block of the "## Python client" section, in order, as one
script, with TRAINSTEP_COORDINATOR pointing at a fresh coordinator; a worker is started for
the job the script submits, as the README tells the reader to.
"""

import os
import re
import subprocess
import sys
import unittest

import process_cluster
from process_cluster import ProcessCluster, wait_until

process_cluster.require_runtime()

import trainstep  # noqa: E402


def readme_example():
    with open(os.path.join(process_cluster.SOURCE_DIR, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = re.search(r"^## Python client\n(.*?)(?=^## )", readme, re.S | re.M)
    assert section, "README.md has no '## Python client' section"
    blocks = re.findall(r"^```python\n(.*?)^```", section.group(1), re.S | re.M)
    assert blocks, "the '## Python client' section has no ```python block"
    return "\n".join(blocks)


class ReadmeExampleTest(unittest.TestCase):
    # Catches: the README's example no longer running (an API renamed, a default changed, a
    # spec field gone), or printing other than what its comments promise.
    def test_python_example_runs_as_written(self):
        code = readme_example()
        with ProcessCluster("readme") as cluster:
            script = os.path.join(cluster.dir, "quickstart.py")
            with open(script, "w", encoding="utf-8") as f:
                f.write(code)
            env = dict(os.environ, TRAINSTEP_COORDINATOR=cluster.address)
            example = cluster.spawn([sys.executable, script], "quickstart.log", env=env)
            with trainstep.Client(cluster.address) as client:
                jobs = wait_until(client.list, 60, "the example to submit its job")
            self.assertEqual(len(jobs), 1)
            cluster.start_worker(jobs[0]["job_id"])
            try:
                rc = example.wait(timeout=180)
            except subprocess.TimeoutExpired:
                self.fail("the example did not end within 180 s\n" + cluster.logs())
            with open(os.path.join(cluster.dir, "quickstart.log"), encoding="utf-8") as f:
                out = f.read()
            self.assertEqual(rc, 0, out + cluster.logs())
            lines = out.splitlines()
            self.assertEqual(lines[0], "refused: batch.accumulation_steps must be ≥ 1, got 0")
            job_id = jobs[0]["job_id"]
            self.assertEqual(lines[1], f"{job_id} submitted: start a worker, "
                                       f"build/bin/trainstep-worker --job {job_id}")
            self.assertEqual(len([line for line in lines if " commit loss " in line]), 10, out)
            self.assertRegex(lines[-1], rf"^{job_id} SUCCEEDED 10 updates at \d+\.\d updates/s$")


if __name__ == "__main__":
    unittest.main()
