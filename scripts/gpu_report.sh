#!/usr/bin/env bash
# Every GPU figure, on a machine with a CUDA GPU and nothing else prepared: sets up .venv (scripts/bootstrap.sh,
# which keeps the machine's CUDA torch), then runs the parts of scripts/gpu_report.py into OUTDIR.
# Usage: scripts/gpu_report.sh OUTDIR [PART ...]    (no PART: all of them; --list names them)
# Offline machines: PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR installs from a folder of wheels (see the README).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python scripts/gpu_report.py "$@"
