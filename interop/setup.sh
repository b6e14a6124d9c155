#!/usr/bin/env bash
# Creates the interop venv: qckpt from this repository plus the real consumers at pinned versions.
#
#   bash interop/setup.sh [--with-llama] [VENV]
#
# VENV defaults to $QCKPT_INTEROP_VENV, else interop/.venv. --with-llama also installs
# llama-cpp-python (a source build of about 20 minutes on 2 cores; pip's wheel cache makes later
# installs fast). Re-running on an existing venv only installs what is missing.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
WITH_LLAMA=0
VENV=""
for arg in "$@"; do
  case "$arg" in
    --with-llama) WITH_LLAMA=1 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) VENV="$arg" ;;
  esac
done
VENV="${VENV:-${QCKPT_INTEROP_VENV:-$HERE/.venv}}"
PY="${PYTHON:-python3}"

start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off -q)

# torch: pinned to the exact release (a CPU build where one is available locally; never an unpinned
# `torch`, which would pull a multi-GB CUDA build).
"${PIP[@]}" "torch==2.13.0"

# qckpt itself (editable, so the suite always tests this checkout) and the consumers.
"${PIP[@]}" -e "$REPO"
"${PIP[@]}" \
  "transformers==5.24.*" \
  "compressed-tensors==0.20.1" \
  "accelerate" \
  "mlx[cpu]==0.32.4" \
  "mlx-lm==0.32.2" \
  "gguf==0.19.0" \
  "tokenizers" \
  "sentencepiece" \
  "protobuf"

# GPTQModel: --no-deps (its declared deps want torch>=2.14.1, datasets, pyarrow, torchao, ... which
# loading a GPTQ/AWQ checkpoint on CPU does not use). The second line is what `import gptqmodel`
# and transformers' GPTQ/AWQ loading path import on CPU (found by importing until nothing was
# missing): transformers 5.24 also insists on optimum for GPTQ (quantizer_gptq.py).
"${PIP[@]}" --no-deps "gptqmodel==7.7.0"
"${PIP[@]}" --no-deps pypcre logbar threadpoolctl device-smi tokenicer defuser pillow "optimum==2.3.0"

if [ "$WITH_LLAMA" = 1 ]; then
  # Source build of llama.cpp's Python binding (CPU). --no-deps: its deps (numpy, jinja2,
  # typing-extensions, diskcache) are present except diskcache.
  "${PIP[@]}" diskcache
  "${PIP[@]}" --no-deps "llama-cpp-python==0.3.36"
fi

"$VENV/bin/python" - <<'EOF'
import importlib, importlib.metadata as m
for mod in ["torch", "transformers", "compressed_tensors", "gptqmodel", "mlx.core", "mlx_lm", "gguf",
            "tokenizers", "converter"]:
    importlib.import_module(mod)
try:
    import llama_cpp  # noqa: F401
    llama = m.version("llama-cpp-python")
except ImportError:
    llama = "not installed"
print("interop venv ready:", ", ".join(f"{n} {m.version(n)}" for n in
      ["torch", "transformers", "compressed-tensors", "gptqmodel", "mlx", "mlx-lm", "gguf"]),
      f", llama-cpp-python {llama}")
EOF
echo "setup took $(( $(date +%s) - start )) s; venv: $VENV"
