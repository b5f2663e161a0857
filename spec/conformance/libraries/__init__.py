"""The judged libraries: one module per library whose KV cache the suite ships an adapter for, each built on the
faces' public helpers (`op.targets.library_target` and `config_for`; the cell-recompute face's target contract)
and driving the cache as that library's own model code does. A target is `python:` this package's module, a colon,
and the factory's name:

- `executorch.py`: ExecuTorch 1.5.1's reference caches, as they are (the `upstream` extra; op face:
  `contiguous`, `cell`);
- `hf.py`: Hugging Face transformers' caches (the `hf` extra; op face: `dynamic_full`, `static_sliding`, ...);
- `mlxlm.py`: mlx-lm's caches (the `mlx` extra; op face: `kv`, `prompt_cache`, ...);
- `llamacpp.py`: llama.cpp through llama-cpp-python (the `llamacpp` extra; cell-recompute face).

Each module checks, when it loads, that the installed library is the version it was written for
(`kvcache_spec._extras.version_line`): on another it does not load, and `kvcache conformance` exits 2 with one
line naming the version found and the one supported, unless KVCACHE_ANY_LIBRARY_VERSION=1 says to try anyway.
The modules these adapters first lived in (`op/hf.py`, `op/mlxlm.py`, `op/upstream.py`) re-export them, so
today's target paths (`python:kvcache_spec.conformance.op.hf:dynamic_full`, ...) load the same factories.
Nothing in the suite imports this package: a library module is reached only by a target's name."""
