#!/usr/bin/env bash
# Exercise the GPU paths end to end in a few minutes on a machine with NVIDIA GPUs:
# NCCL process groups, CUDA devices per rank, the gpu marker. On a machine without a GPU every
# test here is skipped with its reason (never a fake pass); this script then exits non-zero so
# nobody mistakes a skip for a GPU check.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=index,name,memory.total --format=csv || { echo "no NVIDIA GPU visible" >&2; exit 3; }
# RESHARD_GPU_PYTHON: an interpreter that already holds a CUDA torch (an offline runner's image);
# the plugin goes into it without touching the network. Otherwise a fresh venv, and no CPU
# constraints: pip takes the torch this machine's index provides (a CUDA build).
py=${RESHARD_GPU_PYTHON:-}
if [ -n "$py" ]; then
  "$py" -m pip install -q --no-deps --no-build-isolation -e .
else
  python3 -m venv .venv-gpu
  .venv-gpu/bin/pip install -q -e '.[test,gpu]'
  py=.venv-gpu/bin/python
fi
"$py" -c "import torch; assert torch.cuda.is_available(), 'torch has no CUDA here'; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'devices', torch.cuda.device_count())"
# --reshard-backend=nccl where CUDA is missing is a usage error, not a skip; and a GPU test that
# skips here (too few devices, a missing driver piece) fails this check: a GPU job that lost its
# GPU must not go green.
out=$(mktemp)
status=0
timeout "${RESHARD_GPU_TIMEOUT:-900}" "$py" -m pytest tests/scenarios/test_gpu.py -v -rs --reshard-backend=nccl -p no:cacheprovider \
  --junitxml="$out" || status=$?
skipped=$("$py" -c "import sys, xml.etree.ElementTree as ET; r = ET.parse(sys.argv[1]).getroot(); print(sum(int(s.get('skipped', 0)) for s in ([r] if r.tag == 'testsuite' else r.iter('testsuite'))))" "$out")
rm -f "$out"
if [ "$skipped" != 0 ]; then
  echo "gpu_check: $skipped GPU test(s) skipped; every one must run on a GPU runner" >&2
  exit 1
fi
exit "$status"
