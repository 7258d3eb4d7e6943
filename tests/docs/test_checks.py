"""README's test command runs the lint, format and type checks before the tests, and the pre-commit config runs the
same ones, so what a contributor runs before a commit is what CI proves."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def readme_checks() -> list[str]:
    line = next(line for line in (REPO / "README.md").read_text().splitlines() if line.endswith("  # tests"))
    steps = [step.strip() for step in line.removesuffix("  # tests").split("&&")]
    return [step for step in steps if step.startswith((".venv/bin/ruff", ".venv/bin/mypy"))]


def test_readme_runs_lint_format_and_types_before_the_tests():
    assert readme_checks() == [".venv/bin/ruff check .", ".venv/bin/ruff format --check .", ".venv/bin/mypy"]


def test_the_pre_commit_hooks_are_readmes_checks():
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    entries = [hook["entry"] for repo in config["repos"] for hook in repo["hooks"]]
    assert entries == readme_checks()
