"""Which telemetry a process gets: the no-op one when no connection string is set, else the chosen
exporter's (OpenTelemetry by default, opencensus when AGENT_TELEMETRY_EXPORTER says so). Both
exporters' libraries load on the first use, never at import (cold start)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from shared.telemetry.client import AUTHENTICATION_STRING_SETTING, CONNECTION_STRING_SETTING, AppInsightsTelemetry, Telemetry
from shared.telemetry.exporters import EXPORTER_SETTING, parse_exporter


def create_telemetry(connection_string: str | None, *, role_name: str = "sql-agent",
                     authentication_string: str | None = None, credential: Any = None,
                     storage_path: str | None = None, enable_local_storage: bool = True,
                     timeout_seconds: float = 3.0, retry_interval_seconds: float = 30.0,
                     exporter: str | None = None) -> Telemetry:
    """No-op ``Telemetry()`` when ``connection_string`` is None or blank, otherwise the
    exporter's telemetry: ``exporter`` "opentelemetry" (the default: azure-monitor-opentelemetry-
    exporter, ``shared.telemetry.otel``) or "opencensus" (``AppInsightsTelemetry``, the retired
    opencensus-ext-azure), imported now; None reads AGENT_TELEMETRY_EXPORTER.

    ``authentication_string`` is the value of APPLICATIONINSIGHTS_AUTHENTICATION_STRING
    (``Authorization=AAD`` and optionally ``ClientId=<guid>`` of a user-assigned identity):
    ingestion then uses an Entra ID token from a managed identity, as needed when the
    Application Insights resource has local authentication disabled. ``credential`` (any
    azure-core TokenCredential) takes precedence over it.

    A malformed connection or authentication string raises ``shared.errors.ConfigError``
    naming the setting, the offending part and what is expected."""
    exporter = parse_exporter(os.environ.get(EXPORTER_SETTING) if exporter is None else exporter)
    if connection_string is None or not connection_string.strip():
        return Telemetry()
    if exporter == "opentelemetry":
        # the OpenTelemetry SDK and exporter load only when chosen, on first use (cold start)
        from shared.telemetry.otel import OpenTelemetryTelemetry

        cls: type[Telemetry] = OpenTelemetryTelemetry
    else:
        cls = AppInsightsTelemetry
    return cls(
        connection_string, role_name=role_name, authentication_string=authentication_string,
        credential=credential, storage_path=storage_path,
        enable_local_storage=enable_local_storage, timeout_seconds=timeout_seconds,
        retry_interval_seconds=retry_interval_seconds)


def create_telemetry_from_env(environ: Mapping[str, str] | None = None, *,
                              role_name: str | None = None) -> Telemetry:
    """``create_telemetry`` from app settings: APPLICATIONINSIGHTS_CONNECTION_STRING,
    APPLICATIONINSIGHTS_AUTHENTICATION_STRING, and the role name from WEBSITE_SITE_NAME (the
    function app's name, which the Functions host's own telemetry uses) or "sql-agent"."""
    env = os.environ if environ is None else environ
    return create_telemetry(
        env.get(CONNECTION_STRING_SETTING), exporter=parse_exporter(env.get(EXPORTER_SETTING)),
        role_name=role_name or env.get("WEBSITE_SITE_NAME") or "sql-agent",
        authentication_string=env.get(AUTHENTICATION_STRING_SETTING))
