"""The tests' own layout (CONTRIBUTING.md, "Tests"): every test module in one folder by kind, what modules share in the
`helpers` package, conftest.py with fixtures only, and no test module importing another or conftest."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
#: the folders a test module may sit in: one module or function; a method's defining properties; whole runs, the
#: command line, configs, processes, benchmarks; the docs and the repository's layout
FOLDERS = ("unit", "algorithms", "integration", "docs")


def module_files() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, anywhere in it (inside functions too); a relative import as its dots and name."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add("." * node.level + (node.module or ""))
    return found


def test_no_test_module_sits_at_the_top_of_tests():
    assert sorted(p.name for p in TESTS.glob("*.py")) == ["conftest.py"]


def test_every_test_module_sits_in_one_of_the_folders():
    misplaced = [
        p.relative_to(TESTS).as_posix()
        for p in module_files()
        if p.parent.parent != TESTS or p.parent.name not in FOLDERS
    ]
    assert not misplaced, f"test modules outside tests/{{{','.join(FOLDERS)}}}/: {misplaced}"
    assert all(any((TESTS / folder).glob("test_*.py")) for folder in FOLDERS)


def test_test_folders_are_no_packages_so_module_names_are_unique():
    """pytest imports a test module by its file name when its folder has no __init__.py (rootdir-based import)."""
    assert not [folder for folder in FOLDERS if (TESTS / folder / "__init__.py").exists()]
    repeated = [name for name, count in Counter(p.name for p in module_files()).items() if count > 1]
    assert not repeated, f"test module names used twice: {repeated}"


def test_helpers_is_a_package_of_shared_code_and_no_tests():
    helpers = TESTS / "helpers"
    assert (helpers / "__init__.py").is_file()
    assert not list(helpers.rglob("test_*.py")) and not (helpers / "conftest.py").exists()


def test_nothing_imports_a_test_module_or_conftest():
    """Test modules, the helpers, conftest.py and the benchmarks (which put tests/ on their path) import what tests
    share from `helpers`, never a test module or conftest: a test module imported by another is collected twice over
    and ties the two together."""
    names = {p.stem for p in module_files()}
    sources = [
        *module_files(),
        *(TESTS / "helpers").rglob("*.py"),
        TESTS / "conftest.py",
        *(REPO / "benchmarks").glob("*.py"),
    ]
    offending = []
    for path in sources:
        for module in imported_modules(path):
            top = module.split(".")[0]
            if module.startswith(".") or top in ("conftest", "tests") or top in names or top.startswith("test_"):
                offending.append(f"{path.relative_to(REPO).as_posix()} imports {module}")
    assert not offending, offending


def test_conftest_holds_fixtures_only():
    """Its functions are fixtures (pytest's hooks would be too); a helper a test imports belongs in `helpers`."""
    tree = ast.parse((TESTS / "conftest.py").read_text())
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    assert functions
    plain = [
        f.name
        for f in functions
        if not f.name.startswith("pytest_") and not any("fixture" in ast.unparse(d) for d in f.decorator_list)
    ]
    assert not plain, f"conftest.py functions that are no fixtures (move them to tests/helpers/): {plain}"
