"""Long units split by purpose (issue 49): the report's page module stays the page and its entry points, with runs,
tables and figures in modules of their own; `VectorizedTrainer.fit_many` reads as its steps (sort and prepare the
rows, train epoch by epoch, put the results back in the clients' order), none of them loops nested deeper than two."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

from fedlight.training.vectorized import VectorizedTrainer

REPO = Path(__file__).resolve().parents[2]


def loop_depth(node: ast.AST) -> int:
    """How deep `for` and `while` loops nest in `node` (comprehensions not counted)."""
    inner = max((loop_depth(child) for child in ast.iter_child_nodes(node)), default=0)
    return inner + isinstance(node, (ast.For, ast.AsyncFor, ast.While))


def test_the_report_module_holds_only_the_page_and_its_entry_points():
    lines = len((REPO / "fedlight" / "reports" / "report.py").read_text().splitlines())
    assert lines <= 300, f"fedlight/reports/report.py has {lines} lines: runs, tables and figures live beside it"


def test_fit_many_reads_as_its_steps_and_no_method_nests_loops_deeper_than_two():
    lines = len(inspect.getsource(VectorizedTrainer.fit_many).splitlines())
    assert lines <= 40, f"VectorizedTrainer.fit_many has {lines} lines"
    tree = ast.parse(textwrap.dedent(inspect.getsource(VectorizedTrainer)))
    methods = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]
    deep = {m.name: depth for m in methods if (depth := loop_depth(m)) > 2}
    assert len(methods) > 10 and not deep, deep
