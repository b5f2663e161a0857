#!/usr/bin/env bash
# Install the `sglang` extra and sglang 0.5.23 into the venv at $1 (created when absent), from this checkout:
#   bash .ci/install-sglang.sh /path/to/venv
# torch stays the CPU build (.ci/sglang-constraints.txt pins it for every step: a requirement that pulled torch
# unpinned would bring a CUDA build and its nvidia wheels, several GB); sglang goes in with --no-deps (its own
# requirements pin torch 2.14.1 and CUDA-only kernels), after what importing its bookkeeping needs. pip's cache is
# used (no --no-cache-dir): a second install on the same machine downloads nothing. Prints the time and the size.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:?usage: .ci/install-sglang.sh VENV}
started=$SECONDS
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -c .ci/sglang-constraints.txt -e '.[sglang]' pytest hypothesis
"$venv/bin/python" -m pip install -q -c .ci/sglang-constraints.txt --no-deps sglang==0.5.23
"$venv/bin/python" -c "import torch; assert torch.__version__.endswith('+cpu'), torch.__version__"
echo "sglang extra installed in $((SECONDS - started)) s, $(du -sm "$venv" | cut -f1) MB"
