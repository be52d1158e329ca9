"""strata_client's TLS, client certificate and API key options against a real strata-server with mTLS and
--api-key-file (certificates made by openssl in the test, tests/auth/auth_helpers.py)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

import auth_helpers as AH
import integration_helpers as IH
import runtime_helpers as RH
from strata_client import Client

EXAMPLE = Path(__file__).resolve().parents[1] / "example.py"


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """(server, pki, key, reference result): strata-server with mTLS and one API key."""
    pki = AH.make_pki(tmp_path_factory.mktemp("pki"))
    key = secrets.token_urlsafe(24)
    key_file = tmp_path_factory.mktemp("keys") / "keys"
    key_file.write_text(f"# one key\n{key}\n")
    directory = RH.make_checkpoint(tmp_path_factory.mktemp("model"), "llama_text")
    RH.train_tokenizer(vocab_size=300).save(str(directory / "tokenizer.json"))
    stubs = IH.generate_stubs(tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("py"))
    server = IH.ServerProcess(
        IH.require_binary(IH.SERVER_BIN),
        ["--model", str(directory), "--device-map", '{"": "cpu"}', "--max-batch", "4", "--max-context", "128",
         "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--tls-client-ca", str(pki.ca_cert),
         "--api-key-file", str(key_file)],
        tmp_path_factory.mktemp("logs"), credentials=AH.credentials(pki.ca_cert, pki.client_cert, pki.client_key))
    server.start(stubs)
    want = RH.reference_generate(directory, [[5, 6, 7, 8]], 6)[0]
    yield server, pki, key, want
    server.stop()


def secure_client(server, pki, key=None, cert="client", **options) -> Client:
    return Client(server.grpc_address, root_certificates=pki.ca_cert.read_bytes(),
                  certificate_chain=getattr(pki, f"{cert}_cert").read_bytes() if cert else None,
                  private_key=getattr(pki, f"{cert}_key").read_bytes() if cert else None, api_key=key, **options)


def test_mtls_and_key_generate_and_device_map(secured):
    server, pki, key, want = secured
    with secure_client(server, pki, key) as client:
        assert client.generate([5, 6, 7, 8], max_new_tokens=6).token_ids == want["ids"]
        assert client.device_map()["device_map"] == {"": "cpu"}
    with secure_client(server, pki, key, server_name="localhost") as client:
        assert client.generate([5, 6, 7, 8], max_new_tokens=6).token_ids == want["ids"]


def test_example_over_mtls_with_the_key_from_the_environment(secured):
    server, pki, key, _ = secured
    command = [sys.executable, str(EXAMPLE), "--server", server.grpc_address, "--max-new-tokens", "4",
               "--tls-ca", str(pki.ca_cert), "--tls-cert", str(pki.client_cert), "--tls-key", str(pki.client_key),
               "Hello"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, STRATA_API_KEY=key))
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith("[LENGTH: 4 tokens]")
    environment = {k: v for k, v in os.environ.items() if k != "STRATA_API_KEY"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=environment)
    assert done.returncode != 0 and "UNAUTHENTICATED" in done.stderr


@pytest.mark.parametrize("key", [None, "not-the-key-0123456789"])
def test_missing_or_wrong_key_is_unauthenticated(secured, key):
    server, pki, _, _ = secured
    with secure_client(server, pki, key) as client:
        for call in (lambda: client.generate([5, 6], max_new_tokens=2), client.device_map):
            with pytest.raises(grpc.RpcError) as error:
                call()
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize("how", ["plaintext", "no client certificate", "certificate of another CA"])
def test_refused_without_tls_or_the_right_certificate(secured, how):
    server, pki, key, _ = secured
    client = (Client(server.grpc_address, api_key=key) if how == "plaintext"
              else secure_client(server, pki, key, cert=None if how == "no client certificate" else "stranger"))
    with client, pytest.raises(grpc.RpcError) as error:
        client.generate([5, 6], max_new_tokens=2, timeout=5)
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("options, message", [
    (dict(certificate_chain=b"x"), "certificate_chain and private_key go together"),
    (dict(certificate_chain=b"x", private_key=b"y"), "needs TLS"),
    (dict(server_name="localhost"), "needs TLS"),
    (dict(api_key="has space"), "printable ASCII"),
    (dict(api_key=""), "printable ASCII"),
])
def test_inconsistent_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        Client("127.0.0.1:1", **options)
