"""Which telemetry exporter sends the engine's telemetry: the setting and its parsing, apart from
shared/telemetry/client.py so that settings parsing (shared/settings.py) can validate it without importing
the telemetry layer (no exporter is imported here or there until telemetry is first sent)."""

from __future__ import annotations

from shared.errors import ConfigError

EXPORTER_SETTING = "AGENT_TELEMETRY_EXPORTER"
EXPORTERS = ("opentelemetry", "opencensus")
DEFAULT_EXPORTER = "opentelemetry"


def parse_exporter(value: str | None) -> str:
    """AGENT_TELEMETRY_EXPORTER: "opentelemetry" (default when unset or blank) or
    "opencensus", case-insensitive. Raises ConfigError for anything else."""
    if value is None or not value.strip():
        return DEFAULT_EXPORTER
    name = value.strip().lower()
    if name not in EXPORTERS:
        raise ConfigError(EXPORTER_SETTING, value, "one of " + ", ".join(EXPORTERS))
    return name
