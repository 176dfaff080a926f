"""Telemetry to Application Insights, behind one module.

Everything the engine reports to Application Insights goes through this module's API, with
one of two exporters (AGENT_TELEMETRY_EXPORTER): OpenTelemetry with
azure-monitor-opentelemetry-exporter (the default, ``shared.telemetry.otel``) or OpenCensus
(``opencensus-ext-azure``, retired, last release 1.1.15, ``AppInsightsTelemetry`` here).

- ``create_telemetry(None)`` (or an empty string) returns the no-op ``Telemetry``: it checks
  its arguments the same way (so engine tests that run without Application Insights still
  catch a misspelled event name) and sends nothing. This module never imports opencensus at
  import time; only ``AppInsightsTelemetry`` does, when it is created.
- ``AppInsightsTelemetry`` (``AGENT_TELEMETRY_EXPORTER=opencensus``) builds Application
  Insights envelopes (custom events, metrics, remote dependencies) with opencensus-ext-azure's
  protocol classes and posts them itself (``_Sender``: ``requests``, status-code handling,
  redirects, Entra ID bearer tokens; no private API of the library), spilling to the library's
  local file storage when ingestion is unreachable. The default exporter is OpenTelemetry
  (``shared.telemetry.otel``). Envelopes are buffered in memory and posted *in the caller's thread* by
  ``flush()``; the engine calls ``flush()`` before a function invocation returns, because the
  Functions host may freeze the process right after, so a background exporter thread could
  not be trusted to have sent anything.
- Exporting never raises and never blocks for long: one POST has ``timeout_seconds``; after a
  failed POST the rest of the flush goes to local storage (or stays buffered) and the
  network is left alone for ``retry_interval_seconds``.
- Arguments that come from code are checked (unknown event or metric name, a property value
  of an unsupported type): those are programming errors and raise ``ValueError`` /
  ``TypeError`` in both modes. Operation ids come from data (the runs table, a queue
  message), so they are normalised instead (a GUID or uppercase hex becomes 32 lowercase
  hex) and a malformed one is left off the item with a warning, never raised.

Why not the library's handlers: ``AzureEventHandler``, ``AzureExporter`` and the metrics
exporter each own a background thread with its own queue and interval, and each starts
"statsbeat" (the SDK's own usage metrics, posted to a Microsoft endpoint, synchronously at
construction with a 10 s timeout). Building the envelopes here and sending them through the
library's transport gives one synchronous flush and no extra egress.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime as _dt
import decimal
import enum
import json
import logging
import math
import os
import re
import secrets
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from shared.errors import ConfigError
from shared.telemetry.exporters import EXPORTER_SETTING, EXPORTERS, parse_exporter

log = logging.getLogger(__name__)


CONNECTION_STRING_SETTING = "APPLICATIONINSIGHTS_CONNECTION_STRING"


AUTHENTICATION_STRING_SETTING = "APPLICATIONINSIGHTS_AUTHENTICATION_STRING"


EVENT_NAMES = ("RunClaimed", "RunDispatched", "RunStarted", "RunSucceeded", "RunFailed", "RunRetried",
               "LeaseExpired", "RunPoisoned", "MisfireSkipped", "OverlapSkipped", "JobConfigInvalid",
               "StaleMessage", "ClockSkewDetected", "StepSucceeded", "StepFailed", "TargetsResolved",
               "JobPaused", "JobResumed", "FollowUpStarted", "FollowUpRefused", "AlertRaised")


METRIC_NAMES = ("TickDurationMs", "RunsDue", "RunsClaimed", "RunsDispatched", "ScheduleLagSeconds",
                "RunDurationMs", "DequeueCount")


# The dimension (customDimensions key) names the engine uses, so the README's KQL and the
# engine agree. Not enforced: an event may carry other keys too.
STANDARD_DIMENSIONS = ("job", "run_id", "attempt", "scheduled_for", "token", "kind", "outcome",
                       "error_number", "error_message", "duration_ms", "retry_at", "dequeue_count",
                       "poison_id", "step", "output", "target_database", "target_server", "parent_run_id",
                       "targets", "targets_failed", "paused_until", "paused_by", "reason", "runs_skipped",
                       "followed_run_id", "alert")


# Application Insights limits (data model): longer values are truncated by ingestion anyway;
# truncating here keeps the POST small and the cut predictable.
MAX_PROPERTY_KEY_LENGTH = 150


MAX_PROPERTY_VALUE_LENGTH = 8192


MAX_NAME_LENGTH = 1024


MAX_DEPENDENCY_DATA_LENGTH = 8192


# Used when the connection string names neither IngestionEndpoint nor EndpointSuffix
# (the same fallback as opencensus-ext-azure).
DEFAULT_INGESTION_ENDPOINT = "https://dc.services.visualstudio.com"


# Where unsent envelopes wait when local storage is on and no storage_path is given: the
# OS temp directory (on Azure Functions a per-instance writable /tmp), never the repo or home.
DEFAULT_STORAGE_DIR_NAME = "sql-agent-telemetry"


_OPERATION_ID = re.compile(r"^[0-9a-f]{32}\Z")


_GUID = re.compile(r"^[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}\Z")


def new_operation_id() -> str:
    """A new operation id: 32 lowercase hex characters (a W3C trace id), never all zeros."""
    while True:
        value = secrets.token_hex(16)
        if value != "0" * 32:
            return value


def is_valid_operation_id(value: object) -> bool:
    """True for a W3C trace id (32 lowercase hex characters, not all zeros). Use it to check
    an operation id read from a queue message before passing it on."""
    return isinstance(value, str) and bool(_OPERATION_ID.match(value)) and value != "0" * 32


@dataclasses.dataclass
class DependencyCall:
    """What ``sql_call`` yields: the block may add properties (e.g. a row count) or set the
    result code (e.g. the SQL error number) before the dependency is recorded."""

    properties: dict[str, object] = dataclasses.field(default_factory=dict)
    result_code: str | None = None


class Telemetry:
    """The no-op telemetry (Application Insights not configured) and the base of the real one.

    Every method checks its arguments, is safe to call and returns None."""

    enabled: bool = False

    def event(self, name: str, properties: Mapping[str, object] | None = None, *,
              operation_id: str | None = None) -> None:
        _check_event_name(name)
        operation_id = _operation_id(operation_id)
        _dimensions(properties)

    def metric(self, name: str, value: float, properties: Mapping[str, object] | None = None, *,
               operation_id: str | None = None) -> None:
        _check_metric(name, value)
        operation_id = _operation_id(operation_id)
        _dimensions(properties)

    def dependency(self, name: str, *, target: str, duration_ms: float, success: bool,
                   operation_id: str | None = None, data: str | None = None,
                   dependency_type: str = "SQL", properties: Mapping[str, object] | None = None,
                   result_code: str | None = None) -> None:
        _check_dependency(name, target, duration_ms, success, dependency_type)
        operation_id = _operation_id(operation_id)
        _dimensions(properties)

    @contextlib.contextmanager
    def sql_call(self, name: str, *, target: str, operation_id: str | None = None,
                 data: str | None = None) -> Iterator[DependencyCall]:
        """Time the block and record it as a SQL dependency; if the block raises, record
        success=False (result code: ``call.result_code`` or the exception's class name) and
        re-raise."""
        _check_dependency(name, target, 0.0, True, "SQL")
        operation_id = _operation_id(operation_id)
        call = DependencyCall()
        if not self.enabled:
            yield call
            _dimensions(call.properties)  # same checks as the real telemetry
            return
        started_at = _utc_now()
        started = time.perf_counter()
        try:
            yield call
        except BaseException as exc:
            duration_ms = (time.perf_counter() - started) * 1000.0
            properties = dict(call.properties)
            properties.setdefault("error_type", type(exc).__name__)
            properties.setdefault("error_message", str(exc))
            try:
                self._record_dependency(name, target=target, duration_ms=duration_ms,
                                        success=False, operation_id=operation_id, data=data,
                                        dependency_type="SQL", properties=properties,
                                        result_code=call.result_code or type(exc).__name__,
                                        started_at=started_at)
            except Exception:  # never hide the block's own exception behind telemetry's
                log.warning("telemetry: could not record failed dependency %s", name,
                            exc_info=True)
            raise
        duration_ms = (time.perf_counter() - started) * 1000.0
        self._record_dependency(name, target=target, duration_ms=duration_ms, success=True,
                                operation_id=operation_id, data=data, dependency_type="SQL",
                                properties=call.properties, result_code=call.result_code or "0",
                                started_at=started_at)

    def flush(self) -> None:
        """Send everything recorded so far (no-op here)."""

    def close(self) -> None:
        """Flush and release resources (no-op here)."""

    def _record_dependency(self, name: str, *, target: str, duration_ms: float, success: bool,
                           operation_id: str | None, data: str | None, dependency_type: str,
                           properties: Mapping[str, object] | None, result_code: str | None,
                           started_at: _dt.datetime | None) -> None:
        """Hook for ``sql_call``; the no-op records nothing."""


@dataclasses.dataclass(frozen=True)
class IngestionSettings:
    """What a connection string says: the instrumentation key and the ingestion endpoint
    (without trailing slash; the transport appends ``/v2.1/track``)."""

    instrumentation_key: str
    endpoint: str


def parse_connection_string(connection_string: str) -> IngestionSettings:
    """Parse an Application Insights connection string (``Key=Value;...``, keys
    case-insensitive). The endpoint is ``IngestionEndpoint``, else built from
    ``EndpointSuffix`` (and ``Location``), else the global default, as opencensus-ext-azure
    does. Raises ConfigError naming the offending part."""
    pairs: dict[str, str] = {}
    for segment in connection_string.strip().split(";"):
        segment = segment.strip()
        if not segment:
            continue  # tolerate "a=b;" and ";;"
        key, sep, value = segment.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ConfigError(CONNECTION_STRING_SETTING, segment,
                              "Key=Value pairs separated by ';', e.g. "
                              "InstrumentationKey=<guid>;IngestionEndpoint=https://<region>.in.applicationinsights.azure.com/")
        pairs[key.strip().lower()] = value.strip()
    ikey = pairs.get("instrumentationkey")
    if ikey is None:
        raise ConfigError(CONNECTION_STRING_SETTING, None,
                          "an InstrumentationKey=<guid> part (copy the connection string from the "
                          "Application Insights resource's Overview page)")
    if not _GUID.match(ikey.lower()):
        raise ConfigError(CONNECTION_STRING_SETTING, f"InstrumentationKey={ikey}",
                          "InstrumentationKey to be a GUID like "
                          "00000000-0000-0000-0000-000000000000")
    ikey = ikey.lower()
    authorization = pairs.get("authorization")
    if authorization is not None and authorization.lower() != "ikey":
        raise ConfigError(CONNECTION_STRING_SETTING, f"Authorization={authorization}",
                          "Authorization=ikey or no Authorization part (for Entra ID use "
                          f"{AUTHENTICATION_STRING_SETTING}=Authorization=AAD)")
    endpoint = pairs.get("ingestionendpoint")
    if endpoint is None and pairs.get("endpointsuffix"):
        location = pairs.get("location")
        endpoint = "https://" + (location + "." if location else "") + "dc." + pairs["endpointsuffix"]
    endpoint = (endpoint or DEFAULT_INGESTION_ENDPOINT).rstrip("/")
    if not re.match(r"^https?://[^/\s]+", endpoint):
        raise ConfigError(CONNECTION_STRING_SETTING, f"IngestionEndpoint={pairs.get('ingestionendpoint')}",
                          "an http(s) URL such as https://<region>.in.applicationinsights.azure.com/")
    return IngestionSettings(instrumentation_key=ikey, endpoint=endpoint)


def parse_authentication_string(authentication_string: str | None) -> str | None | bool:
    """Parse APPLICATIONINSIGHTS_AUTHENTICATION_STRING. Returns False when unset (key-based
    ingestion), otherwise the client id of a user-assigned identity or None (system-assigned).
    Raises ConfigError for anything else."""
    if authentication_string is None or not authentication_string.strip():
        return False
    pairs: dict[str, str] = {}
    for segment in authentication_string.strip().split(";"):
        segment = segment.strip()
        if not segment:
            continue
        key, sep, value = segment.partition("=")
        if not sep or not value.strip():
            raise ConfigError(AUTHENTICATION_STRING_SETTING, segment,
                              "Authorization=AAD or Authorization=AAD;ClientId=<guid>")
        pairs[key.strip().lower()] = value.strip()
    if pairs.get("authorization", "").lower() != "aad":
        raise ConfigError(AUTHENTICATION_STRING_SETTING, authentication_string,
                          "Authorization=AAD or Authorization=AAD;ClientId=<guid>")
    client_id = pairs.get("clientid")
    if client_id is not None and not _GUID.match(client_id.lower()):
        raise ConfigError(AUTHENTICATION_STRING_SETTING, f"ClientId={client_id}",
                          "the client id (a GUID) of the function app's user-assigned identity")
    unknown = sorted(set(pairs) - {"authorization", "clientid"})
    if unknown:
        raise ConfigError(AUTHENTICATION_STRING_SETTING, authentication_string,
                          "only the parts Authorization and ClientId")
    return client_id.lower() if client_id else None


class AppInsightsTelemetry(Telemetry):
    """Telemetry sent to Application Insights as opencensus-ext-azure envelopes (the
    ``opencensus`` exporter), posted by ``_Sender``."""

    enabled = True
    exporter_name = "opencensus"
    # A flush posts at most this many envelopes per request (the library's default batch).
    max_batch_size = 100
    # Flush from the recording call once this many envelopes wait, so a long tick that
    # records thousands of events does not hold them all until the end.
    auto_flush_threshold = 500
    # With ingestion down and local storage off, keep at most this many envelopes waiting;
    # the oldest are dropped (and counted in ``dropped``).
    max_pending = 10_000
    # Envelopes waiting in local storage sent per flush (each up to max_batch_size), so a
    # large backlog does not make one invocation slow.
    max_stored_batches_per_flush = 10

    def __init__(self, connection_string: str, *, role_name: str = "sql-agent",
                 authentication_string: str | None = None, credential: Any = None,
                 storage_path: str | None = None, enable_local_storage: bool = True,
                 timeout_seconds: float = 3.0, retry_interval_seconds: float = 30.0) -> None:
        settings = parse_connection_string(connection_string)
        if not role_name or not role_name.strip():
            raise ValueError("role_name: expected a non-empty cloud role name, got "
                             f"{role_name!r}")
        if not timeout_seconds > 0:
            raise ValueError(f"timeout_seconds: expected a positive number, got {timeout_seconds!r}")
        if not retry_interval_seconds >= 0:
            raise ValueError("retry_interval_seconds: expected zero or more, got "
                             f"{retry_interval_seconds!r}")
        client_id = parse_authentication_string(authentication_string)
        lib = _opencensus()
        if credential is None and client_id is not False:
            # Lazy like opencensus: only an app that uses Entra ID ingestion pays for it.
            from azure.identity import ManagedIdentityCredential
            credential = ManagedIdentityCredential(client_id=client_id) if client_id \
                else ManagedIdentityCredential()
        if credential is not None and not hasattr(credential, "get_token"):
            raise ValueError("credential: expected an azure-core TokenCredential (with get_token), "
                             f"got {type(credential).__name__}")
        self.instrumentation_key = settings.instrumentation_key
        self.endpoint = settings.endpoint
        self.role_name = role_name.strip()
        self.timeout_seconds = float(timeout_seconds)
        self.retry_interval_seconds = float(retry_interval_seconds)
        self.storage_path: str | None = None
        self.dropped = 0
        self._lib = lib
        self._tags = dict(lib.utils.azure_monitor_context)
        self._tags["ai.cloud.role"] = self.role_name
        self._pending: list[dict] = []
        self._pending_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._network_paused_until = 0.0
        self._closed = False
        storage = None
        if enable_local_storage:
            self.storage_path = os.path.abspath(storage_path or os.path.join(
                tempfile.gettempdir(), DEFAULT_STORAGE_DIR_NAME, settings.instrumentation_key))
            storage = lib.LocalFileStorage(path=self.storage_path, source=type(self).__name__)
        self._sender = lib.make_sender(endpoint=settings.endpoint, credential=credential,
                                       timeout=self.timeout_seconds, storage=storage)
        atexit.register(self._flush_at_exit)

    # -- recording -------------------------------------------------------------------

    def event(self, name: str, properties: Mapping[str, object] | None = None, *,
              operation_id: str | None = None) -> None:
        _check_event_name(name)
        operation_id = _operation_id(operation_id)
        dims = _dimensions(properties)
        lib = self._lib
        data = lib.Event(name=name, properties=dims, measurements={})
        self._add(self._envelope("Event", lib.Data(baseData=data, baseType="EventData"),
                                 operation_id, _utc_now()))

    def metric(self, name: str, value: float, properties: Mapping[str, object] | None = None, *,
               operation_id: str | None = None) -> None:
        _check_metric(name, value)
        operation_id = _operation_id(operation_id)
        dims = _dimensions(properties)
        lib = self._lib
        point = lib.DataPoint(ns="SqlAgent", name=name, value=float(value))
        data = lib.MetricData(metrics=[point], properties=dims)
        self._add(self._envelope("Metric", lib.Data(baseData=data, baseType="MetricData"),
                                 operation_id, _utc_now()))

    def dependency(self, name: str, *, target: str, duration_ms: float, success: bool,
                   operation_id: str | None = None, data: str | None = None,
                   dependency_type: str = "SQL", properties: Mapping[str, object] | None = None,
                   result_code: str | None = None) -> None:
        _check_dependency(name, target, duration_ms, success, dependency_type)
        operation_id = _operation_id(operation_id)
        started_at = _utc_now() - _dt.timedelta(milliseconds=duration_ms)
        self._record_dependency(name, target=target, duration_ms=duration_ms, success=success,
                                operation_id=operation_id, data=data,
                                dependency_type=dependency_type, properties=properties,
                                result_code=result_code, started_at=started_at)

    def _record_dependency(self, name: str, *, target: str, duration_ms: float, success: bool,
                           operation_id: str | None, data: str | None, dependency_type: str,
                           properties: Mapping[str, object] | None, result_code: str | None,
                           started_at: _dt.datetime | None) -> None:
        if self._closed:
            return
        dims = _dimensions(properties)
        code = str(result_code if result_code is not None else ("0" if success else ""))
        if code:
            # Also a dimension: the OpenTelemetry exporter's resultCode is "0" for every SQL
            # call, so queries read customDimensions.result_code with either exporter.
            dims.setdefault("result_code", code[:MAX_PROPERTY_VALUE_LENGTH])
        lib = self._lib
        body = lib.RemoteDependency(
            name=name[:MAX_NAME_LENGTH],
            id=secrets.token_hex(8),
            resultCode=code,
            duration=lib.utils.microseconds_to_duration(int(round(duration_ms * 1000))),
            success=bool(success),
            data=None if data is None else str(data)[:MAX_DEPENDENCY_DATA_LENGTH],
            type=dependency_type,
            target=target,
            properties=dims,
            measurements={},
        )
        self._add(self._envelope("RemoteDependency",
                                 lib.Data(baseData=body, baseType="RemoteDependencyData"),
                                 operation_id, started_at or _utc_now()))

    def _envelope(self, kind: str, data: Any, operation_id: str | None,
                  at: _dt.datetime) -> dict:
        tags = dict(self._tags)
        if operation_id is not None:
            # All items of one run share the operation id (carried in the queue message), so
            # tick -> queue -> SQL is one end-to-end transaction. No item here is a span of
            # its own that others hang under, so every item is a child of the operation root.
            tags["ai.operation.id"] = operation_id
            tags["ai.operation.parentId"] = operation_id
        return self._lib.Envelope(
            name=f"Microsoft.ApplicationInsights.{kind}",
            time=_iso_utc(at),
            iKey=self.instrumentation_key,
            tags=tags,
            data=data,
        )

    def _add(self, envelope: dict) -> None:
        if self._closed:
            return
        with self._pending_lock:
            self._pending.append(envelope)
            size = len(self._pending)
        if size >= self.auto_flush_threshold:
            self.flush()

    # -- sending ---------------------------------------------------------------------

    def flush(self) -> None:
        """Post everything recorded so far, now, in this thread. Never raises. Takes at most
        about ``timeout_seconds`` when ingestion is unreachable (then the envelopes go to local
        storage, or stay buffered, and the network is left alone for
        ``retry_interval_seconds``)."""
        try:
            with self._flush_lock:
                self._flush_locked()
        except Exception:  # telemetry must never break a job
            log.warning("telemetry: flush failed; telemetry may be lost", exc_info=True)

    def _flush_locked(self) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, []
        sender = self._sender
        if time.monotonic() < self._network_paused_until:
            self._park(pending)
            return
        status = self._lib.TransportStatusCode
        for start in range(0, len(pending), self.max_batch_size):
            batch = pending[start:start + self.max_batch_size]
            result = sender.transmit(batch)
            if result is status.RETRY:
                self._pause_network()
                self._park(pending[start:])
                return
            # SUCCESS, or DROP (a non-retryable answer, already logged by the sender).
        if sender.retry_later:  # items a partial (206) answer marked retryable
            again, sender.retry_later = sender.retry_later, []
            self._park(again)
        if sender.storage is not None:
            self._send_stored()

    def _send_stored(self) -> None:
        status = self._lib.TransportStatusCode
        storage = self._sender.storage
        sent = 0
        for blob in storage.gets():
            if sent >= self.max_stored_batches_per_flush:
                break
            # The lease (a rename) keeps another instance sharing the directory off this blob.
            if not blob.lease(self.timeout_seconds + 5):
                continue
            envelopes = blob.get()
            if not envelopes:
                blob.delete()
                continue
            result = self._sender.transmit(list(envelopes))
            sent += 1
            if result is status.RETRY:
                blob.lease(self.retry_interval_seconds)
                self._pause_network()
                return
            blob.delete()

    def _park(self, envelopes: list[dict]) -> None:
        """Keep envelopes that could not be sent: in local storage (picked up by a later
        flush, here or in another process) or, without storage, in memory (bounded)."""
        if not envelopes:
            return
        storage = self._sender.storage
        if storage is not None:
            for start in range(0, len(envelopes), self.max_batch_size):
                batch = envelopes[start:start + self.max_batch_size]
                if storage.put(batch, lease_period=int(math.ceil(self.retry_interval_seconds))) is None:
                    self._count_dropped(len(batch), "local storage is full or not writable")
            return
        with self._pending_lock:
            self._pending[:0] = envelopes
            excess = len(self._pending) - self.max_pending
            if excess > 0:
                del self._pending[:excess]
        if excess > 0:
            self._count_dropped(excess, "ingestion unreachable and local storage is off")

    def _count_dropped(self, count: int, why: str) -> None:
        self.dropped += count
        log.warning("telemetry: dropped %d envelope(s): %s", count, why)

    def _pause_network(self) -> None:
        self._network_paused_until = time.monotonic() + self.retry_interval_seconds

    def close(self) -> None:
        """Flush, stop the local storage's maintenance thread; later calls record nothing."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        atexit.unregister(self._flush_at_exit)
        storage = self._sender.storage
        if storage is not None:
            with contextlib.suppress(Exception):
                storage.close()

    def _flush_at_exit(self) -> None:
        # A CLI run ends with the interpreter; a function invocation flushes explicitly.
        self.close()


class _OpenCensus:
    """The parts of opencensus-ext-azure this module uses, imported on first use."""

    def __init__(self) -> None:
        with warnings.catch_warnings():
            # opencensus-ext-azure calls locale.getdefaultlocale() at import, deprecated since
            # Python 3.11; the library is frozen, so the warning is noise.
            warnings.simplefilter("ignore", DeprecationWarning)
            # the opencensus exporter loads on first use (cold start), only when chosen
            from opencensus.ext.azure.common import utils

            # the opencensus exporter loads on first use (cold start), only when chosen
            from opencensus.ext.azure.common.protocol import (
                BaseObject,
                Data,
                DataPoint,
                Envelope,
                Event,
                MetricData,
                RemoteDependency,
            )

            # the opencensus exporter loads on first use (cold start), only when chosen
            from opencensus.ext.azure.common.storage import LocalFileStorage
        self.utils = utils
        self.BaseObject = BaseObject
        self.Data = Data
        self.DataPoint = DataPoint
        self.Envelope = Envelope
        self.Event = Event
        self.MetricData = MetricData
        self.RemoteDependency = RemoteDependency
        self.LocalFileStorage = LocalFileStorage
        self.TransportStatusCode = _Status

    def make_sender(self, *, endpoint: str, credential: Any, timeout: float, storage: Any) -> Any:
        return _Sender(endpoint=endpoint, credential=credential, timeout=timeout, storage=storage)


class _Status(enum.Enum):
    SUCCESS = "success"
    RETRY = "retry"  # keep the envelopes: ingestion unreachable, throttled or failing
    DROP = "drop"    # ingestion refused them for good (logged)


# Answers after which the same envelopes may succeed later (the ingestion API's retryable codes).
_RETRYABLE = frozenset({206, 401, 403, 408, 429, 439, 500, 502, 503, 504})


_MAX_REDIRECTS = 10


_INGESTION_SCOPE = "https://monitor.azure.com//.default"


class _Sender:
    """POSTs envelopes to ``<endpoint>/v2.1/track`` with ``requests`` (the HTTP client
    opencensus-ext-azure itself uses): an Entra ID bearer token when a credential is given,
    redirects followed (307/308, the new endpoint kept), items a 206 answer marks retryable
    resent later. Public APIs only; the library's ``LocalFileStorage`` keeps what waits."""

    def __init__(self, *, endpoint: str, credential: Any, timeout: float, storage: Any) -> None:
        # opencensus's transport loads on first use (cold start), only when chosen
        import requests

        self._requests = requests
        self._session = requests.Session()
        self.endpoint = endpoint
        self.credential = credential
        self.timeout = timeout
        self.storage = storage
        self.retry_later: list[Any] = []  # items of a partial (206) answer to send again

    def transmit(self, envelopes: list[Any]) -> _Status:
        if not envelopes:
            return _Status.SUCCESS
        body = json.dumps(envelopes, default=str)
        headers = {"Accept": "application/json", "Content-Type": "application/json; charset=utf-8"}
        for _ in range(_MAX_REDIRECTS + 1):
            try:
                if self.credential is not None:
                    token = self.credential.get_token(_INGESTION_SCOPE)
                    headers["Authorization"] = f"Bearer {token.token}"
                response = self._session.post(self.endpoint + "/v2.1/track", data=body,
                                              headers=headers, timeout=self.timeout,
                                              allow_redirects=False)
            except Exception as exc:  # timeout, refused, DNS, no token: try again later
                log.warning("telemetry: ingestion not reachable (%s); will retry", type(exc).__name__)
                return _Status.RETRY
            status = response.status_code
            if status in (307, 308) and response.headers.get("location"):
                location = response.headers["location"]
                match = re.match(r"^(https?://[^/]+)", location)
                if match:
                    self.endpoint = match.group(1)
                    continue
            if status == 200:
                return _Status.SUCCESS
            if status == 206:
                return self._partial(envelopes, response)
            if status in _RETRYABLE:
                log.warning("telemetry: ingestion answered %d; will retry", status)
                return _Status.RETRY
            log.warning("telemetry: ingestion refused %d item(s) with %d: %.300s", len(envelopes),
                        status, response.text)
            return _Status.DROP
        log.warning("telemetry: more than %d redirects; dropping %d item(s)", _MAX_REDIRECTS,
                    len(envelopes))
        return _Status.DROP

    def _partial(self, envelopes: list[Any], response: Any) -> _Status:
        try:
            errors = response.json().get("errors") or []
            again = [envelopes[e["index"]] for e in errors
                     if e.get("statusCode") in _RETRYABLE and 0 <= e.get("index", -1) < len(envelopes)]
        except Exception:
            return _Status.RETRY
        if again:
            self.retry_later.extend(again)
        return _Status.SUCCESS


_lib: _OpenCensus | None = None


_lib_lock = threading.Lock()


def _opencensus() -> _OpenCensus:
    global _lib
    with _lib_lock:
        if _lib is None:
            _lib = _OpenCensus()
        return _lib


def _check_event_name(name: object) -> None:
    if name not in EVENT_NAMES:
        raise ValueError(f"telemetry event name {name!r}: expected one of {', '.join(EVENT_NAMES)}")


def _check_metric(name: object, value: object) -> None:
    if name not in METRIC_NAMES:
        raise ValueError(f"telemetry metric name {name!r}: expected one of {', '.join(METRIC_NAMES)}")
    if isinstance(value, bool) or not isinstance(value, (int, float, decimal.Decimal)) \
            or not math.isfinite(value):
        raise ValueError(f"telemetry metric {name} value {value!r}: expected a finite number")


def _operation_id(operation_id: object) -> str | None:
    """The operation id as 32 lowercase hex characters, or None (with a warning) when it is
    malformed: an id read from the database or a message must not fail the job."""
    if operation_id is None:
        return None
    if isinstance(operation_id, str):
        candidate = operation_id.strip().lower()
        if _GUID.match(candidate):
            candidate = candidate.replace("-", "")
        if is_valid_operation_id(candidate):
            return candidate
    log.warning("telemetry: operation id %.80r is not 32 hex characters (a W3C trace id); "
                "sending the item without it", operation_id)
    return None


def _check_dependency(name: object, target: object, duration_ms: object, success: object,
                      dependency_type: object) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"telemetry dependency name {name!r}: expected a non-empty string")
    if not isinstance(target, str) or not target:
        raise ValueError(f"telemetry dependency {name} target {target!r}: expected a non-empty "
                         "string such as '<server>|<database>'")
    if isinstance(duration_ms, bool) or not isinstance(duration_ms, (int, float)) \
            or not math.isfinite(duration_ms) or duration_ms < 0:
        raise ValueError(f"telemetry dependency {name} duration_ms {duration_ms!r}: expected a "
                         "finite number >= 0")
    if not isinstance(success, bool):
        raise ValueError(f"telemetry dependency {name} success {success!r}: expected True or False")
    if not isinstance(dependency_type, str) or not dependency_type:
        raise ValueError(f"telemetry dependency {name} dependency_type {dependency_type!r}: "
                         "expected a non-empty string such as 'SQL'")


def _dimensions(properties: Mapping[str, object] | None) -> dict[str, str]:
    """Properties as Application Insights customDimensions: string values, None omitted,
    datetimes in ISO-8601 UTC."""
    if not properties:
        return {}
    out: dict[str, str] = {}
    for key, value in properties.items():
        if not isinstance(key, str) or not key or len(key) > MAX_PROPERTY_KEY_LENGTH:
            raise ValueError(f"telemetry property name {key!r}: expected a non-empty string of at "
                             f"most {MAX_PROPERTY_KEY_LENGTH} characters")
        if value is None:
            continue
        out[key] = _dimension_value(key, value)[:MAX_PROPERTY_VALUE_LENGTH]
    return out


def _dimension_value(key: str, value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return _dimension_value(key, value.value)
    if isinstance(value, (int, decimal.Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    if isinstance(value, _dt.datetime):
        return _iso_utc(value)
    if isinstance(value, _dt.date):
        return value.isoformat()
    raise TypeError(f"telemetry property {key!r} value of type {type(value).__name__}: expected "
                    "str, int, float, bool, Decimal, UUID, Enum, date or datetime (or None to omit)")


def _utc_now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def _iso_utc(value: _dt.datetime) -> str:
    """ISO-8601 in UTC with a 'Z'. A naive datetime is taken as UTC (the engine stores UTC)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.timezone.utc)
    value = value.astimezone(_dt.timezone.utc)
    return value.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


__all__ = [
    "EVENT_NAMES", "METRIC_NAMES", "STANDARD_DIMENSIONS", "Telemetry", "AppInsightsTelemetry",
    "DependencyCall", "IngestionSettings",
    "EXPORTER_SETTING", "EXPORTERS", "parse_exporter",
    "new_operation_id", "is_valid_operation_id", "parse_connection_string",
    "parse_authentication_string",
]
