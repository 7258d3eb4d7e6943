"""docs/guides/clustering_toolkit.md's table names every public class and function of each `fedlight.cluster`
module, and nothing that is not there."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

DOC = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "clustering_toolkit.md").read_text()
MODULES = ("clusterers", "similarity", "differences", "kcenters", "hopkins", "scores")


def documented() -> dict[str, set[str]]:
    """module -> the names its rows of the three-column table give (`name(args)` counts as `name`)."""
    names: dict[str, set[str]] = {}
    for line in DOC.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            module = cells[0].strip("`")
            names.setdefault(module, set()).update(re.findall(r"`(\w+)", cells[1]))
    return names


def test_the_table_names_every_public_class_and_function_of_each_module():
    table = documented()
    assert set(table) == set(MODULES)
    for module in MODULES:
        mod = importlib.import_module(f"fedlight.cluster.{module}")
        public = {
            name
            for name, obj in vars(mod).items()
            if not name.startswith("_")
            and (inspect.isfunction(obj) or inspect.isclass(obj))
            and obj.__module__ == mod.__name__
        }
        assert public <= table[module], (module, public - table[module])
        assert all(hasattr(mod, name) for name in table[module]), (module, table[module])


def test_the_names_the_package_reexports_are_those_the_doc_says():
    import fedlight.cluster

    assert set(fedlight.cluster.__all__) == {
        "Clusterer",
        "HDBSCAN",
        "DBSCAN",
        "Agglomerative",
        "KMeans",
        "MeanShift",
        "AffinityPropagation",
        "make_clusterer",
        "register_clusterer",
    }
