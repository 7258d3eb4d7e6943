"""The package's shape as docs/architecture.md describes it: subpackages by role with an index each, imports that
point one way with no circle, every path the docs name exists, and a round that reads as the algorithm's story."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from fedlight.engine.federation import Federation

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "fedlight"
SUBPACKAGES = ("plugin", "aggregators", "engine", "training", "run", "reports", "cluster", "system")
#: what each subpackage may import of fedlight (besides itself) when it runs: training and cluster are leaves, the
#: plugin namespace builds on them, the aggregators on the plugin's values, the engine proper on all of these
ALLOWED = {
    "training": set(),
    "cluster": set(),
    "plugin": {"training", "cluster"},
    "aggregators": {"plugin", "training", "cluster"},
    "system": {"plugin", "training", "cluster"},
    "engine": {"plugin", "aggregators", "system", "training", "cluster"},
    "reports": {"engine", "plugin"},
    "run": {"engine", "plugin", "aggregators", "system", "training", "reports", "cluster"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_imports(path: Path, type_only: bool = False) -> set[str]:
    """The fedlight modules `path` imports when it runs (with `type_only`, also those under `if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text())
    skipped = (
        set()
        if type_only
        else {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for child in node.body
            for n in ast.walk(child)
        }
    )
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {name for name in found if name.startswith("fedlight.")}


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def test_fedlight_is_a_few_subpackages_by_role_each_with_an_index():
    top = sorted(p.name for p in PACKAGE.iterdir() if p.suffix == ".py")
    assert top == ["__init__.py", "__main__.py"]
    for name in SUBPACKAGES:
        index = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text()))
        assert index, f"fedlight/{name}/__init__.py has no index docstring"
        for module in (PACKAGE / name).glob("*.py"):
            if module.name != "__init__.py" and name != "cluster":
                assert f"`{module.stem}`" in index, f"fedlight/{name}/__init__.py does not list {module.stem}"


@pytest.mark.parametrize("subpackage", SUBPACKAGES)
def test_imports_point_one_way(subpackage):
    for path in (PACKAGE / subpackage).rglob("*.py"):
        for name in runtime_imports(path):
            parts = name.split(".")
            target = parts[1] if len(parts) > 1 else ""
            if target in MODULES or f"fedlight.{target}" in MODULES and target not in SUBPACKAGES:
                continue
            if target in ("algorithms", "datamodules", "models"):
                assert path.name == "registry.py", f"{path.relative_to(REPO)} imports the plugin {name}"
                continue
            assert target == subpackage or target in ALLOWED[subpackage], (
                f"{path.relative_to(REPO)} ({subpackage}) imports {name}"
            )


def test_no_import_circle_inside_fedlight_type_only_imports_included():
    graph = {
        name: {m for m in runtime_imports(path, type_only=True) if m in MODULES and m != name}
        for name, path in MODULES.items()
    }
    graph = {name: {m for m in edges if not name.startswith(m + ".")} for name, edges in graph.items()}  # a parent
    state: dict[str, int] = {}  # package is no circle

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError(
                    "import circle: " + " -> ".join(trail[trail.index(nxt) :] + [node, nxt])
                    if nxt in trail
                    else f"import circle through {node} -> {nxt}"
                )
            if nxt not in state:
                visit(nxt, trail + [node])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


def test_algorithms_import_only_the_plugin_namespace_and_the_clustering_toolkit():
    """An algorithm is written against `fedlight.plugin` (and `fedlight.cluster`, and a sibling algorithm it builds
    on), never against the engine's modules, so the engine can change behind the plugin boundary."""
    plugin_modules = {p.stem for p in (PACKAGE / "plugin").glob("*.py")}
    for path in sorted((REPO / "algorithms").glob("*.py")):
        for name in runtime_imports(path, type_only=True):
            parts = name.split(".")
            if parts[1] == "plugin":
                assert len(parts) == 2 or parts[2] not in plugin_modules, (
                    f"{path.relative_to(REPO)} imports {name}: import its names from fedlight.plugin itself"
                )
            else:
                assert parts[1] in ("cluster", "algorithms"), (
                    f"{path.relative_to(REPO)} imports {name}: an algorithm imports fedlight.plugin and "
                    "fedlight.cluster"
                )


def test_the_execution_path_is_declared_not_inferred_from_overrides():
    for path in PACKAGE.rglob("*.py"):
        assert "is Algorithm." not in path.read_text(), path.relative_to(REPO)


def test_run_round_reads_as_the_algorithms_story_and_calls_no_collective():
    source = inspect.getsource(Federation.run_round)
    body = [line for line in source.splitlines()[1:] if line.strip() and not line.strip().startswith(('"""', "#"))]
    assert len(source.splitlines()) <= 25
    steps = [
        "begin_round",
        "select_clients",
        "round_updates",
        "pre_aggregation",
        "aggregate(",
        "post_aggregation",
        "finish",
        "evaluate",
    ]
    positions = [next(i for i, line in enumerate(body) if step in line) for step in steps]
    assert positions == sorted(positions)
    assert not re.search(r"collective|all_reduce|all_gather|broadcast|gather\(", source)


def documented_paths() -> list[str]:
    paths = []
    for doc in (
        REPO / "docs" / "architecture.md",
        REPO / "README.md",
        *sorted((REPO / "docs" / "guides").glob("*.md")),
    ):
        for match in re.findall(
            r"`((?:fedlight|tests|benchmarks|configs|docs|algorithms|models|datamodules)/"
            r"[\w./-]*)`",
            doc.read_text(),
        ):
            paths.append(match)
    return paths


def test_every_file_path_the_docs_name_exists():
    paths = documented_paths()
    assert len(paths) > 10
    missing = [p for p in paths if not (REPO / p).exists()]
    assert not missing, missing


def test_every_module_the_docs_name_exists():
    doc = (REPO / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`(fedlight(?:\.\w+)+)`", doc))
    missing = [
        n
        for n in named
        if n not in MODULES
        and n.rsplit(".", 1)[0] not in MODULES
        and n != "fedlight.EarlyStopping"
        and not hasattr(__import__("fedlight"), n.split(".")[1])
    ]
    assert not missing, missing


def test_federation_names_no_extension_outside_the_place_it_builds_them():
    """Attacks, privacy, held-out clients and the system model are round extensions: federation.py names them only in
    its imports, the constructor's parameters, the builder `_extensions` and the line that calls it; no `if`,
    attribute or docstring elsewhere."""
    path = PACKAGE / "engine" / "federation.py"
    text = path.read_text()
    tree = ast.parse(text)
    allowed: set[int] = set()
    for node in ast.walk(tree):
        spans = []
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            spans.append(node)
        elif isinstance(node, ast.FunctionDef) and node.name == "_extensions":
            spans.append(node)
        elif isinstance(node, ast.FunctionDef) and node.name == "__init__":
            spans.extend(node.args.args + node.args.kwonlyargs)
            spans.extend(n for n in ast.walk(node) if isinstance(n, ast.Assign) and "_extensions(" in ast.unparse(n))
        for span in spans:
            allowed.update(range(span.lineno, span.end_lineno + 1))
    named = [
        f"{number}: {line.strip()}"
        for number, line in enumerate(text.splitlines(), 1)
        if number not in allowed and re.search(r"attack|privacy|newcomer|system", line, re.I)
    ]
    assert not named, named
    assert len(allowed) > 10  # the builder was found


def test_the_plugin_package_holds_the_api_not_the_engine_mechanics():
    """What algorithms import describes what they use; the stores' memory budget and spill files and the processes'
    collectives live in the engine (`fedlight.engine.client_states`, `spill`, `processes`)."""
    mechanics = {"mmap", "tempfile", "shutil", "torch.distributed"}
    for path in (PACKAGE / "plugin").glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
        imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        assert not imported & mechanics, f"fedlight/plugin/{path.name} imports {sorted(imported & mechanics)}"
    assert {"client_states", "spill", "processes"} <= {p.stem for p in (PACKAGE / "engine").glob("*.py")}
    assert not any((PACKAGE / "plugin" / f"{name}.py").exists() for name in ("spill", "collective", "client_states"))
