"""TLS and bearer tokens for Client: the same options, variables and messages as the C++
clients (common/tls.h ResolveChannelSecurity and ExplainSecurityFailure)."""

import os

import grpc

from trainstep import errors


def _read(path, source):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise errors.InvalidArgument(f"{source} {path}: cannot read it ({e.strerror})") from None


def _pem(path, source, label):
    data = _read(path, source)
    begin = data.find(b"-----BEGIN ")
    end = data.find(b"-----", begin + 11) if begin >= 0 else -1
    if begin < 0 or end < 0 or not data[begin + 11:end].endswith(label.encode()):
        raise errors.InvalidArgument(
            f"{source} {path}: not a PEM {label.lower()} file (no -----BEGIN ...{label}----- line)")
    return data


def _token_text(token):
    return bool(token) and all(" " < c < "\x7f" for c in token)


class Security:
    """What Client connects with: root CA, client certificate and key (PEM bytes or None),
    the bearer token (str or None), and where each came from for messages."""

    def __init__(self, tls_ca=None, tls_cert=None, tls_key=None, token=None, token_file=None,
                 environ=None):
        env = os.environ if environ is None else environ
        ca, ca_src = (tls_ca, "tls_ca") if tls_ca else (env.get("TRAINSTEP_TLS_CA"), "TRAINSTEP_TLS_CA")
        cert, cert_src = ((tls_cert, "tls_cert") if tls_cert
                          else (env.get("TRAINSTEP_TLS_CERT"), "TRAINSTEP_TLS_CERT"))
        key, key_src = ((tls_key, "tls_key") if tls_key
                        else (env.get("TRAINSTEP_TLS_KEY"), "TRAINSTEP_TLS_KEY"))
        if token is not None and token_file is not None:
            raise errors.InvalidArgument("pass token or token_file, not both")
        if token_file is not None:
            token = _read(os.fspath(token_file), "token_file").decode("utf-8", "replace").strip()
            if not _token_text(token):
                raise errors.InvalidArgument(
                    f"token_file {token_file}: must hold one token (printable, no spaces) and "
                    "nothing else")
            token_src = "token_file"
        elif token is not None:
            token = token.strip()
            if not _token_text(token):
                raise errors.InvalidArgument("token must be one token (printable, no spaces)")
            token_src = "token"
        else:
            token = (env.get("TRAINSTEP_TOKEN") or "").strip() or None
            token_src = "TRAINSTEP_TOKEN"
            if token is not None and not _token_text(token):
                raise errors.InvalidArgument(
                    "TRAINSTEP_TOKEN must be one token (printable, no spaces)")
        if bool(cert) != bool(key):
            raise errors.InvalidArgument(
                f"{cert_src if cert else key_src} needs its pair: a client certificate is given "
                "with tls_cert and its key with tls_key (or TRAINSTEP_TLS_CERT and "
                "TRAINSTEP_TLS_KEY)")
        if not ca:
            if cert:
                raise errors.InvalidArgument(
                    f"{cert_src} needs tls_ca (or TRAINSTEP_TLS_CA): the CA that signs the "
                    "coordinator's certificate")
            if token:
                raise errors.InvalidArgument(
                    f"{token_src} needs TLS: pass tls_ca (or set TRAINSTEP_TLS_CA) so that the "
                    "token does not cross the network in plaintext")
        self.ca_path = os.fspath(ca) if ca else None
        self.root = _pem(self.ca_path, ca_src, "CERTIFICATE") if ca else None
        self.cert_path = os.fspath(cert) if cert else None
        self.chain = _pem(self.cert_path, cert_src, "CERTIFICATE") if cert else None
        self.key = _pem(os.fspath(key), key_src, "PRIVATE KEY") if key else None
        self.token = token

    @property
    def tls(self):
        return self.root is not None

    def channel(self, address, options):
        if not self.tls:
            return grpc.insecure_channel(address, options=options)
        creds = grpc.ssl_channel_credentials(
            root_certificates=self.root, private_key=self.key, certificate_chain=self.chain)
        if self.token:
            creds = grpc.composite_channel_credentials(
                creds, grpc.access_token_call_credentials(self.token))
        return grpc.secure_channel(address, creds, options=options)

    def explain(self, details, address):
        """The sentence for an UNAVAILABLE whose details show a security problem, else None."""
        at = f"the coordinator at {address}"
        if "wrong version number" in details or "packet length too long" in details:
            return (f"{at} does not speak TLS (a plaintext port?): drop tls_ca, or start it "
                    "with --tls-cert and --tls-key")
        if "certificate verify failed" in details:
            return (f"{at} presented a certificate that no CA in {self.ca_path} signs: "
                    "untrusted certificate")
        if "Hostname Verification Check failed" in details or \
                "is not in peer certificate" in details:
            host = address.rsplit(":", 1)[0].strip("[]")
            return (f"{at} presented a certificate that does not name \"{host}\": wrong host "
                    "name (connect by a name or address its certificate carries)")
        if "Socket closed" in details or "Connection reset" in details:
            if not self.tls:
                return (f"{at} closed the connection: if it serves TLS, pass tls_ca (or set "
                        "TRAINSTEP_TLS_CA); a plaintext client cannot talk to a TLS port")
            if self.chain is None:
                return (f"{at} closed the TLS connection: if it requires client certificates "
                        "(mTLS), pass tls_cert and tls_key")
            return (f"{at} closed the TLS connection: if it requires client certificates, it "
                    f"did not accept {self.cert_path} (not signed by its --tls-client-ca?)")
        return None
