"""CONTRIBUTING.md's checklist for every registered algorithm: its file with a docstring naming its paper, a shipped
config, a test that names it, a row in the README's table and in the compatibility table."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from fedlight.run.compatibility_table import ROWS
from fedlight.run.registry import short_names

REPO = Path(__file__).resolve().parents[2]
NAMES = sorted(short_names())
#: algorithms that are no paper's method, and what they are instead
NO_PAPER = {"local": "each client alone, the lower baseline of every personalized paper"}


def module_file(class_path: str) -> Path:
    module = class_path.rsplit(".", 1)[0]  # fedlight.algorithms.<file>
    return REPO / "algorithms" / f"{module.rsplit('.', 1)[-1]}.py"


@pytest.fixture(scope="module")
def config_texts() -> str:
    return "\n".join(p.read_text() for p in (REPO / "configs").rglob("*.yaml"))


@pytest.fixture(scope="module")
def test_texts() -> str:
    return "\n".join(p.read_text() for p in (REPO / "tests").rglob("test_*.py") if p.name != Path(__file__).name)


@pytest.mark.parametrize("name", NAMES)
def test_each_algorithm_meets_the_checklist(name, config_texts, test_texts):
    path = short_names()[name]
    source = module_file(path)
    assert source.is_file(), f"{name}: its entry point {path} names no file under algorithms/"
    docstring = ast.get_docstring(ast.parse(source.read_text())) or ""
    assert name in NO_PAPER or re.search(r'"[A-Z][^"]{10,}"', docstring) or "(" in docstring.split("\n")[0], (
        f"{source.name}: the module docstring should name the paper by title (and section)"
    )
    assert re.search(rf"(class_path|algorithm):\s*{re.escape(name)}\b", config_texts), (
        f"{name}: no shipped config under configs/ runs it (step 3 of CONTRIBUTING.md)"
    )
    class_name = path.rsplit(".", 1)[1]
    assert re.search(rf"\b({re.escape(class_name)}|{re.escape(name)})\b", test_texts), (
        f"{name}: no test names it (step 4)"
    )
    assert f"`{name}`" in (REPO / "README.md").read_text(), f"{name}: not in the README's algorithm table (step 6)"
    assert name in ROWS, (
        f"{name}: not in the compatibility table: python -m fedlight.run.compatibility --write (step 7)"
    )


def test_the_repository_has_its_license_and_guides_for_contributors():
    assert "Apache License" in (REPO / "LICENSE").read_text() and "Apache-2.0" in (REPO / "pyproject.toml").read_text()
    assert "ten steps" in (REPO / "CONTRIBUTING.md").read_text() and (REPO / "CHANGELOG.md").is_file()
