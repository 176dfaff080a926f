"""The queue port on Azure Storage queues (azure-storage-queue), as the Functions host uses them.

The timer dispatches runs with `send_many`; in Azure the Functions host's queue trigger consumes
them. The consumer half of the port (`receive`, `delete`, `release`, `move_to_poison`) does what
the host does, for the local runner and the tests, against Azurite or a real account.

Importing this module is cheap: azure-storage-queue, azure-core and azure-identity are imported
inside the methods that need them (the function app cold-starts on every scale-out).
"""

from __future__ import annotations

import base64
import logging
import math
import re
from typing import TYPE_CHECKING, Any, Sequence
from urllib.parse import urlsplit

from shared.errors import ConfigError, QueueError, QueueSendError
from shared.messaging.port import ReceivedMessage

if TYPE_CHECKING:  # pragma: no cover - typing only
    # azure-storage-queue loads on first use (cold start): only queue mode needs it
    from azure.storage.queue import QueueClient, QueueServiceClient

log = logging.getLogger(__name__)

CONNECTION_SETTING = "AzureWebJobsStorage"
SERVICE_URI_SETTING = "AzureWebJobsStorage__queueServiceUri"
CLIENT_ID_SETTING = "AzureWebJobsStorage__clientId"
QUEUE_NAME_SETTING = "AGENT_QUEUE_NAME"
ENCODING_SETTING = "AGENT_QUEUE_ENCODING"

ENCODINGS = ("base64", "none")
POISON_SUFFIX = "-poison"

# The documented Azurite (and old Storage Emulator) account: well-known name and key, not a secret.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
AZURITE_QUEUE_ENDPOINT = f"http://127.0.0.1:10001/{AZURITE_ACCOUNT}"
# What `UseDevelopmentStorage=true` stands for (Azurite's documented connection string, queue part).
AZURITE_CONNECTION_STRING = (
    f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
    f"QueueEndpoint={AZURITE_QUEUE_ENDPOINT};"
)

# Storage limits: a visibility timeout is whole seconds, 0..7 days (receive needs at least 1);
# one Get Messages call returns at most 32 messages.
MAX_VISIBILITY_SECONDS = 7 * 24 * 3600
# A delayed message must become visible before the service's 7-day limit.
MAX_VISIBILITY_DELAY = MAX_VISIBILITY_SECONDS - 1
MAX_MESSAGES_PER_CALL = 32
# Queue names: 3-63 lowercase letters, digits and single hyphens, starting and ending with a
# letter or digit. The poison queue appends "-poison", so the name itself may have at most 56.
_QUEUE_NAME = re.compile(r"[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,55}")

# Short SDK retries: a tick that cannot reach the queue should fail in seconds and let the next
# tick (and lease expiry) recover, instead of hanging for the SDK default (15 s backoff, 3 retries,
# 20 s connect timeout, 60 s read timeout) while the timer's next occurrence piles up.
RETRY_TOTAL = 2
RETRY_BACKOFF_SECONDS = 1
CONNECTION_TIMEOUT_SECONDS = 5
READ_TIMEOUT_SECONDS = 20

# Error codes meaning "this message is no longer ours": it was deleted, or it became visible
# again and another consumer received it (new pop receipt). The WebJobs queue listener ignores
# these on delete and on update-visibility; so do we (another consumer now owns the message).
_LOST_MESSAGE_CODES = frozenset({"MessageNotFound", "PopReceiptMismatch"})


class _UndecodableText(str):
    """The raw text of a message that is not valid base64 on a base64 queue."""


def _strict_base64_text(content: str) -> str:
    """Decode like .NET `Convert.FromBase64String` + UTF-8, which the Functions host uses.

    Python's default `b64decode` silently drops characters outside the alphabet, so a plain JSON
    text such as '{"run_id": 1}' could "decode" into garbage instead of failing. .NET only skips
    whitespace and rejects anything else; we do the same. Bytes that are not UTF-8 become U+FFFD.
    """
    compact = "".join(content.split())
    raw = base64.b64decode(compact.encode("ascii"), validate=True)
    return raw.decode("utf-8", errors="replace")


def _make_decode_policy(encoding: str) -> Any:
    """The SDK's decode policy for `encoding`; base64 never raises on an undecodable message.

    What the Functions host does (Storage queues extension 5.x, in extension bundle v4): a message
    that is not valid base64 while messageEncoding is base64 is not handed to the function at all;
    the extension moves it to "<queue>-poison" at once, without retries (azure-sdk-for-net PR
    #18326 "Badly encoded handler in Webjobs"; issues #21449 and #28799: users saw only "Message has
    reached MaxDequeueCount of 5. Moving message to queue '...-poison'"). Older extensions failed
    the invocation with "The input is not a valid Base-64 string" on every delivery until
    maxDequeueCount.

    `receive` does the same with what this policy marks as `_UndecodableText`: such a message is
    never delivered (its raw text could even be a valid doorbell, written by a sender with the
    wrong encoding: running it locally would hide a mismatch that poisons every message in Azure).
    Raising from the SDK's TextBase64DecodePolicy instead would fail the whole `receive` batch and
    leave every message in it invisible until its visibility timeout.

    Valid base64 that is not UTF-8 does reach the function in Azure (as bytes the executor rejects
    as "not UTF-8"); here it is delivered with U+FFFD for the bad bytes, which is never a valid
    doorbell either, so the executor poisons it as malformed on the first delivery.
    """
    # azure-storage-queue loads on first use (cold start): only queue mode needs it
    from azure.storage.queue import TextBase64DecodePolicy

    if encoding == "none":
        return None  # the SDK default, NoDecodePolicy: the text as stored

    class HostLikeBase64DecodePolicy(TextBase64DecodePolicy):
        def decode(self, content: Any, response: Any) -> str:
            try:
                return _strict_base64_text(content)
            except (ValueError, UnicodeEncodeError):  # not base64 (binascii.Error) or not ASCII
                return _UndecodableText(content)

    return HostLikeBase64DecodePolicy()


def _make_encode_policy(encoding: str) -> Any:
    # azure-storage-queue loads on first use (cold start): only queue mode needs it
    from azure.storage.queue import TextBase64EncodePolicy

    # base64: what the Functions queue trigger expects by default (messageEncoding "base64").
    return TextBase64EncodePolicy() if encoding == "base64" else None


def _redact(text: str) -> str:
    """Remove secrets an SDK message might carry (SAS signatures, account keys)."""
    text = re.sub(r"(?i)(sig=)[^&\s'\"]+", r"\1<redacted>", text)
    return re.sub(r"(?i)(AccountKey=)[^;\s'\"]+", r"\1<redacted>", text)


def _first_line(error: BaseException, limit: int = 300) -> str:
    text = str(error).strip() or type(error).__name__
    line = text.splitlines()[0].strip()
    line = _redact(line)
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _error_code(error: BaseException) -> str | None:
    """The storage error code ("QueueNotFound", ...) as plain text; the SDK gives an enum or a str."""
    code = getattr(error, "error_code", None)
    if code is None:
        return None
    return str(getattr(code, "value", code))


def _seconds(value: float, minimum: int) -> int:
    """A visibility timeout in whole seconds (the service wants an int), never shorter than asked."""
    if value != value or value < 0:  # NaN or negative
        raise ValueError(f"visibility timeout must be a number of seconds >= 0, got {value!r}")
    return max(minimum, min(MAX_VISIBILITY_SECONDS, math.ceil(value)))


def _connection_string_keys(connection_string: str) -> dict[str, str]:
    """The key=value pairs of a storage connection string, keys upper-cased (as the SDK reads them)."""
    pairs: dict[str, str] = {}
    for part in connection_string.strip().rstrip(";").split(";"):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise QueueError(
                f"{CONNECTION_SETTING}: not a storage connection string (a ';'-separated part has no "
                "'='); expected 'UseDevelopmentStorage=true' or "
                "'DefaultEndpointsProtocol=https;AccountName=<account>;AccountKey=<key>;...'"
            )
        pairs[key.strip().upper()] = value.strip()
    return pairs


def _key_names(connection_string: str) -> str:
    """The key names of a connection string as written (never the values: they hold secrets)."""
    names = [part.partition("=")[0].strip() for part in connection_string.split(";") if part.strip()]
    # A name that is not a plain word may be a pasted key or token: do not echo it.
    shown = [name if re.fullmatch(r"[A-Za-z]{1,40}", name) else "<not a key name>" for name in names]
    return ", ".join(shown) or "nothing"


def _validated(name: str, encoding: str) -> tuple[str, str]:
    """The queue name and encoding, checked (ConfigError names the setting)."""
    encoding = (encoding or "").strip().lower()
    if encoding not in ENCODINGS:
        raise ConfigError(ENCODING_SETTING, encoding, "base64 or none (as host.json messageEncoding)")
    if not _QUEUE_NAME.fullmatch(name or ""):
        raise ConfigError(
            QUEUE_NAME_SETTING, name,
            "3-56 lowercase letters, digits and single hyphens, starting and ending with a letter "
            "or digit (an Azure Storage queue name that still fits '-poison' appended)",
        )
    return name, encoding


class AzureStorageQueue:
    """One Azure Storage queue (and its "<name>-poison" companion) behind the queue port."""

    def __init__(
        self,
        service: "QueueServiceClient",
        name: str,
        encoding: str,
        *,
        endpoint: str,
        credential: Any = None,
    ) -> None:
        """Wrap a QueueServiceClient; use `from_settings` to build one from app settings."""
        self.name, self.encoding = _validated(name, encoding)
        self.endpoint = endpoint
        self._service = service
        self._credential = credential
        self._client = self._queue_client(name)
        self._poison_client: QueueClient | None = None

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_settings(
        cls,
        connection_string: str | None,
        queue_service_uri: str | None,
        client_id: str | None,
        queue_name: str,
        encoding: str,
    ) -> "AzureStorageQueue":
        """Connect as the Functions host does for the `AzureWebJobsStorage` connection.

        A connection string in `AzureWebJobsStorage` wins (as in the host, where a setting with the
        exact connection name is read as a connection string); otherwise the identity-based
        `AzureWebJobsStorage__queueServiceUri`, with `ManagedIdentityCredential(client_id)` when
        `AzureWebJobsStorage__clientId` is set (a user-assigned identity) and
        `DefaultAzureCredential` otherwise (system-assigned identity in Azure, developer sign-in
        locally).
        """
        # azure-storage-queue loads on first use (cold start): only queue mode needs it
        from azure.storage.queue import QueueServiceClient

        queue_name, encoding = _validated(queue_name, encoding)
        connection_string = (connection_string or "").strip() or None
        queue_service_uri = (queue_service_uri or "").strip() or None
        client_id = (client_id or "").strip() or None
        options = cls._client_options()

        if connection_string:
            keys = _connection_string_keys(connection_string)
            if "USEDEVELOPMENTSTORAGE" in keys:
                # The Python SDK expands exactly "UseDevelopmentStorage=true" itself (parse_connection_str
                # in azure/storage/queue/_shared/base_client.py) but not "True"/"TRUE", which .NET and
                # the Functions host accept; expanding it here covers every spelling the host takes.
                if keys["USEDEVELOPMENTSTORAGE"].lower() != "true":
                    raise QueueError(
                        f"{CONNECTION_SETTING}: UseDevelopmentStorage={keys['USEDEVELOPMENTSTORAGE']!r} "
                        "is not valid; expected UseDevelopmentStorage=true (Azurite on 127.0.0.1:10001) "
                        "or a full connection string"
                    )
                connection_string = AZURITE_CONNECTION_STRING
                keys = _connection_string_keys(connection_string)
            elif "ACCOUNTKEY" not in keys and "SHAREDACCESSSIGNATURE" not in keys:
                raise QueueError(
                    f"{CONNECTION_SETTING}: the connection string has no AccountKey or "
                    f"SharedAccessSignature (found {_key_names(connection_string)}); for an "
                    f"identity-based connection leave {CONNECTION_SETTING} unset and set "
                    f"{SERVICE_URI_SETTING}=https://<account>.queue.core.windows.net"
                )
            try:
                service = QueueServiceClient.from_connection_string(connection_string, **options)
            except ValueError as error:
                raise QueueError(
                    f"{CONNECTION_SETTING}: not a usable storage connection string ({_first_line(error)}; "
                    f"found {_key_names(connection_string)}); expected "
                    "'UseDevelopmentStorage=true' or "
                    "'DefaultEndpointsProtocol=https;AccountName=<account>;AccountKey=<key>;EndpointSuffix=core.windows.net'"
                ) from error
            # service.url carries the SAS token when there is one: never show it in messages.
            endpoint = urlsplit(service.url)._replace(query="", fragment="").geturl().rstrip("/")
            return cls(service, queue_name, encoding, endpoint=endpoint)

        if queue_service_uri:
            parts = urlsplit(queue_service_uri)
            if parts.scheme != "https" or not parts.netloc or parts.query:
                raise QueueError(
                    f"{SERVICE_URI_SETTING}={_redact(queue_service_uri)!r}: expected "
                    "https://<account>.queue.core.windows.net (identity tokens are only sent over HTTPS; "
                    "no query string)"
                )
            credential = cls._identity_credential(client_id)
            service = QueueServiceClient(queue_service_uri, credential=credential, **options)
            return cls(service, queue_name, encoding, endpoint=queue_service_uri.rstrip("/"),
                       credential=credential)

        raise QueueError(
            f"no queue connection: set {CONNECTION_SETTING} (a connection string, or "
            f"UseDevelopmentStorage=true for Azurite) or {SERVICE_URI_SETTING} (identity-based)"
        )

    @staticmethod
    def _identity_credential(client_id: str | None) -> Any:
        if client_id:
            # azure-identity loads on first use (cold start): only Entra ID needs it
            from azure.identity import ManagedIdentityCredential

            return ManagedIdentityCredential(client_id=client_id)
        # azure-identity loads on first use (cold start): only Entra ID needs it
        from azure.identity import DefaultAzureCredential

        return DefaultAzureCredential()

    @staticmethod
    def _client_options() -> dict[str, Any]:
        # azure-storage-queue loads on first use (cold start): only queue mode needs it
        from azure.storage.queue import LinearRetry

        return {
            "retry_policy": LinearRetry(
                backoff=RETRY_BACKOFF_SECONDS, retry_total=RETRY_TOTAL, random_jitter_range=0
            ),
            "connection_timeout": CONNECTION_TIMEOUT_SECONDS,
            "read_timeout": READ_TIMEOUT_SECONDS,
        }

    def _queue_client(self, name: str) -> "QueueClient":
        options: dict[str, Any] = {}
        encode_policy = _make_encode_policy(self.encoding)
        decode_policy = _make_decode_policy(self.encoding)
        if encode_policy is not None:
            options["message_encode_policy"] = encode_policy
        if decode_policy is not None:
            options["message_decode_policy"] = decode_policy
        return self._service.get_queue_client(name, **options)

    @property
    def poison_name(self) -> str:
        return self.name + POISON_SUFFIX

    def _poison(self) -> "QueueClient":
        if self._poison_client is None:
            self._poison_client = self._queue_client(self.poison_name)
        return self._poison_client

    def close(self) -> None:
        """Release HTTP connections (and the identity credential's)."""
        self._client.close()
        if self._poison_client is not None:
            self._poison_client.close()
        self._service.close()
        close = getattr(self._credential, "close", None)
        if close is not None:
            close()

    def __repr__(self) -> str:
        return f"AzureStorageQueue({self.name!r} at {self.endpoint}, encoding={self.encoding})"

    # -- errors ---------------------------------------------------------------------------------

    def _error(self, error: Exception, action: str, queue: str | None = None) -> QueueError:
        """One clear line for a failure talking to the queue service."""
        # azure-core (azure-storage-queue's) loads on first use (cold start)
        from azure.core.exceptions import (
            ClientAuthenticationError,
            HttpResponseError,
            ResourceNotFoundError,
            ServiceRequestError,
            ServiceResponseError,
        )

        queue = queue or self.name
        where = f"queue {queue!r} at {self.endpoint}"
        cause = _first_line(error)
        code = _error_code(error)
        status = getattr(error, "status_code", None)
        if isinstance(error, ServiceRequestError):
            return QueueError(
                f"cannot {action} {where}: the queue service is unreachable ({cause}); "
                f"is Azurite or the storage account up, and is {CONNECTION_SETTING} / "
                f"{SERVICE_URI_SETTING} right?"
            )
        if isinstance(error, ServiceResponseError):
            return QueueError(f"cannot {action} {where}: the queue service stopped responding ({cause})")
        if isinstance(error, ClientAuthenticationError) or status in (401, 403):
            if self._credential is not None:
                hint = (
                    f"the app's identity needs the 'Storage Queue Data Contributor' role on the account"
                    f" (and {CLIENT_ID_SETTING} must name a user-assigned identity, if set)"
                )
            else:
                hint = f"check the account key or SAS in {CONNECTION_SETTING}"
            return QueueError(f"cannot {action} {where}: authentication failed ({code or cause}); {hint}")
        if isinstance(error, ResourceNotFoundError) and code in (None, "QueueNotFound"):
            return QueueError(
                f"cannot {action} {where}: the queue does not exist; run `init-db` (it creates the "
                "queue) or call ensure_exists()"
            )
        if isinstance(error, HttpResponseError):
            return QueueError(f"cannot {action} {where}: the service answered {status} {code or ''} ({cause})")
        return QueueError(f"cannot {action} {where}: {cause}")

    @staticmethod
    def _is_lost_message(error: Exception) -> bool:
        return _error_code(error) in _LOST_MESSAGE_CODES

    # -- producer side --------------------------------------------------------------------------

    def ensure_exists(self) -> None:
        # azure-core (azure-storage-queue's) loads on first use (cold start)
        from azure.core.exceptions import AzureError, ResourceExistsError

        try:
            self._client.create_queue()
        except ResourceExistsError:
            pass  # 409 QueueAlreadyExists (e.g. created with other metadata): it exists, fine
        except AzureError as error:
            raise self._error(error, "create") from error

    def send_many(self, bodies: Sequence[str], *, delays: Sequence[float] | None = None,
                  time_to_live: float | None = None) -> None:
        """Send in order, one message per call (the service has no batch send); ``delays[i]``
        seconds keeps message i invisible until then (a run's slot; at most 7 days), and
        ``time_to_live`` seconds bounds the life of each (default: the service's 7 days). On a
        failure raise QueueSendError whose `sent` counts the bodies already on the queue."""
        # azure-core (azure-storage-queue's) loads on first use (cold start)
        from azure.core.exceptions import AzureError

        if delays is not None and len(delays) != len(bodies):
            raise ValueError(f"send_many: {len(bodies)} bodies but {len(delays)} delays")
        ttl = None if time_to_live is None else max(1, int(math.ceil(time_to_live)))
        for index, body in enumerate(bodies):
            delay = 0 if delays is None else min(MAX_VISIBILITY_DELAY, max(0, int(math.ceil(delays[index]))))
            if ttl is not None and delay >= ttl:
                delay = ttl - 1
            try:
                self._client.send_message(body, visibility_timeout=delay or None, time_to_live=ttl)
            except AzureError as error:
                failure = self._error(error, "send to")
                done = f" ({index} of {len(bodies)} messages were sent)" if index else ""
                raise QueueSendError(f"{failure}{done}", sent=index, total=len(bodies)) from error

    def depth(self) -> int:
        """Messages in the queue, visible or not (the service's approximate count, as the
        Functions scale controller sees it)."""
        # azure-core (azure-storage-queue's) loads on first use (cold start)
        from azure.core.exceptions import AzureError

        try:
            properties = self._client.get_queue_properties()
        except AzureError as error:
            raise self._error(error, "count the messages of") from error
        return int(properties.approximate_message_count or 0)

    # -- consumer side --------------------------------------------------------------------------

    def receive(self, max_messages: int, visibility_timeout: float) -> list[ReceivedMessage]:
        """Up to `max_messages` messages, hidden for `visibility_timeout` seconds. A message
        that is not valid base64 on a base64 queue is moved to "<name>-poison" at once instead,
        as the Functions host does; an empty list still means no message was visible."""
        if max_messages < 1:
            return []
        seconds = _seconds(visibility_timeout, minimum=1)
        received: list[ReceivedMessage] = []
        while len(received) < max_messages:
            deliverable, undecodable = self._receive_batch(max_messages - len(received), seconds)
            received += deliverable
            for message in undecodable:
                self._poison_undecodable(message)
            if not undecodable:
                break  # else ask again: the moved ones must not make a busy queue look empty
        return received

    def _receive_batch(self, max_messages: int,
                       seconds: int) -> tuple[list[ReceivedMessage], list[ReceivedMessage]]:
        # azure-core (azure-storage-queue's) loads on first use (cold start)
        from azure.core.exceptions import AzureError

        deliverable: list[ReceivedMessage] = []
        undecodable: list[ReceivedMessage] = []
        try:
            pages = self._client.receive_messages(
                messages_per_page=min(max_messages, MAX_MESSAGES_PER_CALL),
                max_messages=max_messages,
                visibility_timeout=seconds,
            )
            for message in pages:
                body = message.content if message.content is not None else ""
                received = ReceivedMessage(
                    id=message.id,
                    body=str(body),
                    dequeue_count=int(message.dequeue_count or 0),
                    pop_receipt=message.pop_receipt,
                    inserted_at=message.inserted_on,
                )
                (undecodable if isinstance(body, _UndecodableText) else deliverable).append(received)
        except AzureError as error:
            raise self._error(error, "receive from") from error
        return deliverable, undecodable

    def _poison_undecodable(self, message: ReceivedMessage) -> None:
        log.warning(
            "queue %r: message %s is not valid %s (AGENT_QUEUE_ENCODING / host.json messageEncoding); "
            "moved to %r at once without running it, as the Functions host does", self.name, message.id,
            self.encoding, self.poison_name,
        )
        try:
            self.move_to_poison(message)
        except QueueError as error:
            # It stays hidden for this receive's visibility timeout, then the next receive retries.
            log.error("queue %r: could not move message %s to %r: %s", self.name, message.id,
                      self.poison_name, error)

    def delete(self, message: ReceivedMessage) -> None:
        # azure-core (azure-storage-queue's) loads on first use (cold start)
        from azure.core.exceptions import AzureError

        try:
            self._client.delete_message(message.id, message.pop_receipt)
        except AzureError as error:
            if self._is_lost_message(error):
                log.info("queue %r: message %s was already deleted or re-received elsewhere (%s)",
                         self.name, message.id, _error_code(error))
                return
            raise self._error(error, "delete a message from") from error

    def release(self, message: ReceivedMessage, visibility_timeout: float) -> None:
        # azure-core (azure-storage-queue's) loads on first use (cold start)
        from azure.core.exceptions import AzureError

        seconds = _seconds(visibility_timeout, minimum=0)
        try:
            # No content: only the visibility changes; the body and dequeue count stay.
            self._client.update_message(message.id, message.pop_receipt, visibility_timeout=seconds)
        except AzureError as error:
            if self._is_lost_message(error):
                log.info("queue %r: message %s is no longer held by this consumer (%s)",
                         self.name, message.id, _error_code(error))
                return
            raise self._error(error, "release a message on") from error

    def move_to_poison(self, message: ReceivedMessage) -> None:
        """Copy the body to "<name>-poison" (created on first use), then delete the original:
        what the host does after maxDequeueCount failed deliveries."""
        # azure-core (azure-storage-queue's) loads on first use (cold start)
        from azure.core.exceptions import AzureError, ResourceExistsError, ResourceNotFoundError

        poison = self._poison()
        try:
            try:
                poison.send_message(message.body)
            except ResourceNotFoundError:
                try:
                    poison.create_queue()
                except ResourceExistsError:
                    pass  # another worker created it a moment ago
                poison.send_message(message.body)
        except AzureError as error:
            raise self._error(error, "send to", queue=self.poison_name) from error
        self.delete(message)
