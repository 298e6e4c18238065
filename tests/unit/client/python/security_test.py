"""trainstep._security: the Python client's TLS and token options as the C++ clients resolve
them (common/tls.h; tests/unit/common/tls_test.cc), without a server."""

import os
import shutil
import sys
import tempfile
import unittest

try:
    import grpc  # noqa: F401
except ImportError as e:
    print(f"SKIP: {e}: install python3-grpcio and python3-protobuf", file=sys.stderr)
    sys.exit(77)

import trainstep
from trainstep._security import Security

CERT = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
KEY = b"-----BEGIN PRIVATE KEY-----\nMIGH\n-----END PRIVATE KEY-----\n"


class SecurityTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="trainstep-py-security-unit-")
        self.ca = self.write("ca.crt", CERT)
        self.cert = self.write("c.crt", CERT)
        self.key = self.write("c.key", KEY)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def write(self, name, data):
        path = os.path.join(self.dir, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    # Catches: the environment ignored, or winning over an explicit option.
    def test_options_win_and_variables_fill_the_gaps(self):
        s = Security(environ={})
        self.assertFalse(s.tls)
        s = Security(environ={"TRAINSTEP_TLS_CA": self.ca, "TRAINSTEP_TLS_CERT": self.cert,
                              "TRAINSTEP_TLS_KEY": self.key, "TRAINSTEP_TOKEN": " t-1 \n"})
        self.assertTrue(s.tls)
        self.assertEqual((s.root, s.chain, s.key, s.token), (CERT, CERT, KEY, "t-1"))
        other = self.write("other.crt", CERT.replace(b"MIIB", b"MIIC"))
        s = Security(tls_ca=other, token_file=self.write("tok", b"from-file\n"),
                     environ={"TRAINSTEP_TLS_CA": self.ca, "TRAINSTEP_TOKEN": "from-env"})
        self.assertEqual((s.ca_path, s.token), (other, "from-file"))

    # Catches: a token sent in plaintext, half a key pair, a swapped key and certificate.
    def test_bad_options_name_their_source(self):
        cases = [
            (dict(token="t"), "token needs TLS"),
            (dict(tls_ca=self.ca, tls_cert=self.cert), "tls_cert needs its pair"),
            (dict(tls_cert=self.cert, tls_key=self.key), "tls_cert needs tls_ca"),
            (dict(tls_ca=self.ca, tls_cert=self.key, tls_key=self.cert),
             "not a PEM certificate file"),
            (dict(tls_ca=self.ca, token="a b"), "one token"),
            (dict(tls_ca=os.path.join(self.dir, "missing")), "cannot read it"),
        ]
        for kwargs, message in cases:
            with self.subTest(kwargs=kwargs), self.assertRaises(trainstep.InvalidArgument) as e:
                Security(environ={}, **kwargs)
            self.assertIn(message, str(e.exception))
            self.assertEqual(e.exception.exit_code, 2)

    # Catches: a TLS failure reported as "not reachable"; each kind gets its sentence (Python's
    # gRPC words, which differ from C++'s for the host name).
    def test_each_failure_says_which(self):
        plain = Security(environ={})
        tls = Security(tls_ca=self.ca, environ={})
        self.assertIn("pass tls_ca", plain.explain("last error: Socket closed", "h:1"))
        self.assertIn("does not speak TLS", tls.explain("SSL routines::wrong version number", "h:1"))
        self.assertIn("untrusted certificate",
                      tls.explain("SSL routines::certificate verify failed", "h:1"))
        self.assertIn('does not name "127.0.0.2"',
                      tls.explain("Peer name 127.0.0.2 is not in peer certificate", "127.0.0.2:9"))
        self.assertIn("pass tls_cert and tls_key", tls.explain("Socket closed", "h:1"))
        self.assertIsNone(tls.explain("Connection refused", "h:1"))


if __name__ == "__main__":
    unittest.main()
