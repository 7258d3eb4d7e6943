"""One registry: the pyproject entry points list the algorithms, and README's algorithm table is made from them
(`python -m fedlight.run.catalog --readme`), so adding an algorithm touches no hand-kept list."""

from __future__ import annotations

from pathlib import Path

from fedlight.run import catalog
from fedlight.run.registry import ALGORITHMS, short_names

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readmes_algorithm_table_is_the_registrys():
    text = README.read_text()
    assert catalog.with_algorithm_table(text) == text, "run `python -m fedlight.run.catalog --readme`"


def test_the_table_has_a_row_with_a_summary_for_every_registered_algorithm():
    rows = catalog.algorithm_table().splitlines()[2:]
    assert [row.split("`")[1] for row in rows] == sorted(short_names(ALGORITHMS))
    assert all(len(row.split("|")[2].strip()) > 20 for row in rows)  # each module's docstring says what it is
