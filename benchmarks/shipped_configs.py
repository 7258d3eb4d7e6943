"""The shipped configs end to end, three ways: `federation.vectorize` -1 (auto), 0 (sequential) and the clients'
count (vectorized: one group of up to 256), each a fresh `python -m fedlight fit` process (set-up, probe, training,
evaluation), the three taking turns per config. Reported per config: seconds per round (the rounds' own times in
metrics.csv, the probe, training and evaluation included; the process's start-up and set-up are reported apart as its
wall time), auto's choice and reason (summary.json's plan), and each way's peak resident memory.

    python benchmarks/shipped_configs.py [--configs configs/digits] [--rounds 5] [--repeats 1] [--json out.json]

Auto's choice is remembered per machine (`FEDLIGHT_CACHE_DIR`); every run here gets an empty cache of its own, so
auto probes every time, as on a new machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
#: vectorize settings: auto, one client at a time, and every client in one group (a CPU group holds up to 256)
MODES = {"auto": "-1", "sequential": "0", "vectorized": "256"}


def configs_under(folders: list[Path]) -> list[Path]:
    """Run configs (files naming data and model) among `folders` (or files), not the shared pieces they include."""
    found = []
    for folder in folders:
        for path in [folder] if folder.is_file() else sorted(folder.rglob("*.yaml")):
            document = yaml.safe_load(path.read_text())
            if isinstance(document, dict) and {"data", "model"} <= set(document):
                found.append(path)
    return found


def run(
    config: Path,
    vectorize: str,
    rounds: int,
    folder: Path,
    extra: tuple[str, ...] = (),
    launcher: tuple[str, ...] = ("-m", "fedlight"),
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    max_mb: float | None = None,
    repeat: int = 0,
    name: str | None = None,
    checkout: Path = ROOT,
    python: str = sys.executable,
) -> dict:
    """One fresh process: seconds per round (its rounds' times), its wall time, peak resident memory, summary.
    `extra` options follow the command's own; `launcher` is what follows `python` (`-m fedlight`); a run past
    `timeout` seconds or `max_mb` of resident memory is stopped, and its wall time and peak memory until then
    are reported with the error; `repeat` numbers a repetition (its own run folder and empty probe cache); `name`
    names the run folder (default: the config's path and `vectorize`); `checkout` and `python` run another copy of
    fedlight (an older commit's, to compare) with its own interpreter. (Linux
    counts in a child's peak the pages of this process it starts with, so the caller keeps its own peak below the
    runs'.)"""
    name = name or f"{config.relative_to(ROOT).with_suffix('').as_posix().replace('/', '_')}-{vectorize}"
    name += f"-r{repeat}" if repeat else ""
    env = {**os.environ, "WANDB_MODE": "offline", "FEDLIGHT_CACHE_DIR": str(folder / f"cache-{name}"), **(env or {})}
    command = [
        python,
        *launcher,
        "fit",
        "--config",
        str(config),
        "--federation.rounds",
        str(rounds),
        "--federation.vectorize",
        vectorize,
        "--logger.wandb",
        "false",
        "--output_dir",
        str(folder),
        "--run_name",
        name,
        *extra,
    ]
    errors = folder / f"{name}.err"
    started = time.perf_counter()
    with errors.open("w") as err:
        process = subprocess.Popen(command, cwd=checkout, env=env, stdout=subprocess.DEVNULL, stderr=err)
        status, usage = wait_for(process, timeout, max_mb)  # this child's own peak memory, not every child's
    wall = time.perf_counter() - started
    measured = {"wall_s": wall, "peak_mb": usage.ru_maxrss / 1024}
    if status is None:
        past = f"{timeout:.0f} s" if timeout is not None and wall >= timeout else f"{max_mb:.0f} MB"
        return {"error": f"stopped past {past}", **measured}
    code = os.waitstatus_to_exitcode(status)
    if code:
        lines = errors.read_text().strip().splitlines()
        return {
            "error": lines[-1] if lines else f"killed by signal {-code}" if code < 0 else f"exit {code}",
            **measured,
        }
    summary = json.loads((folder / name / "summary.json").read_text())
    with (folder / name / "metrics.csv").open() as f:
        rounds_s = [float(r["time/round_s"]) for r in csv.DictReader(f)]
    return {"s_per_round": sum(rounds_s) / rounds, "rounds_s": rounds_s, **measured, "summary": summary}


def wait_for(
    process: subprocess.Popen, timeout: float | None = None, max_mb: float | None = None
) -> tuple[int | None, os.struct_rusage]:
    """(wait status, or None when the process was stopped: past `timeout` seconds, or its resident memory past
    `max_mb` (read every 0.2 s, so the peak may pass it by what 0.2 s allocates); its resource usage)."""
    if timeout is None and max_mb is None:
        return os.wait4(process.pid, 0)[1:]
    deadline = math.inf if timeout is None else time.monotonic() + timeout
    while time.monotonic() < deadline and (max_mb is None or resident_mb(process.pid) <= max_mb):
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            return status, usage
        time.sleep(0.2)
    process.kill()
    return None, os.wait4(process.pid, 0)[2]


def resident_mb(pid: int) -> float:
    """A running process's resident memory now (Linux's /proc; 0 where it cannot be read)."""
    try:
        line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0.0
    return int(line.split()[1]) / 1024


def fastest(runs: list[dict]) -> dict:
    """The run with the fewest seconds per round (the least disturbed by the machine), or the first failed one."""
    done = [r for r in runs if "s_per_round" in r]
    return min(done, key=lambda r: r["s_per_round"]) if done else runs[0]


def table_row(row: dict) -> str:
    def seconds(mode: str) -> str:
        return f"{row[mode]['s_per_round']:.2f}" if "s_per_round" in row[mode] else row[mode]["error"][:60]

    plan = row["auto"].get("summary", {}).get("plan", {})
    reason = plan.get("reason") or ""
    others = [c for c in row.get("auto_choices", []) if c != plan.get("trainer")]
    reason += f"{'; ' if reason else ''}other repetitions chose {', '.join(others)}" if others else ""
    times = [row[m]["s_per_round"] for m in ("sequential", "vectorized") if "s_per_round" in row[m]]
    versus = f"{row['auto']['s_per_round'] / min(times):.2f}x" if times and "s_per_round" in row["auto"] else "-"
    peaks = "/".join(f"{row[m]['peak_mb']:.0f}" if "peak_mb" in row[m] else "-" for m in MODES)
    walls = "/".join(f"{row[m]['wall_s']:.1f}" if "wall_s" in row[m] else "-" for m in MODES)
    return (
        f"| {row['config']} | {seconds('auto')} | {seconds('sequential')} | {seconds('vectorized')} | "
        f"{plan.get('trainer', '?')}{f' ({reason})' if reason else ''} | {versus} | {walls} | {peaks} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", nargs="+", type=Path, default=[ROOT / "configs" / "digits"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run the three ways this many times in turn per config and keep each way's fastest run",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    print(
        "| config | auto s/round | sequential s/round | vectorized s/round | auto's choice (reason) | "
        "auto vs faster | process wall s (auto/seq/vec) | peak RSS MB (auto/seq/vec) |\n"
        "|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        for config in configs_under([c.resolve() for c in args.configs]):
            runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
            for repeat in range(args.repeats):
                for mode, vectorize in MODES.items():  # the three take turns on each config
                    runs[mode].append(run(config, vectorize, args.rounds, Path(tmp), repeat=repeat))
            row: dict = {
                "config": str(config.relative_to(ROOT)),
                **{mode: fastest(r) for mode, r in runs.items()},
                "auto_choices": [r.get("summary", {}).get("plan", {}).get("trainer") for r in runs["auto"]],
            }
            rows.append(row)
            print(table_row(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
