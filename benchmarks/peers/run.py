"""Peers side by side: the same workloads (workloads.py) run by a plain PyTorch loop, by fedlight and by Flower's
simulation engine, each in a fresh process, taking turns (interleaved) over --repeats passes. The table gives each
peer's median seconds a round (rounds 2 to --rounds of every pass: round 1 pays start-up), its ratio to the plain
loop's, and the peak resident memory of its process tree (Flower's includes Ray's processes), sampled every 0.1 s.

    pip install -e ".[peers]"                    # Flower's simulation engine (flwr[simulation]) beside fedlight
    python benchmarks/peers/run.py [--workloads fedavg fedper many_small] [--rounds 6] [--repeats 3]
        [--peers plain fedlight flower] [--json out.json]

A peer that cannot run (Flower not installed) is reported with its error's last line, and the others still run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = {"plain": "plain.py", "fedlight": "fedlight_run.py", "flower": "flower.py"}


def tree_rss(pid: int) -> int:
    """Resident bytes of process `pid` and all its descendants now (Linux /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
            rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        total += rss.get(current, 0)
        stack.extend(children.get(current, []))
    return total


def run_peer(peer: str, workload: str, rounds: int) -> dict:
    """One peer's run in a fresh process: its rounds' seconds and the peak memory of its process tree."""
    command = [sys.executable, str(HERE / SCRIPTS[peer]), "--workload", workload, "--rounds", str(rounds)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=HERE)
    peak = [0]

    def sample() -> None:
        while process.poll() is None:
            peak[0] = max(peak[0], tree_rss(process.pid))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = process.communicate()
    sampler.join()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if process.returncode != 0 or not lines:
        return {"error": (err.strip().splitlines() or ["no output"])[-1]}
    return {**json.loads(lines[-1]), "peak_bytes": peak[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["fedavg", "fedper", "many_small"])
    parser.add_argument("--peers", nargs="+", default=list(SCRIPTS), choices=list(SCRIPTS))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results: dict[str, dict[str, list[dict]]] = {w: {p: [] for p in args.peers} for w in args.workloads}
    for _ in range(args.repeats):
        for workload in args.workloads:
            for peer in args.peers:
                results[workload][peer].append(run_peer(peer, workload, args.rounds))
    print("| workload | peer | s/round | x plain loop | peak memory GB |")
    print("|---|---|---|---|---|")
    for workload, peers in results.items():
        medians = {}
        for peer, passes in peers.items():
            good = [p for p in passes if "error" not in p]
            if not good:
                print(f"| {workload} | {peer} | failed: {passes[0]['error']} | | |")
                continue
            medians[peer] = statistics.median(s for p in good for s in p["round_s"][1:])
            ratio = f"{medians[peer] / medians['plain']:.2f}" if "plain" in medians else "–"
            peak = max(p["peak_bytes"] for p in good) / 1e9
            print(f"| {workload} | {peer} | {medians[peer]:.3f} | {ratio} | {peak:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
