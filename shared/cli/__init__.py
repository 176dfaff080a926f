"""The ``sql-agent`` command line (``python -m shared.cli``): thin commands over the engine's
operations, the monitor's views and the operator tools."""

from shared.cli.commands import COMMANDS, main

__all__ = ["COMMANDS", "main"]
