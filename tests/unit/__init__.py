"""Tests that need no service: pure functions and in-process doubles."""
