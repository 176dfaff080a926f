"""The Azure Storage queue adapter (shared/messaging/azure_storage.py) against Azurite, the real emulator.

What the Functions host and the engine rely on: bodies round-trip in the host's encodings, the
service's dequeue count and visibility timeouts drive redelivery, poison lands intact in
"<name>-poison", failures are one clear QueueError within seconds, and identity-based
connections (AzureWebJobsStorage__queueServiceUri) get a token the way Functions apps do.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qs, urlsplit

import pytest

from shared.errors import ConfigError, QueueError
from shared.messaging.azure_storage import AZURITE_QUEUE_ENDPOINT, AzureStorageQueue
from tests.support.azurite import (  # noqa: F401  (azurite, azurite_server: pytest fixtures)
    ACCOUNT_KEY,
    REPO,
    Azurite,
    azurite,
    azurite_server,
    free_loopback_port,
    launched_azurite,
)

DOORBELL = '{"run_id": 42, "token": 7}'


def drain(queue: AzureStorageQueue, expect: int, visibility: float = 30, within: float = 5.0) -> list:
    """Receive until `expect` messages arrived (Azurite may spread a batch over calls)."""
    got: list = []
    deadline = time.monotonic() + within
    while len(got) < expect and time.monotonic() < deadline:
        got += queue.receive(32, visibility)
        if len(got) < expect:
            time.sleep(0.1)
    return got


# -- send, receive, delete ------------------------------------------------------------------------


def test_send_receive_delete(azurite: Azurite) -> None:
    queue = azurite.queue()
    bodies = [DOORBELL, '{"run_id": 43, "token": 1}', "plain text"]
    queue.send_many(bodies)

    received = drain(queue, 3, visibility=1)
    assert sorted(m.body for m in received) == sorted(bodies)
    for message in received:
        assert message.dequeue_count == 1
        assert message.pop_receipt and message.id
        assert message.inserted_at is not None and message.inserted_at.tzinfo is not None
        assert abs(message.inserted_at - dt.datetime.now(dt.timezone.utc)) < dt.timedelta(minutes=5)
        queue.delete(message)

    time.sleep(1.3)  # past the 1 s visibility timeout: only deletion keeps them away
    assert queue.receive(32, 1) == []


def test_receive_more_than_one_service_call_returns(azurite: Azurite) -> None:
    queue = azurite.queue()
    bodies = [json.dumps({"run_id": i, "token": 1}) for i in range(40)]
    queue.send_many(bodies)
    received = queue.receive(40, 30)  # the service hands out at most 32 per call
    assert sorted(m.body for m in received) == sorted(bodies)
    assert queue.receive(0, 30) == []


def test_depth_counts_visible_and_invisible_messages(azurite: Azurite) -> None:
    queue = azurite.queue()
    assert queue.depth() == 0
    queue.send_many(["a", "b", "c"])
    assert queue.depth() == 3
    [message] = queue.receive(1, 60)
    assert queue.depth() == 3  # invisible, still in the queue
    queue.delete(message)
    assert queue.depth() == 2
    with pytest.raises(QueueError, match="does not exist"):
        azurite.queue(create=False).depth()


def test_dequeue_count_increments_on_each_receive_after_visibility_expiry(azurite: Azurite) -> None:
    queue = azurite.queue()
    queue.send_many([DOORBELL])

    first = queue.receive(1, 1)
    assert [m.dequeue_count for m in first] == [1]
    assert queue.receive(1, 1) == []  # invisible while "being processed"
    time.sleep(1.3)
    second = queue.receive(1, 1)
    assert [(m.id, m.dequeue_count, m.body) for m in second] == [(first[0].id, 2, DOORBELL)]
    assert second[0].pop_receipt != first[0].pop_receipt
    time.sleep(1.3)
    assert [m.dequeue_count for m in queue.receive(1, 1)] == [3]


def test_release_makes_the_message_visible_after_the_timeout(azurite: Azurite) -> None:
    queue = azurite.queue()
    queue.send_many([DOORBELL])
    [message] = queue.receive(1, 60)

    queue.release(message, 2)
    assert queue.receive(1, 60) == []  # not before the timeout
    time.sleep(2.4)
    [again] = queue.receive(1, 60)
    assert (again.id, again.body, again.dequeue_count) == (message.id, DOORBELL, 2)

    queue.release(again, 0)  # zero: visible at once
    [third] = queue.receive(1, 60)
    assert (third.id, third.dequeue_count) == (message.id, 3)

    queue.release(third, 0.3)  # fractions round up to whole seconds, never shorter
    assert queue.receive(1, 60) == []
    time.sleep(1.3)
    assert [m.id for m in queue.receive(1, 60)] == [message.id]


def test_stale_receipts_are_ignored_because_another_consumer_owns_the_message(azurite: Azurite) -> None:
    queue = azurite.queue()
    queue.send_many([DOORBELL])
    [mine] = queue.receive(1, 1)
    time.sleep(1.3)
    [theirs] = queue.receive(1, 60)  # redelivered to "another consumer": my receipt is stale
    queue.delete(mine)
    queue.release(mine, 0)
    assert queue.receive(1, 60) == []  # neither call touched their copy
    queue.delete(theirs)
    queue.delete(theirs)  # already gone: still fine


@pytest.mark.parametrize("encoding", ["base64", "none"])
def test_move_to_poison_lands_the_body_intact(azurite: Azurite, encoding: str) -> None:
    queue = azurite.queue(encoding=encoding)
    body = '{"run_id": 9, "token": 3, "note": "naïve <&> \\n"}'
    queue.send_many([body])
    [message] = queue.receive(1, 1)

    queue.move_to_poison(message)  # the poison queue does not exist yet: created on first use

    time.sleep(1.3)
    assert queue.receive(1, 1) == []  # gone from the main queue
    poison = azurite.queue(queue.poison_name, encoding=encoding, create=False)
    [poisoned] = poison.receive(1, 30)
    assert poisoned.body == body
    assert queue.poison_name == queue.name + "-poison"

    # A second poisoning uses the existing poison queue.
    queue.send_many(["second"])
    [message] = queue.receive(1, 30)
    queue.move_to_poison(message)
    assert [m.body for m in poison.receive(1, 30)] == ["second"]


# -- encodings ------------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["base64", "none"])
def test_encodings_round_trip_and_store_what_the_host_expects(azurite: Azurite, encoding: str) -> None:
    queue = azurite.queue(encoding=encoding)
    bodies = [DOORBELL, "naïve ☃ <tag attr=\"x\"> & done", "line one\nline two"]
    queue.send_many(bodies)
    received = drain(queue, 3)
    assert sorted(m.body for m in received) == sorted(bodies)
    for message in received:
        queue.release(message, 0)

    # What is stored on the service (read with no decoding) is what host.json messageEncoding
    # tells the Functions host to expect: base64 of the UTF-8 text, or the text itself.
    raw = azurite.queue(queue.name, encoding="none", create=False)
    stored = sorted(m.body for m in drain(raw, 3))
    if encoding == "base64":
        expected = sorted(base64.b64encode(b.encode("utf-8")).decode("ascii") for b in bodies)
    else:
        expected = sorted(bodies)
    assert stored == expected


def test_a_raw_message_on_a_base64_queue_goes_to_the_poison_queue_at_once(
    azurite: Azurite, caplog: pytest.LogCaptureFixture
) -> None:
    """What the Functions host (queues extension 5.x) does: never delivered, moved at once."""
    queue = azurite.queue(encoding="base64")
    writer = azurite.queue(queue.name, encoding="none", create=False)
    # Not base64 at all; a doorbell sent without encoding (valid JSON, yet it must not run); and
    # text that Python's lenient b64decode would quietly read as "ABC" (it drops the brackets;
    # .NET's decoder, like ours, rejects them). One correct base64 message in the same batch.
    raws = ["not base64 at all!", DOORBELL, "[QUJD]"]
    writer.send_many(raws)
    queue.send_many(["good one"])

    with caplog.at_level(logging.WARNING, logger="shared.messaging.azure_storage"):
        received = drain(queue, 1)
    assert [(m.body, m.dequeue_count) for m in received] == [("good one", 1)]
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert warned.count("is not valid base64") == 3 and queue.poison_name in warned

    poison = azurite.queue(queue.poison_name, encoding="base64", create=False)
    assert sorted(m.body for m in drain(poison, 3)) == sorted(raws)  # intact, as the host copies them
    queue.delete(received[0])
    assert queue.depth() == 0


def test_a_batch_of_only_raw_messages_does_not_look_like_an_empty_queue(azurite: Azurite) -> None:
    """The local runner stops on an empty receive: moved messages must not end a batch early."""
    queue = azurite.queue(encoding="base64")
    azurite.queue(queue.name, encoding="none", create=False).send_many(["raw-1", "raw-2"])
    queue.send_many(["good one"])
    # A receive of one message may first get a raw one: it asks again until it has a good one.
    assert [m.body for m in queue.receive(1, 30)] == ["good one"]
    poison = azurite.queue(queue.poison_name, encoding="base64", create=False)
    assert sorted(m.body for m in drain(poison, 2)) == ["raw-1", "raw-2"]


def test_base64_that_is_not_utf8_is_delivered_and_can_never_be_a_doorbell(azurite: Azurite) -> None:
    """Valid base64 reaches the function in Azure too; bad bytes arrive as U+FFFD (malformed)."""
    from shared.errors import MessageError
    from shared.messaging.messages import parse_message

    queue = azurite.queue(encoding="base64")
    raw = b'{"v":1,"run_id":1,"token":1,"op":"\xff"}'
    azurite.queue(queue.name, encoding="none", create=False).send_many([base64.b64encode(raw).decode()])
    [message] = drain(queue, 1)
    assert message.body == raw.decode("utf-8", errors="replace") and "\ufffd" in message.body
    with pytest.raises(MessageError):
        parse_message(message.body)


# -- queue lifecycle and errors ------------------------------------------------------------------


def test_ensure_exists_is_idempotent(azurite: Azurite) -> None:
    queue = azurite.queue(create=False)
    queue.ensure_exists()
    queue.send_many([DOORBELL])
    queue.ensure_exists()  # exists, with a message: no error, nothing lost
    assert [m.body for m in queue.receive(1, 30)] == [DOORBELL]


def test_a_send_that_fails_part_way_says_how_many_were_sent(azurite: Azurite) -> None:
    """The dispatcher puts back exactly the unsent runs: `sent` counts the bodies on the queue."""
    from shared.errors import QueueSendError

    queue = azurite.queue()
    too_large = "x" * 70_000  # over the service's 64 KiB message limit: 413, not retried
    with pytest.raises(QueueSendError) as error:
        queue.send_many(["first", "second", too_large, "fourth"])
    assert (error.value.sent, error.value.total) == (2, 4)
    assert isinstance(error.value, QueueError)
    assert "413" in str(error.value) and "(2 of 4 messages were sent)" in str(error.value)
    assert sorted(m.body for m in drain(queue, 2)) == ["first", "second"]
    assert queue.depth() == 2  # nothing after the failure went out


def test_a_send_to_a_stopped_service_sent_nothing(azurite: Azurite) -> None:
    from shared.errors import QueueSendError

    queue = azurite.queue()
    azurite.stop()
    with pytest.raises(QueueSendError) as error:
        queue.send_many([DOORBELL, DOORBELL])
    assert (error.value.sent, error.value.total) == (0, 2)
    assert "unreachable" in str(error.value) and "were sent" not in str(error.value)
    azurite.start()
    assert queue.depth() == 0


def test_sending_to_a_missing_queue_says_how_to_create_it(azurite: Azurite) -> None:
    queue = azurite.queue(create=False)
    with pytest.raises(QueueError) as error:
        queue.send_many([DOORBELL])
    message = str(error.value)
    assert f"queue {queue.name!r}" in message
    assert "does not exist" in message and "init-db" in message
    with pytest.raises(QueueError, match="does not exist"):
        queue.receive(1, 1)


def test_wrong_account_key_is_an_authentication_failure(azurite: Azurite) -> None:
    wrong_key = base64.b64encode(b"not the azurite key" * 3).decode("ascii")
    queue = AzureStorageQueue.from_settings(
        azurite.connection_string.replace(ACCOUNT_KEY, wrong_key), None, None,
        azurite.unique_name(), "base64",
    )
    with pytest.raises(QueueError) as error:
        queue.ensure_exists()
    message = str(error.value)
    assert "authentication failed" in message and "AzureWebJobsStorage" in message
    assert wrong_key not in message
    queue.close()


def test_unreachable_service_fails_within_seconds_with_a_clear_message() -> None:
    port = free_loopback_port()  # nothing listens there
    connection = (
        f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={ACCOUNT_KEY};"
        f"QueueEndpoint=http://127.0.0.1:{port}/devstoreaccount1;"
    )
    queue = AzureStorageQueue.from_settings(connection, None, None, "agent-tasks", "base64")
    started = time.monotonic()
    with pytest.raises(QueueError) as error:
        queue.send_many([DOORBELL, DOORBELL])
    elapsed = time.monotonic() - started
    message = str(error.value)
    assert elapsed < 6, f"took {elapsed:.1f} s"
    assert "unreachable" in message and f"127.0.0.1:{port}" in message
    assert "'agent-tasks'" in message and "AzureWebJobsStorage" in message
    assert ACCOUNT_KEY not in message
    queue.close()


def test_azurite_stopped_then_back_keeps_the_queue_contents(azurite: Azurite) -> None:
    queue = azurite.queue()
    queue.send_many(["before stop 1", "before stop 2"])

    azurite.stop()
    started = time.monotonic()
    with pytest.raises(QueueError, match="unreachable"):
        queue.send_many(["while stopped"])
    assert time.monotonic() - started < 6
    with pytest.raises(QueueError, match="unreachable"):
        queue.receive(1, 1)

    azurite.start()  # same port, same data folder
    received = drain(queue, 2)
    assert sorted(m.body for m in received) == ["before stop 1", "before stop 2"]
    assert queue.receive(32, 30) == []  # the send during the outage did not happen
    queue.send_many(["after restart"])  # the adapter reconnects on its own
    assert [m.body for m in drain(queue, 1)] == ["after restart"]


# -- settings ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "connection_string, expected",
    [
        ("garbage", "not a storage connection string"),
        ("UseDevelopmentStorage=false", "UseDevelopmentStorage='false' is not valid"),
        ("DefaultEndpointsProtocol=https;AccountName=acct;EndpointSuffix=core.windows.net",
         "no AccountKey or SharedAccessSignature"),
        ("DefaultEndpointsProtocol=https;AccountKey=c2VjcmV0LWtleS12YWx1ZQ==", "not a usable storage connection string"),
    ],
)
def test_invalid_connection_string_names_the_setting(connection_string: str, expected: str) -> None:
    with pytest.raises(QueueError) as error:
        AzureStorageQueue.from_settings(connection_string, None, None, "agent-tasks", "base64")
    message = str(error.value)
    assert message.startswith("AzureWebJobsStorage")
    assert expected in message
    assert "c2VjcmV0LWtleS12YWx1ZQ" not in message  # never echo a key


def test_a_sas_token_never_appears_in_errors() -> None:
    port = free_loopback_port()
    sas = "sv=2024-08-04&ss=q&srt=sco&sp=rwdlacup&se=2030-01-01T00:00:00Z&sig=c2VjcmV0c2lnbmF0dXJl"
    connection = f"QueueEndpoint=http://127.0.0.1:{port}/devstoreaccount1;SharedAccessSignature={sas}"
    queue = AzureStorageQueue.from_settings(connection, None, None, "agent-tasks", "base64")
    assert queue.endpoint == f"http://127.0.0.1:{port}/devstoreaccount1"
    with pytest.raises(QueueError) as error:
        queue.send_many([DOORBELL])
    assert "unreachable" in str(error.value)
    assert "c2VjcmV0c2lnbmF0dXJl" not in str(error.value)
    queue.close()


@pytest.mark.parametrize("spelling", ["UseDevelopmentStorage=true", "UseDevelopmentStorage=True;"])
def test_use_development_storage_means_azurite_on_its_default_port(spelling: str) -> None:
    queue = AzureStorageQueue.from_settings(spelling, None, None, "agent-tasks", "none")
    assert queue.endpoint == AZURITE_QUEUE_ENDPOINT == "http://127.0.0.1:10001/devstoreaccount1"
    assert queue.encoding == "none"
    queue.close()


def test_no_connection_settings_names_both_settings() -> None:
    with pytest.raises(QueueError) as error:
        AzureStorageQueue.from_settings("", None, None, "agent-tasks", "base64")
    assert "AzureWebJobsStorage" in str(error.value)
    assert "AzureWebJobsStorage__queueServiceUri" in str(error.value)


@pytest.mark.parametrize("uri", ["http://acct.queue.core.windows.net", "acct.queue.core.windows.net",
                                 "https://acct.queue.core.windows.net?sv=1&sig=abc"])
def test_identity_endpoint_must_be_https(uri: str) -> None:
    with pytest.raises(QueueError, match=r"AzureWebJobsStorage__queueServiceUri=.*expected https://"):
        AzureStorageQueue.from_settings(None, uri, None, "agent-tasks", "base64")


@pytest.mark.parametrize(
    "name, encoding, setting",
    [
        ("Agent_Tasks", "base64", "AGENT_QUEUE_NAME"),
        ("ab", "base64", "AGENT_QUEUE_NAME"),
        ("a" * 57, "base64", "AGENT_QUEUE_NAME"),  # "-poison" would not fit in 63
        ("agent--tasks", "base64", "AGENT_QUEUE_NAME"),
        ("agent-tasks", "utf8", "AGENT_QUEUE_ENCODING"),
    ],
)
def test_bad_queue_name_or_encoding_is_a_config_error(name: str, encoding: str, setting: str) -> None:
    with pytest.raises(ConfigError) as error:
        AzureStorageQueue.from_settings("UseDevelopmentStorage=true", None, None, name, encoding)
    assert error.value.setting == setting


def test_importing_the_adapter_does_not_import_the_sdks() -> None:
    code = (
        "import sys, shared.messaging.azure_storage\n"
        "heavy = [m for m in sys.modules if m.startswith(('azure.storage', 'azure.identity', 'azure.core'))]\n"
        "print(heavy)\n"
    )
    shown = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "[]", shown.stdout + shown.stderr


# -- identity-based connection (AzureWebJobsStorage__queueServiceUri) ----------------------------


def _self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that is its own CA (trusted through REQUESTS_CA_BUNDLE)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                          serialization.NoEncryption())
    )
    return cert_path, key_path


class IdentityEndpoint:
    """The App Service / Functions managed identity endpoint (IDENTITY_ENDPOINT, api 2019-08-01),
    on loopback: hands out a bearer token shaped like Entra ID's (Azurite's OAuth "basic" checks
    issuer, audience and lifetime, not the signature) and records what was asked."""

    header_secret = "loopback-identity-header"

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.audience = "https://storage.azure.com"
        self.status = 200
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                query = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
                endpoint.requests.append({"query": query, "header": self.headers.get("X-IDENTITY-HEADER")})
                if endpoint.status != 200:
                    body = json.dumps({"error": "unavailable", "error_description": "test says no"}).encode()
                else:
                    body = json.dumps(endpoint.token_response(query)).encode()
                self.send_response(endpoint.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/msi/token"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def token_response(self, query: dict[str, str]) -> dict[str, Any]:
        now = int(time.time())
        tenant = "72f988bf-86f1-41af-91ab-2d7cd011db47"
        claims = {"aud": self.audience, "iss": f"https://sts.windows.net/{tenant}/", "iat": now - 60,
                  "nbf": now - 60, "exp": now + 3600, "oid": "0b1c2d3e-0000-4000-8000-000000000001",
                  "tid": tenant, "appid": query.get("client_id", "system-assigned")}

        def part(value: dict[str, Any]) -> str:
            return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

        token = f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"
        return {"access_token": token, "expires_on": str(now + 3600), "resource": query.get("resource"),
                "token_type": "Bearer", "client_id": query.get("client_id", "")}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def azurite_https(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """An Azurite of its own, on HTTPS with OAuth, as the identity-based connection needs."""
    cert_path, key_path = _self_signed_certificate(tmp_path_factory.mktemp("tls"))
    with launched_azurite(cert_path=cert_path, key_path=key_path) as server:
        yield server


@pytest.fixture
def identity(azurite_https: Azurite, monkeypatch: pytest.MonkeyPatch) -> Iterator[IdentityEndpoint]:
    endpoint = IdentityEndpoint()
    for name in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET", "AZURE_CLIENT_CERTIFICATE_PATH",
                 "AZURE_FEDERATED_TOKEN_FILE", "AZURE_USERNAME", "MSI_ENDPOINT", "MSI_SECRET",
                 "IDENTITY_SERVER_THUMBPRINT", "IMDS_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("IDENTITY_ENDPOINT", endpoint.url)
    monkeypatch.setenv("IDENTITY_HEADER", IdentityEndpoint.header_secret)
    assert azurite_https.cert_path is not None
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(azurite_https.cert_path))
    try:
        yield endpoint
    finally:
        endpoint.close()


def _identity_queue(azurite_https: Azurite, client_id: str | None) -> AzureStorageQueue:
    return AzureStorageQueue.from_settings(
        None, azurite_https.queue_endpoint, client_id, azurite_https.unique_name(), "base64"
    )


@pytest.mark.parametrize("client_id", ["5e1c0000-aaaa-4bbb-8ccc-0123456789ab", None])
def test_identity_connection_round_trip(azurite_https: Azurite, identity: IdentityEndpoint,
                                        client_id: str | None) -> None:
    queue = _identity_queue(azurite_https, client_id)
    try:
        expected_credential = "ManagedIdentityCredential" if client_id else "DefaultAzureCredential"
        assert type(queue._credential).__name__ == expected_credential
        queue.ensure_exists()
        queue.send_many([DOORBELL])
        [message] = queue.receive(1, 30)
        assert message.body == DOORBELL
        queue.move_to_poison(message)
    finally:
        queue.close()

    assert identity.requests, "no token was requested from the identity endpoint"
    asked = identity.requests[0]
    assert asked["header"] == IdentityEndpoint.header_secret
    assert asked["query"]["resource"] == "https://storage.azure.com"
    assert asked["query"].get("client_id") == client_id


def test_identity_token_rejected_by_storage_names_the_role(azurite_https: Azurite,
                                                           identity: IdentityEndpoint) -> None:
    identity.audience = "https://vault.azure.net"  # a token for another service
    queue = _identity_queue(azurite_https, "5e1c0000-aaaa-4bbb-8ccc-0123456789ab")
    try:
        with pytest.raises(QueueError) as error:
            queue.send_many([DOORBELL])
    finally:
        queue.close()
    message = str(error.value)
    assert "authentication failed" in message
    assert "Storage Queue Data Contributor" in message and "AzureWebJobsStorage__clientId" in message


def test_identity_endpoint_failure_is_an_authentication_error(azurite_https: Azurite,
                                                              identity: IdentityEndpoint) -> None:
    identity.status = 400
    queue = _identity_queue(azurite_https, "5e1c0000-aaaa-4bbb-8ccc-0123456789ab")
    try:
        started = time.monotonic()
        with pytest.raises(QueueError) as error:
            queue.ensure_exists()
        assert time.monotonic() - started < 15
    finally:
        queue.close()
    assert "authentication failed" in str(error.value)
    assert azurite_https.queue_endpoint in str(error.value)
