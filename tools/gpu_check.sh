#!/usr/bin/env bash
# The GPU check (docs/gpu.md): install, then `pytest -m cuda` and the CUDA benchmarks, results in OUT_DIR.
#   tools/gpu_check.sh OUT_DIR             on a machine with CUDA, under 25 minutes
#   tools/gpu_check.sh OUT_DIR --dry-run   print the steps, run nothing (no install either)
# SKIP_INSTALL=1 uses the .venv as it is (a machine without network access, a venv made elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
    echo "usage: tools/gpu_check.sh OUT_DIR [--dry-run]" >&2
    exit 2
fi
if [ "${2:-}" != "--dry-run" ] && [ "${SKIP_INSTALL:-0}" != "1" ]; then
    timeout 600 make install
fi
exec timeout 1500 .venv/bin/python tools/gpu_check.py "$@"
