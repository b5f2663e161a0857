#!/usr/bin/env bash
# Installs the `vllm` extra into a fresh venv VENV (made here): the project editable with pytest and hypothesis, the
# CPU torch pinned by .ci/vllm-constraints.txt, then vllm 0.33.0 with --no-deps (its own requirements pin torch
# 2.14.0 and its serving stack; importing vllm.v1.core needs only the extra). pip's cache is used (no
# --no-cache-dir): the 336 MB wheel is fetched once per machine. Prints the time and the venv's size.
#     bash .ci/install-vllm.sh /tmp/vllm-venv
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:?usage: bash .ci/install-vllm.sh VENV}
started=$SECONDS
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -c .ci/vllm-constraints.txt -e '.[vllm]' pytest hypothesis
"$venv/bin/python" -m pip install -q -c .ci/vllm-constraints.txt --no-deps vllm==0.33.0
# The pin held: a CUDA torch here would mean several GB and another library than the one judged.
"$venv/bin/python" -c "import torch, sys; sys.exit(0 if torch.__version__ == '2.13.0+cpu' else f'torch {torch.__version__}, not 2.13.0+cpu')"
echo "vllm extra installed in $((SECONDS - started)) s, $(du -sm "$venv" | cut -f1) MB"
