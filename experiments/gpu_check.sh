#!/bin/bash
# The GPU checks of the profiler and executor, run once on a lent NVIDIA GPU (the device
# tool's H200; see experiments/NOTES.md for what it printed). From the repository root:
#   OUT=/tmp/gpu bash experiments/gpu_check.sh
# It needs torch with CUDA, torchvision and transformers (there: preinstalled) and simpy
# (carried as a wheel in .whl/). One GPU: NCCL needs two ranks on two devices, so no
# collective profile is taken. Writes $OUT/gpu_profile.tgz (the profile DB folder
# h200-sxm-141gb/), the comparisons as JSON, and a log.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
DB=$OUT/profiles
T="python3 -m trainsim"
step() { echo; echo "== $* ($(date +%T))"; }

step "device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, torchvision; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0), 'torchvision', torchvision.__version__)"

step "transformer layer shapes (CUDA events)"
timeout 150 $T profile compute --device cuda --model llama3-8b --tp 1,2,4,8 \
    --micro-batch 1,2 --seq-len 2048,4096 --db "$DB"

step "resnet50 layer by layer, fp32 and bf16"
timeout 100 $T profile compute --device cuda --model torchvision:resnet50 --batch 32,64 \
    --db "$DB" --busy 0
timeout 100 $T profile compute --device cuda --model torchvision:resnet50 --batch 32,64 \
    --db "$DB" --busy 0 --dtype bf16

step "bert-base layer by layer, bf16"
timeout 100 $T profile compute --device cuda --seq-len 128 --batch 16,32 --busy 0 \
    --model hf-encoder:profiler/graph/configs/bert-base-uncased.json --db "$DB" --dtype bf16

printf 'nodes = 1\ngpus_per_node = 1\ngpu = "h200-sxm-141gb"\n' > /tmp/h200x1.toml
printf '{"global_batch_size": 8, "seq_len": 256, "dp": 1, "dtype": "bf16"}\n' > /tmp/p_tiny.json
printf '{"global_batch_size": 128, "seq_len": 1, "micro_batch_size": 64, "dp": 1, "dtype": "bf16"}\n' \
    > /tmp/p_r50.json
W=$(ls "$DB"/*/workloads/resnet50.json | head -1)

step "executor on one GPU: a transformer"
timeout 120 $T execute --device cuda --model tiny --plan /tmp/p_tiny.json --steps 5 --warmup 2

step "executor on one GPU: resnet50 against its layer profile"
timeout 120 $T compare --device cuda --model "$W" --plan /tmp/p_r50.json \
    --cluster /tmp/h200x1.toml --steps 5 --warmup 2 --json > "$OUT/compare_resnet50.json"
python3 -c "import json; c=json.load(open('$OUT/compare_resnet50.json')); print('resnet50 bf16 mb64 x2: predicted', round(c['predicted_s'],4), 'measured', round(c['measured_s'],4), 'error %+.1f%%' % (100*c['error']))"

step "tests that need CUDA"
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_profiler.py -k cuda

step "pack"
tar czf "$OUT/gpu_profile.tgz" -C "$DB" .
ls -la "$OUT"
