#!/usr/bin/env bash
# Install the `serving` extra (the vllm and sglang extras together), then vllm 0.33.0 and sglang 0.5.23 with
# --no-deps, into one venv at $1 (created when absent), from this checkout:
#   bash .ci/install-serving.sh /path/to/venv
# Every step is constrained by .ci/serving-constraints.txt, which pins the CPU torch: a requirement that pulled torch
# unpinned would bring a CUDA build and its nvidia wheels. Both engines go in with --no-deps: their own requirements
# pin torch 2.14.x and their serving stacks; importing their KV bookkeeping needs only the extra. pip's cache is used
# (no --no-cache-dir): a second install on the same machine downloads nothing. Prints the time and the size.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:?usage: bash .ci/install-serving.sh VENV}
started=$SECONDS
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -c .ci/serving-constraints.txt -e '.[serving]' pytest hypothesis
"$venv/bin/python" -m pip install -q -c .ci/serving-constraints.txt --no-deps vllm==0.33.0 sglang==0.5.23
# The pin held: a CUDA torch here would mean several GB and another library than the one judged.
"$venv/bin/python" -c "import torch, sys; sys.exit(0 if torch.__version__ == '2.13.0+cpu' else f'torch {torch.__version__}, not 2.13.0+cpu')"
echo "serving extra installed in $((SECONDS - started)) s, $(du -sm "$venv" | cut -f1) MB"
