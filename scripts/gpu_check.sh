#!/usr/bin/env bash
# Exercise the GPU paths end to end in a few minutes on a machine with NVIDIA GPUs:
# NCCL process groups, CUDA devices per rank, the gpu marker. On a machine without a GPU every
# test here is skipped with its reason (never a fake pass); this script then exits non-zero so
# nobody mistakes a skip for a GPU check.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=index,name,memory.total --format=csv || { echo "no NVIDIA GPU visible" >&2; exit 3; }
python3 -m venv .venv-gpu
# No CPU constraints here: take the torch this machine provides (a CUDA build).
.venv-gpu/bin/pip install -q -e '.[test,gpu]'
.venv-gpu/bin/python -c "import torch; assert torch.cuda.is_available(), 'torch has no CUDA here'; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'devices', torch.cuda.device_count())"
timeout 900 .venv-gpu/bin/pytest tests/test_gpu.py -v -rs --reshard-backend=nccl -p no:cacheprovider
