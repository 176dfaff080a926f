"""Triggers only: each turns a Functions binding into one engine call. No SQL here."""
