"""The SQL Agent engine: schedules, claims, leases and execution of SQL jobs.

Importable and testable without the Functions host. Importing this package is cheap:
heavy dependencies (pyodbc, azure-identity, azure-storage-queue, the telemetry exporter) are imported
lazily where they are first used.
"""

__version__ = "0.1.0"
