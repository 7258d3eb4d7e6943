"""A regular (non-editable) install gives fedlight, fedlight.algorithms, fedlight.models and
fedlight.datamodules, and no top-level `models`, `algorithms` or `datamodules` package."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_install_maps_the_top_level_folders_under_fedlight(tmp_path):
    source = tmp_path / "source"  # pip builds in the source tree: build a copy, not the checkout
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(".venv*", ".git", "build", "runs", "*.egg-info", "__pycache__", "wandb"),
    )
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-compile",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    assert (target / "fedlight" / "algorithms" / "fedavg.py").is_file()
    assert (target / "fedlight" / "cluster" / "kcenters.py").is_file()
    assert (target / "fedlight" / "models" / "classifier.py").is_file()
    assert (target / "fedlight" / "datamodules" / "digits.py").is_file()
    assert not any((target / name).exists() for name in ("models", "algorithms", "datamodules"))
    entry_points = next(target.glob("fedlight-*.dist-info")) / "entry_points.txt"
    assert "fedavg = fedlight.algorithms.fedavg:FedAvg" in entry_points.read_text()
    probe = (
        "import fedlight.cluster, fedlight.algorithms.fedavg as a, fedlight.models as m, "
        "fedlight.datamodules as d; print(a.__file__, m.__file__, d.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    ).stdout
    assert out.count(str(target)) == 3


def distribution_closure(name: str, extras: tuple[str, ...] = ()) -> set[str]:
    """Normalized names of `name` and everything it needs (with `extras`), from the installed metadata."""
    from importlib.metadata import distribution

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: set[str] = set()
    todo = [(name, extras)]
    while todo:
        current, wanted = todo.pop()
        key = canonicalize_name(current)
        if key in seen and not wanted:
            continue
        seen.add(key)
        for text in distribution(current).requires or []:
            requirement = Requirement(text)
            environments = [{"extra": e} for e in wanted] or [{"extra": ""}]
            if requirement.marker is None or any(requirement.marker.evaluate(env) for env in environments):
                todo.append((requirement.name, tuple(requirement.extras)))
    return seen


def test_constraints_pin_exactly_what_fedlight_and_its_tests_install():
    from packaging.utils import canonicalize_name

    lines = [line.strip() for line in (ROOT / "constraints.txt").read_text().splitlines()]
    pins = [line for line in lines if line and not line.startswith("#")]
    assert all("==" in pin for pin in pins), "every line is an exact pin"
    assert not any("editable" in line.lower() for line in lines)
    pinned = {canonicalize_name(pin.split("==")[0]) for pin in pins}
    needed = distribution_closure("fedlight", ("test",)) - {"fedlight"}
    assert pinned - needed == set(), "pins of packages fedlight does not need"
    assert needed - pinned == set(), "packages fedlight needs without a tested pin"
