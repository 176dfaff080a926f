"""Telemetry to Application Insights: the API the engine calls (``client``), its OpenTelemetry and
OpenCensus exporters. Imports only ``shared.errors``/``shared.values``; the exporters' libraries load
on the first use (cold start), never at import."""
