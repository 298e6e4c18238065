"""Runs one chaos campaign for CTest: a fresh output directory (removed when the campaign
passes, kept and named when it fails, or always with TRAINSTEP_KEEP_TEST_DIRS), and chaos.py's
exit code as the test's (77 = skipped, with the reason on stderr). The thin *_test.py files
next to this one name the campaign; trainstep_python_test runs them with `-v`, ignored here.
"""

import os
import shutil
import sys
import tempfile

import chaos


def run(name, args):
    out = tempfile.mkdtemp(prefix=f"trainstep-{name}-")
    rc = chaos.main(args + ["--out", out])
    if rc == 0 and not os.environ.get("TRAINSTEP_KEEP_TEST_DIRS"):
        shutil.rmtree(out, ignore_errors=True)
    elif rc != chaos.SKIP:
        print(f"{name}: campaign output kept in {out}", file=sys.stderr)
    return rc
