"""The queue as the Functions host sees it: the port (``port``), the messages, the Azure Storage
adapter and the in-memory double that tests and ``bench/`` use. Imports only ``shared.errors``,
``shared.values`` and ``shared.telemetry``."""
