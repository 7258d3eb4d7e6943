"""A regular (non-editable) install gives fedlight, fedlight.algorithms, fedlight.models and
fedlight.datamodules, and no top-level `models`, `algorithms` or `datamodules` package."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_install_maps_the_top_level_folders_under_fedlight(tmp_path):
    source = tmp_path / "source"  # pip builds in the source tree: build a copy, not the checkout
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv*", ".git", "build", "runs", "*.egg-info",
                                                                "__pycache__", "wandb"))
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-compile", "--target", str(target), str(source)], check=True, capture_output=True)
    assert (target / "fedlight" / "algorithms" / "fedavg.py").is_file()
    assert (target / "fedlight" / "models" / "classifier.py").is_file()
    assert (target / "fedlight" / "datamodules" / "digits.py").is_file()
    assert not any((target / name).exists() for name in ("models", "algorithms", "datamodules"))
    entry_points = next(target.glob("fedlight-*.dist-info")) / "entry_points.txt"
    assert "fedavg = fedlight.algorithms.fedavg:FedAvg" in entry_points.read_text()
    probe = ("import fedlight.algorithms.fedavg as a, fedlight.models as m, fedlight.datamodules as d; "
             "print(a.__file__, m.__file__, d.__file__)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, check=True, capture_output=True, text=True,
                         env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}).stdout
    assert out.count(str(target)) == 3
