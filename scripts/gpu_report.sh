#!/usr/bin/env bash
# GPU figures on a machine with a CUDA GPU.
#   scripts/gpu_report.sh OUTDIR first-look [--device D] [--quick] [--budget S]
#       the decisive figures in at most 8 minutes (scripts/first_look.py), on a lent machine with nothing prepared but
#       the wheels scripts/carry.sh put in .whl/: those that suit this Python are installed into a folder of their
#       own (no index, no venv), and the machine's python3 runs the checkout as it is.
#       Writes OUTDIR/first-look.{md,json,log}.
#   scripts/gpu_report.sh OUTDIR [PART ...]
#       every GPU figure, in parts (scripts/gpu_report.py; no PART: all, about 3 hours): sets up .venv first
#       (scripts/bootstrap.sh, which keeps the machine's CUDA torch). --list names the parts.
# Offline machines: PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR installs .venv from a folder of wheels (docs/gpu-report.md).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${2:-}" = "first-look" ]; then
    out=$1
    shift 2
    PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
    if compgen -G ".whl/*.whl" >/dev/null; then
        site=${VLMSPEC_CARRIED_SITE:-/tmp/vlmspec-carried}
        for wheel in .whl/*.whl; do
            "$PY" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
                "$wheel" || echo "gpu_report: $wheel does not install here; going on without it" >&2
        done
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    exec "$PY" scripts/first_look.py "$out" "$@"
fi
bash scripts/bootstrap.sh
exec .venv/bin/python scripts/gpu_report.py "$@"
