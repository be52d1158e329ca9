"""Certificates and keys for the TLS, mTLS and API key tests, made with the openssl command line at test
time: a CA, a server certificate for 127.0.0.1 and localhost, a client certificate from the same CA, and
a second, unrelated CA with a client certificate of its own (what a stranger would present)."""

from __future__ import annotations

import secrets
import subprocess
import types
from pathlib import Path

import grpc


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"openssl {' '.join(args)} failed:\n{done.stderr}"


def _ca(directory: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
             "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.pem",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=directory)


def _leaf(directory: Path, name: str, ca: str, extensions: str) -> None:
    (directory / f"{name}.ext").write_text(extensions)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=directory)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-days", "2",
             "-set_serial", f"0x{secrets.token_hex(8)}", "-extfile", f"{name}.ext", "-out", f"{name}.pem",
             cwd=directory)


def make_pki(directory: Path) -> types.SimpleNamespace:
    """Paths of ca.pem, server.pem/.key (SAN 127.0.0.1, localhost), client.pem/.key (signed by ca),
    other_ca.pem and stranger.pem/.key (a client certificate signed by other_ca)."""
    directory.mkdir(parents=True, exist_ok=True)
    _ca(directory, "ca")
    _ca(directory, "other_ca")
    _leaf(directory, "server", "ca", "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
          "extendedKeyUsage=serverAuth\n")
    _leaf(directory, "client", "ca", "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
    _leaf(directory, "stranger", "other_ca", "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
    return types.SimpleNamespace(**{f"{name}_{kind}": directory / f"{name}.{'pem' if kind == 'cert' else 'key'}"
                                    for name in ("ca", "other_ca", "server", "client", "stranger")
                                    for kind in ("cert", "key")}, directory=directory)


def credentials(root: Path, cert: Path | None = None, key: Path | None = None) -> grpc.ChannelCredentials:
    """TLS channel credentials trusting `root`, with a client certificate when `cert` and `key` are given."""
    return grpc.ssl_channel_credentials(root_certificates=root.read_bytes(),
                                        private_key=key.read_bytes() if key else None,
                                        certificate_chain=cert.read_bytes() if cert else None)


def bearer(key: str) -> tuple:
    return (("authorization", f"Bearer {key}"),)


def generate_ids(stubs, channel, metadata=(), timeout: float = 30, **fields) -> list[int]:
    """One Generate call read to its end: the generated token ids."""
    stub = stubs.strata_grpc.InferenceServiceStub(channel)
    ids: list[int] = []
    for response in stub.Generate(stubs.strata.GenerateRequest(**fields), timeout=timeout, metadata=metadata):
        ids += list(response.token_ids)
    return ids


def code_of(call) -> grpc.StatusCode:
    """The status code of a call expected to fail."""
    try:
        call()
    except grpc.RpcError as error:
        return error.code()
    raise AssertionError("the call succeeded")
