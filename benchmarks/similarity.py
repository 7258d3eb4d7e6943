"""The clustering toolkit at scale: pairwise cosine distances of n flattened client updates of d parameters
(OCFL's Γ, CFL's split rule), and Jensen-Shannon divergences of n clients' outputs on m public samples
(FedTSDP stage 1): time, and the peak memory the computation adds on top of its input.

Updates are structured like real ones (4 cluster directions plus client noise, so cosines spread over
[-1, 1]). Each measurement runs in its own process, so a peak is that measurement's alone. Sizes whose input
does not fit in `--max_gb` are listed as not run, with the memory they need. For bf16 storage, the largest
difference from the fp32 cosines of the same updates is reported.

    python benchmarks/similarity.py                                        # CPU sizes (n up to 1000)
    python benchmarks/similarity.py --accelerator cuda --max_gb 60 --params 62006 11173962
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

from timing import peak_rss_bytes, reset_peak_rss, resident_bytes, sync

from fedlight.cluster.similarity import cosine_distance_matrix, js_divergence_matrix

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def structured_updates(n: int, d: int, dtype: torch.dtype, device: torch.device, seed: int = 0) -> torch.Tensor:
    """(n, d) updates: one of 4 random directions per client plus as much independent noise, built a block
    of rows at a time so no second full-size copy is made."""
    g = torch.Generator(device=device).manual_seed(seed)
    base = torch.randn(4, d, generator=g, device=device)
    U = torch.empty(n, d, dtype=dtype, device=device)
    rows = max(1, (1 << 24) // d)
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        noise = torch.randn(stop - start, d, generator=g, device=device)
        U[start:stop] = (base[torch.arange(start, stop, device=device) % 4] + noise).to(dtype)
    return U


def memory_now(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else resident_bytes()


def peak_memory(device: torch.device) -> int:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else peak_rss_bytes()


def measure(kind: str, n: int, size: int, dtype_name: str, device: torch.device) -> dict:
    """One measurement in this process: build the input, time the matrix (warm-up, then the median of up to
    three runs), and read the peak memory added by the computation."""
    if kind == "cosine":
        data = structured_updates(n, size, DTYPES[dtype_name], device)
        compute = lambda: cosine_distance_matrix(data)  # noqa: E731
    else:
        g = torch.Generator(device=device).manual_seed(0)
        data = torch.softmax(torch.randn(n, size, 10, generator=g, device=device), dim=-1)
        compute = lambda: js_divergence_matrix(data)  # noqa: E731
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        reset_peak_rss()
    baseline = memory_now(device)
    times = []
    repeats = 3 if n * size <= 10**8 else 1
    for _ in range(repeats + 1):
        sync(device)
        started = time.perf_counter()
        result = compute()
        sync(device)
        times.append(time.perf_counter() - started)
    added = peak_memory(device) - baseline
    row = {
        "kind": kind,
        "n": n,
        "size": size,
        "dtype": dtype_name,
        "device": str(device),
        "seconds": sorted(times[1:])[len(times[1:]) // 2] if repeats > 1 else times[-1],
        "input_gb": data.numel() * data.element_size() / 1e9,
        "peak_added_gb": added / 1e9,
    }
    if kind == "cosine" and dtype_name == "bf16":
        reference = cosine_distance_matrix(structured_updates(n, size, torch.float32, device))
        row["max_diff_vs_fp32"] = float((result - reference).abs().max())
    return row


def run_isolated(kind: str, n: int, size: int, dtype: str, accelerator: str) -> dict:
    """`measure` in a fresh process (its peak memory is then this measurement's alone)."""
    out = subprocess.run(
        [sys.executable, __file__, "--one", kind, str(n), str(size), dtype, "--accelerator", accelerator],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 500, 1000])
    parser.add_argument(
        "--params",
        type=int,
        nargs="+",
        default=[62006, 1_000_000, 11_173_962],
        help="d: LeNet-5 (CIFAR), 1M, CIFAR ResNet-18",
    )
    parser.add_argument(
        "--public", type=int, nargs="*", default=[100], help="m public samples for JS (10 classes); none: no JS rows"
    )
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=sorted(DTYPES))
    parser.add_argument("--max_gb", type=float, default=6.0, help="skip inputs larger than this")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--json", default=None)
    parser.add_argument("--one", nargs=4, metavar=("KIND", "N", "SIZE", "DTYPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    device = torch.device(args.accelerator if args.accelerator != "cuda" else "cuda:0")
    if args.one:
        kind, n, size, dtype = args.one
        print(json.dumps(measure(kind, int(n), int(size), dtype, device)))
        return
    rows = []
    jobs = [("cosine", n, d, dt) for d in args.params for n in args.clients for dt in args.dtypes]
    jobs += [("js", n, m, "fp32") for m in args.public for n in args.clients]
    for kind, n, size, dtype in jobs:
        element = 2 if dtype == "bf16" else 4
        input_gb = n * size * (10 if kind == "js" else 1) * element / 1e9
        if input_gb > args.max_gb:
            rows.append(
                {
                    "kind": kind,
                    "n": n,
                    "size": size,
                    "dtype": dtype,
                    "device": str(device),
                    "input_gb": input_gb,
                    "skipped": f"input needs {input_gb:.1f} GB > --max_gb {args.max_gb}",
                }
            )
        else:
            rows.append(run_isolated(kind, n, size, dtype, args.accelerator))
        print(json.dumps(rows[-1]), file=sys.stderr)
    print(
        "| matrix | clients n | d (params) or m (samples) | storage | input GB | seconds | peak added GB "
        "| max |cos - fp32| |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        timing = f"{r['seconds']:.3f} | {r['peak_added_gb']:.3f}" if "seconds" in r else f"not run: {r['skipped']} |"
        diff = f"{r['max_diff_vs_fp32']:.1e}" if "max_diff_vs_fp32" in r else ""
        print(f"| {r['kind']} | {r['n']} | {r['size']} | {r['dtype']} | {r['input_gb']:.2f} | {timing} | {diff} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
