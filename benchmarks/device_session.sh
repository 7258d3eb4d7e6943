#!/usr/bin/env bash
# A leased GPU machine's checks in one go, within BUDGET seconds: the GPU tests, FLUTE's FEMNIST run, then the GPU
# benchmarks of run_all.sh (AMP on and off), those no lease has finished first, then the quickstart end to end. Each step
# gets what is left of the budget at most, so a short lease still brings back the first results.
#   bash benchmarks/device_session.sh OUTDIR [BUDGET_SECONDS]
# fedlight must be installed there (`pip install --no-deps --no-build-isolation -e .`, with jsonargparse,
# docstring_parser and typeshed_client carried as wheels: the device README says how).
set -uo pipefail
out=${1:?usage: device_session.sh OUTDIR [BUDGET_SECONDS]}
budget=${2:-500}
python=${PYTHON:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
start=$SECONDS

step() {  # step NAME LIMIT COMMAND...: run COMMAND for at most LIMIT seconds (less if the budget is nearly spent)
  local name=$1 limit=$2 left
  shift 2
  left=$((budget - (SECONDS - start)))
  if [ "$left" -lt 15 ]; then echo "== $name: skipped, $left s of the budget left"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (at most $limit s)"
  timeout "$limit" "$@"
  echo "== $name: exit $? at $((SECONDS - start)) s"
}
bench() {  # bench NAME LIMIT SCRIPT ARGS...: a benchmark writing OUTDIR/NAME.md and NAME.json (with its progress
  # lines from stderr, so a step stopped at its limit still brings back the rows it finished)
  local name=$1 limit=$2
  shift 2
  step "$name" "$limit" bash -o pipefail -c "cd '$root/benchmarks' && '$python' $* --json '$out/$name.json' 2>&1 | tee '$out/$name.md'"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/device.txt"
"$python" -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__)" \
  | tee -a "$out/device.txt"
step gpu_tests 120 "$python" -m pytest -q -p no:cacheprovider "$root/tests/integration/test_gpu.py"
# FLUTE's FEMNIST run (1,500 rounds, 10 of 3,400 writers, evaluation every 50) on made data of LEAF's size:
# its wall time goes beside FLUTE's 8 min 22 s. Stopped at its limit, metrics.csv still says how far it got.
step flute_femnist 330 bash -o pipefail -c "cd '$root' && TIMEFORMAT='flute_femnist: %R s wall' && time \
  (PYTHONPATH=benchmarks${PYTHONPATH:+:$PYTHONPATH} WANDB_MODE=offline '$python' -m fedlight fit --config configs/cross_device/femnist/fedavg.yaml \
  --data made_femnist.MadeFemnist --federation.accelerator cuda --federation.precision 32-true --logger.wandb false \
  --output_dir '$out/flute' 2>&1 | grep -v '^round' | tail -15)"
for f in metrics.csv summary.json; do cp "$out"/flute/*/"$f" "$out/flute_$f" 2>/dev/null; done
bench round_resnet18 120 round.py --accelerator cuda --networks resnet18 --clients 100 \
  --precisions 32-true bf16-mixed --algorithms fedavg
bench round_amp 150 round.py --accelerator cuda --networks lenet5 --clients 1000 \
  --precisions 32-true bf16-mixed --algorithms fedavg fedper
bench vectorized_amp 100 vectorized.py --clients 100 --pool 20000 --networks fedavg_cnn lenet5 --batch_sizes 10 64 \
  --accelerator cuda --precision bf16-mixed
bench vectorized_fp32 100 vectorized.py --clients 100 --pool 20000 --networks fedavg_cnn lenet5 --batch_sizes 10 64 \
  --accelerator cuda --precision 32-true
bench overhead 60 overhead.py --accelerator cuda --precision bf16-mixed
for device in cuda cpu; do
  step "quickstart_$device" 60 bash -o pipefail -c "cd '$root' && TIMEFORMAT='quickstart on $device: %R s wall' && \
    time ('$python' -m fedlight fit --config configs/quickstart.yaml --federation.accelerator $device \
    --logger.wandb false --output_dir '$out/quickstart_$device' 2>&1 | tail -12)"
done
bench similarity 60 similarity.py --accelerator cuda --max_gb 30
bench startup 40 startup.py --repeats 2
# LoRA clients on the GPU (bf16-mixed): needs transformers, peft and timm there (carried as wheels, the device README)
bench lora_clients 240 lora_clients.py --device cuda --repeats 1
echo "== done at $((SECONDS - start)) s"
