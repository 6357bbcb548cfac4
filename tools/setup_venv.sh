#!/usr/bin/env bash
# Create (or reuse) the project venv and install kdtree with the requested extras.
#
# torch: a CPU machine gets torch==2.13.0 (a CPU wheel on local disk here; an unpinned torch would
# pull a multi-GB CUDA build). A GPU machine keeps the user's CUDA torch: when the base python
# already has a CUDA-enabled torch, the venv is created with --system-site-packages and pip sees
# the requirement as satisfied.
set -euo pipefail
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
EXTRAS=${1:-dev}

if [ ! -x "$VENV/bin/python" ]; then
  if "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "[setup] base python has a CUDA torch: venv with --system-site-packages keeps it"
    "$PY" -m venv --system-site-packages "$VENV"
  else
    "$PY" -m venv "$VENV"
  fi
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
if ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
  echo "[setup] installing torch==2.13.0 (CPU build)"
  "$VENV/bin/python" -m pip install -q torch==2.13.0
fi
echo "[setup] installing kdtree[$EXTRAS]"
"$VENV/bin/python" -m pip install -q -e ".[$EXTRAS]"
# The notebooks run on the 'python3' kernelspec; register the venv's kernel under that name.
"$VENV/bin/python" -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (kdtree)" >/dev/null
echo "[setup] ok: $("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)')"
