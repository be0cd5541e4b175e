#!/usr/bin/env bash
# The GPU benchmark end to end on a bare CUDA machine with this project copied in: Python 3.11+,
# torch and transformers are all it needs (no Ray, no database, no network, no install step).
#
#   bash benchmarks/gpu_run.sh                 # report in $OUT when set, else bench-results/gpu-<UTC time>
#   PYTHON=/opt/py/bin/python bash benchmarks/gpu_run.sh --set gpu.seconds=2
#
# Extra arguments go to `python -m benchmarks.cli bench --device cuda` (mnemo bench's flags: --set
# gpu.FIELD=VALUE, see benchmarks/plan.py). A hard timeout keeps the whole run under 8 minutes; a
# normal run takes about 3 on an H100-class GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
OUT_DIR="${OUT:-bench-results/gpu-$(date -u +%Y%m%dT%H%M%SZ)}"
LIMIT_S="${GPU_BENCH_TIMEOUT_S:-470}"
mkdir -p "$OUT_DIR"

"$PY" - <<'PYCHECK'
import sys
import torch, transformers
print(f"python {sys.version.split()[0]} torch {torch.__version__} transformers {transformers.__version__}")
if not torch.cuda.is_available():
    sys.exit("gpu_run.sh: torch sees no CUDA device; run `python -m benchmarks.cli bench --suite gpu` instead (a CPU smoke run)")
print("device:", torch.cuda.get_device_name(0))
PYCHECK

export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
WORK_DIR="$(mktemp -d "${TMPDIR:-/tmp}/mnemo-gpu-bench.XXXXXX")"
trap 'rm -rf "$WORK_DIR"' EXIT
timeout --signal=TERM "$LIMIT_S" "$PY" -m benchmarks.cli bench --device cuda --work-dir "$WORK_DIR" \
    --out "$OUT_DIR" "$@" 2>&1 | tee "$OUT_DIR/run.log"
echo "report: $OUT_DIR/REPORT.md"
