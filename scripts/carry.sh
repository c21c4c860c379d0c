#!/usr/bin/env bash
# The wheels a lent GPU machine needs beside its own packages, downloaded into .whl/ (ignored by git), and a check
# that the working tree and the wheels together stay under the 64 MiB such a machine takes.
# That machine runs Python 3.12 on x86-64 with torch, accelerate, tokenizers, safetensors, huggingface-hub, pillow,
# matplotlib, tqdm, pytest and pytest-xdist already installed, but an older transformers: so transformers travels,
# trimmed to the model folders vlmspec's families use (scripts/trim_wheel.py: 13 MiB -> 2.2 MiB), with regex
# (transformers' floor is newer than some images hold). PyAV and decord stay behind (the first look decodes no video
# file). scripts/gpu_report.sh installs what it finds in .whl/ before it runs.
# Usage: scripts/carry.sh      then name .whl in the run's carry list.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(transformers==5.24.0 regex==2026.4.4)
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64)
mkdir -p .whl
for wheel in "${WHEELS[@]}"; do
    name=${wheel%%==*}
    if ! ls .whl/"${name}"-"${wheel##*==}"-*.whl >/dev/null 2>&1; then
        python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            "${PLATFORMS[@]/#/--platform=}" -d .whl "$wheel"
        if [ "$name" = transformers ]; then
            python3 scripts/trim_wheel.py .whl/transformers-"${wheel##*==}"-*.whl
        fi
    fi
done
python3 scripts/carry_size.py --carry .whl
