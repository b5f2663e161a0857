"""Run a model's tests with the strict cache: a tiny attention model, exported with `torch.export`, served by
upstream's own `kvcache::update_and_attend` op with the drop-in reference (`kvcache.reference_cache`)
installed in its registry - the whole change is the import of the cache (docs/dropin.md).

    python -m kvcache_spec.examples.strict_op     # needs torch and executorch (the upstream extra)

It shows two things:
- `served_right()`: prefill, chunked prefill and decode through the op equal full recompute (to 1e-4), on the
  contiguous cache (DYNAMIC, STATIC, and a ring of rows with max_write) and the cell cache, with a flat and
  a sliding-window layer and GQA.
- `misuse()`: runner bugs that upstream's own cache serves without a word - the model's output is then
  silently wrong - are refused by the reference, each with its rule id, before anything changes.
"""

from __future__ import annotations

import sys

UPSTREAM_OP = "executorch.extension.llm.cache.update_and_attend"
NEEDS = ("python -m kvcache_spec.examples.strict_op needs torch and executorch (missing: {}): pip install "
         "'kvcache-spec[upstream]' && pip install --no-deps executorch==1.5.1")

if __name__ == "__main__":   # answered before torch is imported: --help, and one line when it is missing
    import argparse
    import importlib.util

    argparse.ArgumentParser(description="The strict reference inside upstream's op: a tiny model through "
                                        "update_and_attend, and runner misuse refused with rule ids.").parse_args()
    gone = [name for name in ("torch", "executorch") if importlib.util.find_spec(name) is None]
    if gone:
        print(NEEDS.format(", ".join(gone)), file=sys.stderr)
        raise SystemExit(2)

from dataclasses import dataclass   # noqa: E402
from typing import Any, Callable, Optional   # noqa: E402

import torch   # noqa: E402
import torch.nn.functional as F   # noqa: E402
from executorch.extension.llm.cache import reference_cache as upstream   # noqa: E402
from executorch.extension.llm.cache.update_and_attend import REGISTRY, update_and_attend   # noqa: E402

from kvcache import KVCacheError   # noqa: E402
from kvcache import reference_cache as strict   # noqa: E402

HIDDEN, N_HEADS, N_KV_HEADS, HEAD_DIM = 32, 4, 2, 8   # GQA: two query heads per K/V head
WINDOWS = (0, 3)   # layer 0 flat, layer 1 a sliding window of 3 positions
KEY = "strict-op-example"


def rotary(x: Any, position: Any) -> Any:
    """Rotary position embedding of x [1, H, T, D] at the positions [T, 1]: a key cached at the wrong position
    is then attended wrongly, as in a real model."""
    half = x.shape[-1] // 2
    angle = position.to(torch.float32) * (10000.0 ** (-torch.arange(half, dtype=torch.float32) / half))
    cos, sin = angle.cos(), angle.sin()
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, first * sin + second * cos], -1)


class TinyAttention(torch.nn.Module):   # type: ignore[misc, unused-ignore]
    """Residual attention blocks (rotary positions, GQA) that call the op; `order` is the layer id of each block
    application (a block applied twice shares its weights and, in a buggy model, its layer id)."""

    def __init__(self, order: tuple[int, ...] = (0, 1), seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.order = order
        width = (N_HEADS + 2 * N_KV_HEADS) * HEAD_DIM
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, width, bias=False) for _ in WINDOWS)
        self.out = torch.nn.ModuleList(torch.nn.Linear(N_HEADS * HEAD_DIM, HIDDEN, bias=False) for _ in WINDOWS)

    def heads(self, layer: int, x: Any, position: Any) -> tuple[Any, Any, Any]:
        """q [1, Hq, T, D], k and v [1, Hkv, T, D] of the tokens x [1, T, hidden] at the positions [T, 1]."""
        t = x.shape[1]
        q, k, v = self.qkv[layer](x).split([N_HEADS * HEAD_DIM, N_KV_HEADS * HEAD_DIM, N_KV_HEADS * HEAD_DIM], -1)
        q = rotary(q.view(1, t, N_HEADS, HEAD_DIM).transpose(1, 2), position)
        k = rotary(k.view(1, t, N_KV_HEADS, HEAD_DIM).transpose(1, 2), position)
        return q, k, v.view(1, t, N_KV_HEADS, HEAD_DIM).transpose(1, 2)

    def forward(self, x: Any, position: Any) -> Any:
        for layer in self.order:
            q, k, v = self.heads(layer, x, position)
            attended = update_and_attend(q, k, v, position, layer, HEAD_DIM ** -0.5, torch.float32)
            x = x + self.out[layer](attended.transpose(1, 2).reshape(1, x.shape[1], -1))
        return x

    def recompute(self, x: Any) -> Any:
        """The model without a cache: every block attends the whole sequence's K/V, causal and windowed."""
        t = x.shape[1]
        offset = torch.arange(t).unsqueeze(0) - torch.arange(t).unsqueeze(1)   # key position - query position
        for layer in self.order:
            q, k, v = self.heads(layer, x, torch.arange(t).unsqueeze(-1))
            mask = offset <= 0
            if WINDOWS[layer]:
                mask &= offset > -WINDOWS[layer]
            group = N_HEADS // N_KV_HEADS
            attended = F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                                      attn_mask=mask, scale=HEAD_DIM ** -0.5)
            x = x + self.out[layer](attended.transpose(1, 2).reshape(1, t, -1))
        return x


class Exported:
    """The model exported once per step length (torch.export, functionalized as ExecuTorch does)."""

    def __init__(self, model: TinyAttention) -> None:
        self.model = model
        self.programs: dict[int, Any] = {}

    def __call__(self, x: Any, position: Any) -> Any:
        t = x.shape[1]
        if t not in self.programs:
            program = torch.export.export(self.model, (x, position), strict=True).run_decompositions({})
            self.programs[t] = program.module()
        return self.programs[t](x, position)


def positions(start: int, count: int) -> Any:
    return torch.arange(start, start + count).unsqueeze(-1)


def config(module: Any, sizing: str = "DYNAMIC", capacity: int = 16, **extra: Any) -> Any:
    """The cache config of the model, in `module`'s types (upstream's or the drop-in's)."""
    layers = [module.LayerPolicy.ring(w) if w else module.LayerPolicy.flat() for w in WINDOWS]
    return module.CacheConfig(n_layers=len(WINDOWS), n_kv_heads=N_KV_HEADS, head_dim=HEAD_DIM, capacity=capacity,
                              sizing=module.CacheSizing[sizing], dtype=torch.float32, layers=layers, **extra)


def run(cache: Any, program: Exported, steps: list[tuple[Any, int]], seq_id: Optional[int] = None) -> list[Any]:
    """Each step (tokens [1, T, hidden], first position) through the op with `cache` active; a cell cache
    (seq_id given) declares the step's owner first. Returns each step's output."""
    REGISTRY.install(KEY, cache)
    try:
        outputs = []
        with REGISTRY.active(KEY):
            for x, start in steps:
                if seq_id is not None:
                    cache.begin_step([seq_id] * x.shape[1])
                outputs.append(program(x, positions(start, x.shape[1])))
        return outputs
    finally:
        REGISTRY.uninstall(KEY)


def schedules(total: int) -> dict[str, list[tuple[int, int]]]:
    """(start, length) of each step: one prefill, a chunked prefill, and a prefill followed by decode."""
    return {"prefill": [(0, total)], "chunked prefill": [(0, 3), (3, 3), (6, total - 6)],
            "decode": [(0, 3)] + [(p, 1) for p in range(3, total)]}


def served_right(total: int = 9) -> dict[str, float]:
    """The largest |op output - full recompute| per cache and schedule, the reference installed in the op."""
    model = TinyAttention()
    program = Exported(model)
    x = torch.randn(1, total, HIDDEN)
    expected = model.recompute(x)
    caches: dict[str, Callable[[], Any]] = {
        "contiguous DYNAMIC": lambda: strict.ContiguousReferenceCache(config(strict)),
        "contiguous STATIC": lambda: strict.ContiguousReferenceCache(config(strict, "STATIC")),
        "contiguous ring rows (max_write 3)": lambda: strict.ContiguousReferenceCache(config(strict, max_write=3)),
        "cell": lambda: strict.CellReferenceCache(config(strict)),
    }
    errors = {}
    with torch.no_grad():
        for name, make in caches.items():
            for schedule, steps in schedules(total).items():
                if "max_write" in name and any(length > 3 for _, length in steps):
                    continue   # a step writes at most max_write tokens there (STEP-T-MAX)
                cell = 0 if name == "cell" else None
                outputs = run(make(), program, [(x[:, s:s + n], s) for s, n in steps], cell)
                errors[f"{name}, {schedule}"] = float((torch.cat(outputs, 1) - expected).abs().max())
    return errors


@dataclass
class Misuse:
    """A runner bug, what upstream's cache does with it, and what the reference does."""

    name: str
    upstream_error: Optional[float]   # |upstream's output - the intended output| (None: the step has no output)
    refused_by: str   # the rule id the reference's refusal names
    message: str


def _contiguous_misuse(name: str, order: tuple[int, ...], steps: list[tuple[int, int]],
                       reset_after: Optional[int] = None) -> Misuse:
    """Serve (start, length) steps of one sequence - the positions a buggy runner passes - on both caches.
    The intended output is full recompute of the tokens the runner meant: consecutive positions from 0, and
    a reset at `reset_after` (the step index where a new prompt starts)."""
    model = TinyAttention(order)
    program = Exported(model)
    x = torch.randn(1, sum(n for _, n in steps), HIDDEN)
    chunks, taken = [], 0
    for start, n in steps:
        chunks.append((x[:, taken:taken + n], start))
        taken += n
    if reset_after is None:
        intended = model.recompute(x)
    else:
        split = sum(n for _, n in steps[:reset_after])
        intended = torch.cat([model.recompute(x[:, :split]), model.recompute(x[:, split:])], 1)
    with torch.no_grad():
        served = torch.cat(run(upstream.ContiguousReferenceCache(config(upstream)), program, chunks), 1)
        try:
            run(strict.ContiguousReferenceCache(config(strict)), program, chunks)
        except KVCacheError as refusal:
            return Misuse(name, float((served - intended).abs().max()), refusal.rule, str(refusal))
    raise AssertionError(f"{name}: the reference served it")


def _cell_misuse(name: str, misuse: Callable[[Any, Exported, TinyAttention], Optional[float]]) -> Misuse:
    """A cell-cache runner bug on both caches; `misuse(cache, program, model)` runs it and returns how far the
    last output is from the intended one (None when the bug's step has no output)."""
    model = TinyAttention()
    program = Exported(model)
    with torch.no_grad():
        torch.manual_seed(1)
        error = misuse(upstream.CellReferenceCache(config(upstream)), program, model)   # served without a word
        torch.manual_seed(1)
        try:
            misuse(strict.CellReferenceCache(config(strict)), program, model)
        except KVCacheError as refusal:
            return Misuse(name, error, refusal.rule, str(refusal))
    raise AssertionError(f"{name}: the reference served it")


def _fork_onto_a_live_sequence(cache: Any, program: Exported, model: TinyAttention) -> Optional[float]:
    """Sequence 1 still holds an old prompt the runner forgot to remove when it forks sequence 0 onto it."""
    for seq_id in (0, 1):
        run(cache, program, [(torch.randn(1, 3, HIDDEN), 0)], seq_id)
    cache.seq_cp(0, 1)
    return None


def _seq_id_reused_without_removal(cache: Any, program: Exported, model: TinyAttention) -> Optional[float]:
    """A finished request's id is handed to a new prompt, whose positions start at 0 again, without seq_rm."""
    run(cache, program, [(torch.randn(1, 3, HIDDEN), 0)], 0)
    prompt = torch.randn(1, 2, HIDDEN)
    served = run(cache, program, [(prompt, 0)], 0)[0]
    return float((served - model.recompute(prompt)).abs().max())


def misuse() -> list[Misuse]:
    """Runner misuse: upstream's cache serves each one without an exception (its output then wrong by
    `upstream_error`); the reference refuses each with its rule."""
    return [
        _contiguous_misuse("wrong position: a decode step skips position 4", (0, 1), [(0, 4), (5, 1)]),
        _contiguous_misuse("wrong position: a decode step repeats position 3", (0, 1), [(0, 4), (3, 1), (4, 1)]),
        _contiguous_misuse("forgotten reset: a new prompt at position 0 on the old history", (0, 1),
                           [(0, 4), (4, 1), (0, 3)], reset_after=2),
        _contiguous_misuse("a layer served twice in one forward: a block reused with its layer id", (0, 1, 0),
                           [(0, 4)]),
        _cell_misuse("forgotten seq_rm: a sequence id reused for a new prompt", _seq_id_reused_without_removal),
        _cell_misuse("fork onto a sequence that still holds tokens", _fork_onto_a_live_sequence),
    ]


def main() -> int:
    import warnings

    warnings.simplefilter("ignore")   # upstream's ExperimentalWarning on every config
    errors = served_right()
    for name, error in errors.items():
        print(f"{error:.2e}  {name}")
    print(f"max |op - full recompute| = {max(errors.values()):.2e} over {len(errors)} runs (bound 1e-4)")
    for case in misuse():
        silently = "" if case.upstream_error is None else f", output off by {case.upstream_error:.2f}"
        print(f"{case.name}: upstream serves it{silently}; the reference refuses it: {case.message}")
    return 0 if max(errors.values()) <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
