"""The Python client's TLS and token options (client/python/trainstep/_security.py) against
a real mTLS coordinator, with the `trainstep` CLI as the reference: the same options and
variables, the same refusals with the same messages and exit codes."""

import json
import os
import shutil
import subprocess
import tempfile
import unittest

import process_cluster
from process_cluster import ProcessCluster, SOURCE_DIR

process_cluster.require_runtime()

import trainstep  # noqa: E402  (after the runtime check)

SPEC = {"model": {"mlp": {}}, "data": {"synthetic_regression": {"samples": 64}},
        "stop": {"max_updates": 2}}
VIEWER = "tok-vic-000123456789"
ALICE = "tok-alice-0123456789"


def dev_certs(out):
    subprocess.run(["/bin/bash", os.path.join(SOURCE_DIR, "scripts", "dev-certs.sh"), out],
                   check=True, capture_output=True)


class PythonSecurityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="trainstep-py-security-")
        cls.certs = os.path.join(cls.tmp, "certs")
        cls.other = os.path.join(cls.tmp, "other")
        dev_certs(cls.certs)
        dev_certs(cls.other)
        tokens = os.path.join(cls.tmp, "tokens.txt")
        with open(tokens, "w") as f:
            f.write(f"{VIEWER} vic viewer\n{ALICE} alice submitter\n")
        c = cls.certs
        cls.cluster = ProcessCluster("security", coordinator_flags=[
            f"--tls-cert={c}/coordinator.crt", f"--tls-key={c}/coordinator.key",
            f"--tls-client-ca={c}/ca.crt", f"--auth-certs={c}/auth-certs.txt",
            f"--auth-tokens={tokens}"])
        cls.ca = f"{c}/ca.crt"
        cls.spec = os.path.join(cls.tmp, "spec.json")
        with open(cls.spec, "w") as f:
            json.dump(SPEC, f)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def cli_error(self, *args, env):
        r = self.cluster.cli(*args, "--timeout=10s", env={"TRAINSTEP_TOKEN": "", **env})
        self.assertNotEqual(r.returncode, 0, r.stdout)
        return r.returncode, r.stderr[len("error: "):].rstrip("\n")

    def client(self, **kwargs):
        # Refusals come at once (an unreachable TLS peer takes the whole deadline); 10 s outlasts a
        # loaded machine, where 3 s let the client and the CLI disagree (one timed out).
        return trainstep.Client(self.cluster.address, timeout=10, **kwargs)

    # Catches: an mTLS client certificate or a token not sent, the submitter not recorded.
    def test_certificates_and_tokens_authenticate(self):
        with self.client(tls_ca=self.ca, tls_cert=f"{self.certs}/client.crt",
                         tls_key=f"{self.certs}/client.key") as admin:
            job_id = admin.submit(SPEC)
            self.assertEqual(admin.get(job_id)["owner"], "DNS:trainstep-client")
        with self.client(tls_ca=self.ca, token=ALICE) as alice:
            mine = alice.submit(SPEC)
            self.assertEqual(alice.get(mine)["owner"], "alice")
            self.assertEqual(alice.cancel(mine)["state"], "CANCELLED")
            with self.assertRaises(trainstep.PermissionDenied) as e:
                alice.cancel(job_id)
            self.assertEqual(e.exception.exit_code, 8)

    # Catches: the client's refusals differing from the CLI's (class, exit code, message).
    def test_refusals_match_the_cli(self):
        # (Client options, the CLI's environment, the class, a phrase both say: the TLS
        # failures name the option each takes; the coordinator's refusals are the same text).
        cases = [
            (dict(), {}, trainstep.Unavailable, "a plaintext client cannot talk to a TLS port"),
            (dict(tls_ca=f"{self.other}/ca.crt", token=VIEWER),
             {"TRAINSTEP_TLS_CA": f"{self.other}/ca.crt", "TRAINSTEP_TOKEN": VIEWER},
             trainstep.Unavailable, f"no CA in {self.other}/ca.crt signs: untrusted certificate"),
            (dict(tls_ca=self.ca), {"TRAINSTEP_TLS_CA": self.ca}, trainstep.Unauthenticated,
             None),
            (dict(tls_ca=self.ca, token="tok-forged-0123456789"),
             {"TRAINSTEP_TLS_CA": self.ca, "TRAINSTEP_TOKEN": "tok-forged-0123456789"},
             trainstep.Unauthenticated, None),
        ]
        for kwargs, env, cls, phrase in cases:
            with self.subTest(kwargs=kwargs):
                code, message = self.cli_error("job", "list", env=env)
                with self.client(**kwargs) as client, self.assertRaises(cls) as e:
                    client.list()
                self.assertEqual(e.exception.exit_code, code)
                if phrase is None:
                    self.assertEqual(str(e.exception), message)
                else:
                    self.assertIn(phrase, str(e.exception))
                    self.assertIn(phrase, message)
        code, message = self.cli_error(
            "job", "submit", self.spec, env={"TRAINSTEP_TLS_CA": self.ca, "TRAINSTEP_TOKEN": VIEWER})
        with self.client(tls_ca=self.ca, token=VIEWER) as viewer, \
                self.assertRaises(trainstep.PermissionDenied) as e:
            viewer.submit(SPEC)
        self.assertEqual(e.exception.exit_code, code)
        self.assertEqual(str(e.exception), message)

    # Catches: a token sent in plaintext, half a key pair, a missing file found only at the
    # first call; and the variables not read.
    def test_options_are_checked_and_variables_read(self):
        with self.assertRaisesRegex(trainstep.InvalidArgument, "token needs TLS"):
            trainstep.Client(self.cluster.address, token=VIEWER)
        with self.assertRaisesRegex(trainstep.InvalidArgument, "tls_cert needs its pair"):
            trainstep.Client(self.cluster.address, tls_ca=self.ca,
                             tls_cert=f"{self.certs}/client.crt")
        with self.assertRaisesRegex(trainstep.InvalidArgument, "cannot read it"):
            trainstep.Client(self.cluster.address, tls_ca=f"{self.tmp}/missing.crt")
        saved = dict(os.environ)
        try:
            os.environ.update(TRAINSTEP_TLS_CA=self.ca, TRAINSTEP_TOKEN=VIEWER)
            with trainstep.Client(self.cluster.address, timeout=3) as client:
                self.assertIsInstance(client.list(), list)
        finally:
            os.environ.clear()
            os.environ.update(saved)


if __name__ == "__main__":
    unittest.main()
