"""Telemetry to Application Insights on OpenTelemetry (``azure-monitor-opentelemetry-exporter``).

The same API as ``shared.telemetry.client.AppInsightsTelemetry`` (``event``, ``metric``,
``dependency``, ``sql_call``, ``flush``, ``close``), landing in the same tables:

- events are OpenTelemetry log records carrying ``microsoft.custom_event.name``: the exporter
  turns them into ``customEvents``;
- metrics are histograms read with delta temporality at each flush: ``customMetrics`` (one
  row per metric name and dimension set per flush: ``value`` the sum, ``valueCount`` the
  number of recordings);
- dependencies are CLIENT spans with ``db.system``: ``dependencies`` of type SQL, target
  ``<server>|<database>``.

Nothing is exported in the background: the processors here only buffer, and ``flush()``
exports in the caller's thread through the exporters' public ``export()`` (the Functions
host may freeze the process right after an invocation returns). The operation id of a run
becomes the OpenTelemetry trace id (``operation_Id``), so tick -> queue -> SQL is still one
end-to-end transaction. Custom metrics carry no operation id on OpenTelemetry (metrics are
aggregates). Imported only when telemetry is created with the OpenTelemetry exporter.

Entra ID: ``credential=`` (any azure-core TokenCredential) is handed to the exporters, which
request a token for ``https://monitor.azure.com//.default``: with it, the Application Insights
resource can have local (key) authentication disabled.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import os
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import trace as _trace_api
from opentelemetry.sdk._logs import LoggerProvider, LogRecordProcessor
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from shared.telemetry import client as _t

_EXPORTER_EXTRAS_OFF = ("APPLICATIONINSIGHTS_STATSBEAT_DISABLED_ALL", "APPLICATIONINSIGHTS_SDKSTATS_DISABLED",
                        "APPLICATIONINSIGHTS_CONTROLPLANE_DISABLED")
_RESOURCE_METRIC_SETTING = "APPLICATIONINSIGHTS_OPENTELEMETRY_RESOURCE_METRIC_DISABLED"
_environ_lock = threading.Lock()


@contextlib.contextmanager
def _exporter_extras_off() -> Iterator[None]:
    """The exporter's background extras' switches set to "true" (unless set already) while
    the block runs, restored after."""
    with _environ_lock:
        added = [name for name in _EXPORTER_EXTRAS_OFF if name not in os.environ]
        for name in added:
            os.environ[name] = "true"
        try:
            yield
        finally:
            for name in added:
                os.environ.pop(name, None)


class _Buffer(LogRecordProcessor, SpanProcessor):
    """Keeps what was recorded until ``take()``; exports nothing by itself."""

    def __init__(self) -> None:
        self._items: list[Any] = []
        self._lock = threading.Lock()

    def on_emit(self, log_record: Any) -> None:  # LogRecordProcessor
        with self._lock:
            self._items.append(log_record)

    def emit(self, log_record: Any) -> None:  # older SDK name of on_emit
        self.on_emit(log_record)

    def on_start(self, span: Any, parent_context: Any = None) -> None:  # SpanProcessor
        pass

    def on_end(self, span: Any) -> None:  # SpanProcessor
        with self._lock:
            self._items.append(span)

    def take(self) -> list[Any]:
        with self._lock:
            items, self._items = self._items, []
        return items

    def put_back(self, items: list[Any], limit: int) -> int:
        with self._lock:
            self._items[:0] = items
            excess = max(0, len(self._items) - limit)
            if excess:
                del self._items[:excess]
        return excess

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _context(operation_id: str | None) -> Any:
    if operation_id is None:
        return None
    parent = SpanContext(trace_id=int(operation_id, 16), span_id=int(operation_id[16:], 16) or 1,
                         is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return _trace_api.set_span_in_context(NonRecordingSpan(parent))


def _ns(at: _dt.datetime) -> int:
    return int(at.timestamp() * 1_000_000_000)


class OpenTelemetryTelemetry(_t.Telemetry):
    """Telemetry sent to Application Insights through azure-monitor-opentelemetry-exporter."""

    enabled = True
    exporter_name = "opentelemetry"
    max_batch_size = 100
    auto_flush_threshold = 500
    max_pending = 10_000

    def __init__(self, connection_string: str, *, role_name: str = "sql-agent",
                 authentication_string: str | None = None, credential: Any = None,
                 storage_path: str | None = None, enable_local_storage: bool = True,
                 timeout_seconds: float = 3.0, retry_interval_seconds: float = 30.0) -> None:
        settings = _t.parse_connection_string(connection_string)
        if not role_name or not role_name.strip():
            raise ValueError(f"role_name: expected a non-empty cloud role name, got {role_name!r}")
        if not timeout_seconds > 0:
            raise ValueError(f"timeout_seconds: expected a positive number, got {timeout_seconds!r}")
        if not retry_interval_seconds >= 0:
            raise ValueError(f"retry_interval_seconds: expected zero or more, got {retry_interval_seconds!r}")
        client_id = _t.parse_authentication_string(authentication_string)
        if credential is None and client_id is not False:
            # azure-identity loads on first use (cold start): only Entra ID needs it
            from azure.identity import ManagedIdentityCredential
            credential = ManagedIdentityCredential(client_id=client_id) if client_id \
                else ManagedIdentityCredential()
        if credential is not None and not hasattr(credential, "get_token"):
            raise ValueError("credential: expected an azure-core TokenCredential (with get_token), "
                             f"got {type(credential).__name__}")
        # The exporter's extras that run in the background are off: its own usage metrics
        # ("statsbeat", posted to a Microsoft endpoint, as with the OpenCensus exporter), the
        # customer "SDK stats" (a periodic reader thread) and the "OneSettings" control-plane
        # worker (a thread polling a Microsoft endpoint). Their documented switches are read
        # when an exporter is created, so they are set only while ours are created: the
        # OpenCensus transport reads APPLICATIONINSIGHTS_STATSBEAT_DISABLED_ALL too, and its
        # retry handling misbehaves when it is set. An extra "_OTELRESOURCE_" metric with every
        # span export is off for the process (only this exporter reads that switch). An app
        # setting of any of these names wins.
        os.environ.setdefault(_RESOURCE_METRIC_SETTING, "true")
        # the telemetry exporter loads on first use (cold start), only when telemetry is on
        from azure.monitor.opentelemetry.exporter import (
            AzureMonitorLogExporter,
            AzureMonitorMetricExporter,
            AzureMonitorTraceExporter,
        )

        self.instrumentation_key = settings.instrumentation_key
        self.endpoint = settings.endpoint
        self.role_name = role_name.strip()
        self.timeout_seconds = float(timeout_seconds)
        self.retry_interval_seconds = float(retry_interval_seconds)
        self.dropped = 0
        self.storage_path: str | None = None
        if enable_local_storage:
            self.storage_path = os.path.abspath(storage_path or os.path.join(
                tempfile.gettempdir(), _t.DEFAULT_STORAGE_DIR_NAME, settings.instrumentation_key))
        # The exporter parses the connection string itself; ours was validated above and is
        # rebuilt so a tolerated form (trailing ';', any key case) cannot trip it.
        exporter_options: dict[str, Any] = dict(
            connection_string=f"InstrumentationKey={settings.instrumentation_key};"
                              f"IngestionEndpoint={settings.endpoint}/",
            credential=credential, timeout=self.timeout_seconds, read_timeout=self.timeout_seconds,
            retry_total=0,
            disable_offline_storage=not enable_local_storage,
            storage_min_retry_interval=max(0, int(self.retry_interval_seconds)))
        if self.storage_path is not None:
            exporter_options["storage_directory"] = self.storage_path
        resource = Resource.create({"service.name": self.role_name})
        self._tracer_provider = TracerProvider(resource=resource)
        with _exporter_extras_off():
            self._log_exporter = AzureMonitorLogExporter(**exporter_options)
            self._trace_exporter = AzureMonitorTraceExporter(tracer_provider=self._tracer_provider,
                                                             **exporter_options)
            self._metric_exporter = AzureMonitorMetricExporter(**exporter_options)

        self._logs = _Buffer()
        self._spans = _Buffer()
        self._logger_provider = LoggerProvider(resource=resource)
        self._logger_provider.add_log_record_processor(self._logs)
        self._logger = self._logger_provider.get_logger("sql-agent")
        self._tracer_provider.add_span_processor(self._spans)
        self._tracer = self._tracer_provider.get_tracer("sql-agent")
        self._reader = InMemoryMetricReader(
            preferred_temporality={Histogram: AggregationTemporality.DELTA})
        # OpenTelemetry lower-cases instrument names; a view per metric keeps the engine's
        # names (customMetrics' name is compared case-sensitively in KQL).
        views = [View(instrument_name=name.lower(), name=name) for name in _t.METRIC_NAMES]
        self._meter_provider = MeterProvider(resource=resource, metric_readers=[self._reader],
                                             views=views)
        meter = self._meter_provider.get_meter("sql-agent")
        self._histograms = {name: meter.create_histogram(name) for name in _t.METRIC_NAMES}
        self._metrics_recorded = False
        self._flush_lock = threading.Lock()
        self._network_paused_until = 0.0
        self._closed = False
        atexit.register(self._flush_at_exit)

    # -- recording -------------------------------------------------------------------
    def event(self, name: str, properties: Mapping[str, object] | None = None, *,
              operation_id: str | None = None) -> None:
        _t._check_event_name(name)
        operation_id = _t._operation_id(operation_id)
        dims = _t._dimensions(properties)
        if self._closed:
            return
        # the telemetry exporter loads on first use (cold start), only when telemetry is on
        from opentelemetry._logs import SeverityNumber
        attributes = {**dims, "microsoft.custom_event.name": name}
        # Without an operation id the exporter would send the all-zero trace id, grouping
        # every such item into one operation: each gets a fresh one instead (as a span does).
        self._logger.emit(timestamp=time.time_ns(), context=_context(operation_id or _t.new_operation_id()),
                          severity_number=SeverityNumber.INFO, body=name, attributes=attributes)
        self._after_record()

    def metric(self, name: str, value: float, properties: Mapping[str, object] | None = None, *,
               operation_id: str | None = None) -> None:
        _t._check_metric(name, value)
        _t._operation_id(operation_id)  # checked (and warned) alike; metrics carry none
        dims = _t._dimensions(properties)
        if self._closed:
            return
        self._histograms[name].record(float(value), attributes=dims)
        self._metrics_recorded = True

    def dependency(self, name: str, *, target: str, duration_ms: float, success: bool,
                   operation_id: str | None = None, data: str | None = None,
                   dependency_type: str = "SQL", properties: Mapping[str, object] | None = None,
                   result_code: str | None = None) -> None:
        _t._check_dependency(name, target, duration_ms, success, dependency_type)
        operation_id = _t._operation_id(operation_id)
        started_at = _t._utc_now() - _dt.timedelta(milliseconds=duration_ms)
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
        dims = _t._dimensions(properties)
        server, _sep, database = target.partition("|")
        attributes: dict[str, Any] = dict(dims)
        # db.system "mssql" is what the exporter maps to type "SQL"; another type is its name.
        attributes["db.system"] = "mssql" if dependency_type == "SQL" else dependency_type
        attributes["server.address"] = server
        if database:
            attributes["db.name"] = database
        if data is not None:
            attributes["db.statement"] = str(data)[:_t.MAX_DEPENDENCY_DATA_LENGTH]
        start = started_at or _t._utc_now()
        span = self._tracer.start_span(name[:_t.MAX_NAME_LENGTH], context=_context(operation_id),
                                       kind=SpanKind.CLIENT, attributes=attributes,
                                       start_time=_ns(start))
        code = str(result_code if result_code is not None else ("0" if success else ""))
        if code and "result_code" not in dims:
            # The exporter sets resultCode "0" for every database span: the code goes in
            # customDimensions.result_code (with either exporter).
            span.set_attribute("result_code", code[:_t.MAX_PROPERTY_VALUE_LENGTH])
        span.set_status(Status(StatusCode.OK if success else StatusCode.ERROR))
        span.end(end_time=_ns(start) + int(round(duration_ms * 1_000_000)))
        self._after_record()

    def _after_record(self) -> None:
        if len(self._logs) + len(self._spans) >= self.auto_flush_threshold:
            self.flush()

    # -- sending ---------------------------------------------------------------------
    def flush(self) -> None:
        """Export everything recorded so far, now, in this thread. Never raises."""
        try:
            with self._flush_lock:
                self._flush_locked()
        except Exception:
            _t.log.warning("telemetry: flush failed; telemetry may be lost", exc_info=True)

    def _flush_locked(self) -> None:
        # the telemetry exporter loads on first use (cold start), only when telemetry is on
        from opentelemetry.sdk.trace.export import SpanExportResult

        if time.monotonic() < self._network_paused_until:
            return  # buffered: the next flush after the pause sends it
        for buffer, exporter in ((self._spans, self._trace_exporter), (self._logs, self._log_exporter)):
            items = sorted(buffer.take(), key=_start_time)
            for start in range(0, len(items), self.max_batch_size):
                batch = items[start:start + self.max_batch_size]
                result = exporter.export(batch)
                if getattr(result, "name", str(result)) == SpanExportResult.FAILURE.name:
                    # Retryable batches went to the exporter's local storage (when on);
                    # without it they wait in memory, bounded.
                    self._network_paused_until = time.monotonic() + self.retry_interval_seconds
                    # The failed batch is in the exporter's storage when that is on; what was
                    # not tried yet waits in memory (bounded) for the next flush after the pause.
                    waiting = items[start:] if self.storage_path is None else items[start + len(batch):]
                    dropped = buffer.put_back(waiting, self.max_pending)
                    if dropped:
                        self.dropped += dropped
                        _t.log.warning("telemetry: dropped %d item(s): ingestion unreachable", dropped)
                    return
        if self._metrics_recorded:
            self._metrics_recorded = False
            data = self._reader.get_metrics_data()
            if data is not None and data.resource_metrics:
                self._metric_exporter.export(data)

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        self._closed = True
        atexit.unregister(self._flush_at_exit)
        for exporter in (self._log_exporter, self._trace_exporter, self._metric_exporter):
            try:
                exporter.shutdown()
            except Exception:
                _t.log.debug("telemetry: exporter shutdown failed", exc_info=True)

    def _flush_at_exit(self) -> None:
        self.close()


def _start_time(item: Any) -> int:
    record = getattr(item, "log_record", None)
    if record is not None:
        return record.timestamp or 0
    return getattr(item, "start_time", 0) or 0
