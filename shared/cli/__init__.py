"""The ``sql-agent`` command line (``python -m shared.cli``): thin commands over the engine's
operations, the monitor's views and the operator tools."""
