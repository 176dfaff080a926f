"""This process's wall clock shifted, as the engine's modules read it (tests and benchmarks)."""

from __future__ import annotations

import contextlib
import sys
import time
from datetime import datetime, timedelta, timezone

UTC = timezone.utc


@contextlib.contextmanager
def instance_clock_shifted(seconds: float):
    """This process's wall clock, as every module of the engine reads it (``datetime.now``,
    ``datetime.utcnow``, ``time.time``), ``seconds`` off. The monotonic clock and the database's
    clock are left alone: they are not this instance's wall clock."""
    import shared

    real_time = time.time
    shift = timedelta(seconds=seconds)

    class Real(type):
        def __instancecheck__(cls, value):        # a datetime from anywhere is one of these
            return isinstance(value, datetime)

    class ShiftedDatetime(datetime, metaclass=Real):
        @classmethod
        def now(cls, tz=None):
            return datetime.now(tz) + shift

        @classmethod
        def utcnow(cls):
            return datetime.now(UTC).replace(tzinfo=None) + shift

    patched = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "shared" or name.startswith("shared.")):
            continue
        if getattr(module, "datetime", None) is datetime:
            patched.append((module, "datetime", datetime))
            module.datetime = ShiftedDatetime
    time.time = lambda: real_time() + seconds
    try:
        assert shared is not None
        yield
    finally:
        time.time = real_time
        for module, attribute, value in patched:
            setattr(module, attribute, value)
