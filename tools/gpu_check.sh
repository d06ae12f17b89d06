#!/usr/bin/env bash
# The GPU check (docs/gpu.md): install, then `pytest -m cuda` and the CUDA benchmarks, results in OUT_DIR.
#   tools/gpu_check.sh OUT_DIR               on a machine with CUDA, under 25 minutes
#   tools/gpu_check.sh OUT_DIR --part 1      the most important half, under 6 minutes (then --part 2)
#   tools/gpu_check.sh OUT_DIR --dry-run     print the steps, run nothing (no install either)
# SKIP_INSTALL=1 uses the .venv as it is, or, without one, the python3 on PATH with this checkout on
# PYTHONPATH (a machine without network access whose Python has torch and the app's packages).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
    echo "usage: tools/gpu_check.sh OUT_DIR [--part 1|2] [--dry-run]" >&2
    exit 2
fi
python=.venv/bin/python
if [[ " $* " != *" --dry-run "* ]] && [ "${SKIP_INSTALL:-0}" != "1" ]; then
    timeout 600 make install
elif [ ! -x "$python" ]; then
    python=$(command -v python3)
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
exec timeout 1500 "$python" tools/gpu_check.py "$@"
