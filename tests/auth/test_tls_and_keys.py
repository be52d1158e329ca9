"""TLS, mTLS and API keys on strata-server's gRPC port, against real servers with certificates made by
openssl in the test: a plaintext client, a client trusting another CA, a client without a certificate or
with one from another CA are refused; a missing or wrong key is UNAUTHENTICATED (and counted), the right
one works, health checking and reflection need none; the same through strata-client; bad flags exit 2."""

from __future__ import annotations

import os
import subprocess

import grpc
import pytest

import auth_helpers as AH
import generate_helpers as GH
import integration_helpers as IH

PROMPT = dict(prompt_ids=[5, 6, 7, 8], max_new_tokens=10)
UNAUTHENTICATED_SAMPLE = 'strata_requests_total{code="UNAUTHENTICATED"}'


def tls_flags(pki, client_ca: bool = False) -> list[str]:
    flags = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)]
    return flags + (["--tls-client-ca", str(pki.ca_cert)] if client_ca else [])


@pytest.fixture(scope="module")
def plain(serve):
    return serve([])


@pytest.fixture(scope="module")
def tls(serve, pki):
    return serve(tls_flags(pki), credentials=AH.credentials(pki.ca_cert))


@pytest.fixture(scope="module")
def mtls_keyed(serve, pki, api_keys):
    """mTLS and API keys together; ServerProcess's health check presents the client certificate, no key."""
    return serve(tls_flags(pki, client_ca=True) + ["--api-key-file", str(api_keys[0])],
                 credentials=AH.credentials(pki.ca_cert, pki.client_cert, pki.client_key))


@pytest.fixture(scope="module")
def keyed(serve, api_keys):
    return serve(["--api-key-file", str(api_keys[0])])


@pytest.fixture(scope="module")
def expected_ids(stubs, plain):
    return AH.generate_ids(stubs, plain.channel, **PROMPT)


def wait_ready(channel) -> None:
    grpc.channel_ready_future(channel).result(timeout=10)


# --- TLS -------------------------------------------------------------------------------------------------

def test_tls_generate_equals_plaintext(stubs, tls, expected_ids):
    assert len(expected_ids) == 10
    assert AH.generate_ids(stubs, tls.channel, **PROMPT) == expected_ids


def test_plaintext_client_is_refused_by_a_tls_server(stubs, tls):
    with grpc.insecure_channel(tls.grpc_address) as channel:
        assert AH.code_of(lambda: AH.generate_ids(stubs, channel, timeout=5, **PROMPT)) == grpc.StatusCode.UNAVAILABLE


def test_client_trusting_another_ca_is_refused(stubs, pki, tls):
    with grpc.secure_channel(tls.grpc_address, AH.credentials(pki.other_ca_cert)) as channel:
        assert AH.code_of(lambda: AH.generate_ids(stubs, channel, timeout=5, **PROMPT)) == grpc.StatusCode.UNAVAILABLE


def test_tls_client_of_a_plaintext_server_fails(stubs, pki, plain):
    with grpc.secure_channel(plain.grpc_address, AH.credentials(pki.ca_cert)) as channel:
        assert AH.code_of(lambda: AH.generate_ids(stubs, channel, timeout=5, **PROMPT)) == grpc.StatusCode.UNAVAILABLE


def test_plaintext_health_port_answers_probes_only(serve, stubs, pki, api_keys, expected_ids):
    """--health-listen: Kubernetes' gRPC probes speak no TLS, so health has a plaintext port of its own, where
    strata's methods are refused even with the right key."""
    health_address = f"127.0.0.1:{IH.free_port()}"
    server = serve(tls_flags(pki) + ["--health-listen", health_address, "--api-key-file", str(api_keys[0])],
                   credentials=AH.credentials(pki.ca_cert))
    with grpc.insecure_channel(health_address) as channel:
        health = stubs.health_grpc.HealthStub(channel)
        for service in ("", "strata.v1.InferenceService"):
            reply = health.Check(stubs.health.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == stubs.health.HealthCheckResponse.SERVING
        before = unauthenticated_count(server)
        try:
            AH.generate_ids(stubs, channel, AH.bearer(api_keys[1][0]), **PROMPT)
            raise AssertionError("Generate succeeded on the plaintext health port")
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED and "--health-listen" in error.details()
        stub = stubs.strata_grpc.InferenceServiceStub(channel)
        assert AH.code_of(lambda: stub.GetDeviceMap(stubs.strata.GetDeviceMapRequest(), timeout=10,
                                                    metadata=AH.bearer(api_keys[1][0]))) == \
            grpc.StatusCode.UNAUTHENTICATED
        assert unauthenticated_count(server) == before + 2
    assert AH.generate_ids(stubs, server.channel, AH.bearer(api_keys[1][0]), **PROMPT) == expected_ids


# --- mTLS ------------------------------------------------------------------------------------------------

def test_mtls_client_with_certificate_and_key_works(stubs, mtls_keyed, api_keys, expected_ids):
    assert AH.generate_ids(stubs, mtls_keyed.channel, AH.bearer(api_keys[1][0]), **PROMPT) == expected_ids


@pytest.mark.parametrize("who", ["no certificate", "certificate from another CA"])
def test_mtls_refuses_clients_without_a_certificate_of_its_ca(stubs, pki, mtls_keyed, api_keys, who):
    credentials = (AH.credentials(pki.ca_cert) if who == "no certificate"
                   else AH.credentials(pki.ca_cert, pki.stranger_cert, pki.stranger_key))
    with grpc.secure_channel(mtls_keyed.grpc_address, credentials) as channel:
        # The right key does not make up for the certificate: the handshake fails before any call.
        code = AH.code_of(lambda: AH.generate_ids(stubs, channel, AH.bearer(api_keys[1][0]), timeout=5, **PROMPT))
        assert code == grpc.StatusCode.UNAVAILABLE
        health = stubs.health_grpc.HealthStub(channel)
        assert AH.code_of(lambda: health.Check(stubs.health.HealthCheckRequest(), timeout=5)) == \
            grpc.StatusCode.UNAVAILABLE


def test_mtls_server_still_wants_the_key(stubs, mtls_keyed):
    code = AH.code_of(lambda: AH.generate_ids(stubs, mtls_keyed.channel, **PROMPT))
    assert code == grpc.StatusCode.UNAUTHENTICATED


# --- API keys --------------------------------------------------------------------------------------------

def test_every_key_of_the_file_works(stubs, keyed, api_keys, expected_ids):
    for key in api_keys[1]:
        assert AH.generate_ids(stubs, keyed.channel, AH.bearer(key), **PROMPT) == expected_ids
        reply = stubs.strata_grpc.InferenceServiceStub(keyed.channel).GetDeviceMap(
            stubs.strata.GetDeviceMapRequest(), timeout=10, metadata=AH.bearer(key))
        assert reply.device_map == {"": "cpu"}
    # The scheme is case-insensitive, as HTTP's.
    assert AH.generate_ids(stubs, keyed.channel, (("authorization", f"bearer {api_keys[1][0]}"),),
                           **PROMPT) == expected_ids


BAD_METADATA = {
    "missing": (),
    "wrong key": AH.bearer("0" * 32),
    "a prefix of a key": "prefix",
    "the key with a character more": "suffix",
    "no Bearer scheme": "scheme",
    "two authorization entries": "two",
}


@pytest.mark.parametrize("case", list(BAD_METADATA))
def test_calls_without_a_valid_key_are_unauthenticated_and_counted(stubs, keyed, api_keys, case):
    key = api_keys[1][0]
    metadata = {"prefix": AH.bearer(key[:-1]), "suffix": AH.bearer(key + "0"),
                "scheme": (("authorization", key),),
                "two": AH.bearer(key) + AH.bearer(key)}.get(BAD_METADATA[case], BAD_METADATA[case])
    before = unauthenticated_count(keyed)
    stub = stubs.strata_grpc.InferenceServiceStub(keyed.channel)
    try:
        AH.generate_ids(stubs, keyed.channel, metadata, **PROMPT)
        raise AssertionError("Generate succeeded")
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        assert api_keys[1][0] not in error.details()  # never echoed
    code = AH.code_of(lambda: stub.GetDeviceMap(stubs.strata.GetDeviceMapRequest(), timeout=10, metadata=metadata))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert unauthenticated_count(keyed) == before + 2


def unauthenticated_count(server) -> float:
    return GH.metric(server.metrics_url, UNAUTHENTICATED_SAMPLE, default=0)


def test_health_and_reflection_need_no_key(stubs, keyed):
    health = stubs.health_grpc.HealthStub(keyed.channel)
    reply = health.Check(stubs.health.HealthCheckRequest(service="strata.v1.InferenceService"), timeout=10)
    assert reply.status == stubs.health.HealthCheckResponse.SERVING
    reflection = stubs.reflection_grpc.ServerReflectionStub(keyed.channel)
    (listed,) = list(reflection.ServerReflectionInfo(iter([stubs.reflection.ServerReflectionRequest(list_services="")]),
                                                     timeout=10))
    assert "strata.v1.InferenceService" in [s.name for s in listed.list_services_response.service]


def test_open_methods_need_no_key(serve, stubs, api_keys, expected_ids):
    server = serve(["--api-key-file", str(api_keys[0]), "--auth-open-methods", "GetDeviceMap"])
    stub = stubs.strata_grpc.InferenceServiceStub(server.channel)
    assert stub.GetDeviceMap(stubs.strata.GetDeviceMapRequest(), timeout=10).device_map == {"": "cpu"}
    assert AH.code_of(lambda: AH.generate_ids(stubs, server.channel, **PROMPT)) == grpc.StatusCode.UNAUTHENTICATED
    assert AH.generate_ids(stubs, server.channel, AH.bearer(api_keys[1][1]), **PROMPT) == expected_ids


# --- strata-client ---------------------------------------------------------------------------------------

def run_client(client_bin, server, flags: list[str], command=("generate", "--prompt-ids", "5,6,7,8",
                                                              "--max-new-tokens", "10"), env=None):
    environment = {k: v for k, v in os.environ.items() if k != "STRATA_API_KEY"}
    environment.update(env or {})
    return subprocess.run([str(client_bin), "--server", server.grpc_address, *flags, *command], capture_output=True,
                          text=True, timeout=60, env=environment)


def test_strata_client_over_mtls_with_a_key(client_bin, pki, mtls_keyed, api_keys, expected_ids):
    tls = ["--tls-ca", str(pki.ca_cert), "--tls-cert", str(pki.client_cert), "--tls-key", str(pki.client_key)]
    done = run_client(client_bin, mtls_keyed, tls + ["--api-key-file", str(api_keys[0])])
    assert done.returncode == 0, done.stderr
    # The tokenizer's text goes to stdout; the ids to stderr with --ids, so ask for them.
    done = run_client(client_bin, mtls_keyed, tls + ["--api-key-file", str(api_keys[0])],
                      ("generate", "--prompt-ids", "5,6,7,8", "--max-new-tokens", "10", "--ids"))
    assert f"ids: {','.join(map(str, expected_ids))}" in done.stderr
    # The key from the environment; the server's name given explicitly.
    done = run_client(client_bin, mtls_keyed, tls + ["--tls-server-name", "localhost"], ("device-map",),
                      env={"STRATA_API_KEY": api_keys[1][1]})
    assert done.returncode == 0 and "cpu" in done.stdout, done.stderr
    # No key: UNAUTHENTICATED, exit 1.
    done = run_client(client_bin, mtls_keyed, tls)
    assert done.returncode == 1 and "UNAUTHENTICATED" not in done.stdout
    assert "16 " in done.stderr and "API key" in done.stderr, done.stderr  # 16: UNAUTHENTICATED's number
    # A wrong key (from the environment): UNAUTHENTICATED too.
    done = run_client(client_bin, mtls_keyed, tls, env={"STRATA_API_KEY": "f" * 32})
    assert done.returncode == 1 and "failed: 16 the API key is not valid" in done.stderr, done.stderr
    # No client certificate, a server name the certificate does not carry, or trusting another CA: refused
    # at the handshake.
    other_ca = ["--tls-ca", str(pki.other_ca_cert), "--tls-cert", str(pki.client_cert), "--tls-key",
                str(pki.client_key)]
    for flags in (["--tls-ca", str(pki.ca_cert)], tls + ["--tls-server-name", "elsewhere.example"], other_ca):
        done = run_client(client_bin, mtls_keyed, flags + ["--api-key-file", str(api_keys[0])])
        assert done.returncode == 1 and "failed: 14 " in done.stderr, done.stderr  # 14: UNAVAILABLE


def test_strata_client_plaintext_to_tls_server_fails(client_bin, tls):
    done = run_client(client_bin, tls, ["--timeout", "5"])
    assert done.returncode == 1 and "failed: 14 " in done.stderr, done.stderr


@pytest.mark.parametrize("flags, named", [
    (["--tls-cert", "{client_cert}"], "--tls-cert needs --tls-key"),
    (["--tls-key", "{client_key}"], "--tls-key needs --tls-cert"),
    (["--tls-cert", "{client_cert}", "--tls-key", "{client_key}"], "--tls-cert needs --tls-ca"),
    (["--tls-server-name", "localhost"], "--tls-server-name needs --tls-ca"),
    (["--tls-ca", "{directory}"], "--tls-ca: {directory}: is a directory"),
    (["--tls-ca", "{client_key}"], "--tls-ca: {client_key}: holds no PEM certificate"),
    (["--tls-ca", "{ca_cert}", "--tls-cert", "{client_cert}", "--tls-key", "{stranger_key}"],
     "--tls-key: {stranger_key} is not the private key of --tls-cert {client_cert}"),
    (["--api-key-file", "{directory}/missing"], "--api-key-file: {directory}/missing"),
])
def test_strata_client_bad_security_flags_exit_2(client_bin, pki, tls, flags, named):
    paths = {k: str(v) for k, v in vars(pki).items()}
    done = run_client(client_bin, tls, [f.format(**paths) for f in flags])
    assert done.returncode == 2 and named.format(**paths) in done.stderr, done.stderr


# --- bad server flags ------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags, named", [
    (["--tls-cert", "{server_cert}"], "--tls-cert needs --tls-key"),
    (["--tls-key", "{server_key}"], "--tls-key needs --tls-cert"),
    (["--tls-client-ca", "{ca_cert}"], "--tls-client-ca needs --tls-cert and --tls-key"),
    (["--tls-cert", "{directory}/missing.pem", "--tls-key", "{server_key}"], "--tls-cert: {directory}/missing.pem"),
    (["--tls-cert", "{server_key}", "--tls-key", "{server_key}"], "--tls-cert: {server_key}: holds no PEM certificate"),
    (["--tls-cert", "{server_cert}", "--tls-key", "{server_cert}"], "--tls-key: {server_cert}: holds no unencrypted"),
    (["--tls-cert", "{server_cert}", "--tls-key", "{client_key}"],
     "--tls-key: {client_key} is not the private key of --tls-cert {server_cert}"),
    (["--tls-cert", "{server_cert}", "--tls-key", "{server_key}", "--tls-client-ca", "{directory}"],
     "--tls-client-ca: {directory}: is a directory"),
    (["--api-key-file", "{directory}"], "--api-key-file: {directory}: is a directory"),
    (["--api-key-file", "{directory}/missing"], "--api-key-file: {directory}/missing"),
    (["--api-key-file", "/dev/zero"], "--api-key-file: /dev/zero: is a character device"),
    (["--api-key-file", "{comments_only}"], "--api-key-file: {comments_only}: holds no API key"),
    (["--api-key-file", "{short_key}"], "--api-key-file: {short_key}:2: an API key of 5 characters"),
    (["--auth-open-methods", "GetDeviceMap"], "--auth-open-methods needs --api-key-file"),
    (["--health-listen", "127.0.0.1:0"], "--health-listen needs --tls-cert"),
    (["--tls-cert", "{server_cert}", "--tls-key", "{server_key}", "--health-listen", "8080"], "--health-listen"),
    (["--tls-cert", "{server_cert}", "--tls-key", "{server_key}", "--listen", "127.0.0.1:50999", "--health-listen",
      "127.0.0.1:50999"], "--health-listen: must differ from --listen"),
    (["--api-key-file", "{keys}", "--auth-open-methods", "Generate,Health"],
     '--auth-open-methods: "Health" is not a strata method'),
])
def test_bad_security_flags_exit_2_naming_the_flag(server_bin, model, pki, api_keys, tmp_path, flags, named):
    (tmp_path / "comments").write_text("# no key yet\n\n")
    (tmp_path / "short").write_text("# too short\nabcde\n")
    paths = {k: str(v) for k, v in vars(pki).items()} | {
        "comments_only": str(tmp_path / "comments"), "short_key": str(tmp_path / "short"), "keys": str(api_keys[0])}
    done = subprocess.run([str(server_bin), "--model", str(model), *[f.format(**paths) for f in flags]],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert named.format(**paths) in done.stderr, done.stderr


def test_http_api_serves_tls_and_checks_client_certificates(serve, pki, api_keys):
    """--tls-cert/--tls-key serve HTTPS on --http-listen too, and --tls-client-ca makes it check client
    certificates as the gRPC port does; API keys on top."""
    path, keys = api_keys
    server = serve([*tls_flags(pki, client_ca=True), "--api-key-file", str(path)], http=True,
                   credentials=AH.credentials(pki.ca_cert, pki.client_cert, pki.client_key))
    url = f"https://127.0.0.1:{server.http_port}/v1/models"

    def curl(*args: str) -> tuple[int, str]:
        done = subprocess.run(["curl", "-sS", "--cacert", str(pki.ca_cert), "-w", "\n%{http_code}", *args, url],
                              capture_output=True, text=True, timeout=30)
        body, _, code = done.stdout.rpartition("\n")
        return (int(code) if code.isdigit() else 0), body

    bearer = ["-H", f"Authorization: Bearer {keys[0]}"]
    mine = ["--cert", str(pki.client_cert), "--key", str(pki.client_key)]
    status, body = curl(*mine, *bearer)
    assert status == 200 and '"object":"list"' in body, body
    status, body = curl(*mine)  # no key
    assert status == 401 and "invalid_api_key" in body, body
    status, body = curl(*bearer)  # no client certificate
    assert status == 401 and "client_certificate_required" in body, body
    status, body = curl("--cert", str(pki.stranger_cert), "--key", str(pki.stranger_key), *bearer)  # another CA
    assert status == 401 and "client_certificate_required" in body, body
    # Plaintext to the TLS port gets no HTTP answer.
    done = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}",
                           f"http://127.0.0.1:{server.http_port}/v1/models"], capture_output=True, text=True, timeout=30)
    assert done.stdout != "200"


def test_http_api_serves_tls_without_client_certificates(serve, pki):
    server = serve(tls_flags(pki), http=True, credentials=AH.credentials(pki.ca_cert))
    done = subprocess.run(["curl", "-sS", "--cacert", str(pki.ca_cert), "-w", "\n%{http_code}",
                           f"https://127.0.0.1:{server.http_port}/v1/completions", "-d",
                           '{"prompt": [5, 6], "max_tokens": 2}'], capture_output=True, text=True, timeout=30)
    body, _, code = done.stdout.rpartition("\n")
    assert code == "200" and '"completion_tokens":2' in body, done
