"""docs/cost.md's tables are bench/cost.py's output (issue 31 item 4): prices and measurements
in, the tables out; a change to either without regenerating the doc fails here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _cost_module():
    spec = importlib.util.spec_from_file_location("bench_cost", ROOT / "bench" / "cost.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_tables_are_the_scripts_output():
    cost = _cost_module()
    prices = json.loads(cost.PRICES.read_text(encoding="utf-8"))
    measured = json.loads(cost.MEASURED.read_text(encoding="utf-8"))
    doc = cost.DOC.read_text(encoding="utf-8")
    assert cost.doc_with_table(doc, cost.render(measured, prices)) == doc, \
        "docs/cost.md is not bench/cost.py's output: run python bench/cost.py --write-doc"
    assert "python bench/cost.py --write-doc" in doc


def test_the_prices_are_dated_and_say_they_are_unverified():
    prices = json.loads((ROOT / "bench" / "cost_prices.json").read_text(encoding="utf-8"))
    assert len(prices["date"]) == 10 and "NOT verified" in prices["note"]
    assert "azure.microsoft.com/pricing" in prices["note"]


def test_online_seconds_merge_the_uses_within_the_auto_pause_delay():
    cost = _cost_module()
    assert cost.online_seconds([], 15) == 0
    assert cost.online_seconds([0], 15) == 16 * 60
    assert cost.online_seconds([0, 10], 15) == 26 * 60            # overlapping: merged
    assert cost.online_seconds([0, 60], 15) == 2 * 16 * 60        # apart: paused in between
    assert cost.online_seconds(list(range(1440)), 15) == 86400    # every minute: never paused
