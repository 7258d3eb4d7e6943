#!/usr/bin/env bash
# Every speed benchmark, writing a markdown table and JSON per benchmark into OUTDIR.
#   bash benchmarks/run_all.sh cpu  results/cpu     # the 2-core CPU settings of docs/results.md
#   bash benchmarks/run_all.sh cuda results/gpu     # the GPU settings (100-1000 clients, AMP on and off)
set -euo pipefail
device=${1:?usage: run_all.sh cpu|cuda OUTDIR}
out=${2:?usage: run_all.sh cpu|cuda OUTDIR}
mkdir -p "$out"
cd "$(dirname "$0")"
python=${PYTHON:-python}
run() { name=$1; shift; echo "== $name" >&2; "$python" "$@" --json "$out/$name.json" | tee "$out/$name.md"; }
if [ "$device" = cuda ]; then
  run overhead overhead.py --accelerator cuda --precision bf16-mixed
  run vectorized_amp vectorized.py --clients 100 --accelerator cuda --precision bf16-mixed
  run vectorized_fp32 vectorized.py --clients 100 --accelerator cuda --precision 32-true
  run similarity similarity.py --accelerator cuda --max_gb 30
  run round round.py --accelerator cuda --networks lenet5 resnet18 --precisions 32-true bf16-mixed \
      --algorithms fedavg fedper fedavg_whole_round
  gpus=$("$python" -c "import torch; print(torch.cuda.device_count())")
  if [ "$gpus" -gt 1 ]; then run processes processes.py --accelerator cuda --devices 1 "$gpus"; fi
else
  run overhead overhead.py --rounds 7
  run vectorized vectorized.py --clients 20 --repeats 3
  run similarity similarity.py
  run round round.py
  run round_memory round.py --precisions 32-true --algorithms fedavg fedper fedavg_whole_round --vectorize 64
  run processes processes.py
fi
run startup startup.py --repeats 5
