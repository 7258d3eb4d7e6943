"""Long units split by purpose (issue 49): the report's page module stays the page and its entry points, with runs,
tables and figures in modules of their own."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_report_module_holds_only_the_page_and_its_entry_points():
    lines = len((REPO / "fedlight" / "reports" / "report.py").read_text().splitlines())
    assert lines <= 300, f"fedlight/reports/report.py has {lines} lines: runs, tables and figures live beside it"
