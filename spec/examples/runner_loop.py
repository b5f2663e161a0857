"""A runner loop with admission and speculative rollback, and the backend it drives.

    python -m kvcache_spec.examples.runner_loop

The "model" is a toy: integer hidden states instead of tensors, so every number is exact. It still
needs what attention needs: each layer mixes the rows of the positions a token attends to (all of
them on a flat layer, the last `window` on a ring layer), so a wrong row changes the output. The
backend executes the cache's plans on its own pools and checks every row it reads; `recompute`
runs the same model with no cache, to show that caching and speculation change nothing.
"""

from __future__ import annotations

import sys
from typing import Callable, Optional

from kvcache import CacheConfig, LayerConfig, LayerPolicy, SequenceCache, SequencePlanner

VOCAB = 50
MODULUS = 1_000_003

# Two flat layers and two sliding-window layers. A step may write at most MAX_WRITE tokens (STEP-T-MAX):
# it bounds the prefill chunks and the speculation depth (MAX_WRITE - 1 drafts and the pending token).
MAX_WRITE = 4
CONFIG = CacheConfig(
    capacity=48, n_layers=4, max_write=MAX_WRITE,
    layers=[LayerConfig(LayerPolicy.flat()), LayerConfig(LayerPolicy.ring(3)),
            LayerConfig(LayerPolicy.flat()), LayerConfig(LayerPolicy.ring(5))])


def window_of(config: CacheConfig, layer: int) -> Optional[int]:
    policy = config.layer(layer).policy
    return policy.window if policy.window else None


def mix(layer: int, token_position: int, keys: list[tuple[int, int]]) -> int:
    """The toy attention: the new hidden state of a token from the (position, hidden) rows it sees."""
    total = 7 * (layer + 1)
    for position, hidden in keys:
        total = (total * 31 + (token_position - position + 1) * hidden) % MODULUS
    return total


def visible(config: CacheConfig, layer: int, token_position: int, key_position: int) -> bool:
    """The mask: causal, and on a ring layer only the last `window` keys (the token itself included)."""
    window = window_of(config, layer)
    return key_position <= token_position and (window is None or key_position > token_position - window)


# --- the backend ----------------------------------------------------------------------------------

class ToyBackend:
    """Owns one pool per layer; runs every layer of a step from the cache's plans (per-layer commit)."""

    def __init__(self, planner: SequencePlanner, config: CacheConfig) -> None:
        self.planner = planner
        self.config = config
        # Allocate once: depth(layer) rows per layer. A row holds (logical position, hidden state).
        self.pools: list[list[Optional[tuple[int, int]]]] = [
            [None] * planner.depth(layer) for layer in range(config.n_layers)]

    def forward(self, position: int, tokens: list[int]) -> list[int]:
        """The next-token prediction after each of `tokens`, placed at `position`."""
        T = len(tokens)
        hidden = list(tokens)
        for layer in range(self.config.n_layers):
            plan = self.planner.plan(layer, position, T)
            if plan is None:  # the runner admits before it steps; None means it did not
                raise RuntimeError(f"step ({position}, {T}) does not fit: check can_extend first")
            pool = self.pools[layer]
            written = [run.start + i for run in plan.write for i in range(run.len)]
            for offset, row in enumerate(written):                 # scatter the new rows
                pool[row] = (position + offset, hidden[offset])
            read = [pool[run.start + i] for run in plan.read for i in range(run.len)]   # gather, in order
            keys = [row for row in read if row is not None]
            if [p for p, _ in keys] != list(range(plan.read_base_pos, position + T)):
                raise RuntimeError(f"layer {layer}: the rows read are not positions "
                                   f"[{plan.read_base_pos}, {position + T})")
            hidden = [mix(layer, position + i, [k for k in keys if visible(self.config, layer, position + i, k[0])])
                      for i in range(T)]
            self.planner.commit(plan)  # per layer, as the MLX runtime does; one length for the model
        return [h % VOCAB for h in hidden]


def recompute(config: CacheConfig, tokens: list[int]) -> list[int]:
    """The same model with no cache: every layer over the whole sequence (the reference)."""
    hidden = list(tokens)
    for layer in range(config.n_layers):
        rows = list(enumerate(hidden))
        hidden = [mix(layer, t, [k for k in rows if visible(config, layer, t, k[0])]) for t in range(len(tokens))]
    return [h % VOCAB for h in hidden]


# --- the runner -------------------------------------------------------------------------------------

Draft = Callable[[list[int], int], list[int]]


DRAFT_CONTEXT = 12


def draft_model(context: list[int], k: int) -> list[int]:
    """The draft model: the same toy model seeing only the last DRAFT_CONTEXT tokens - cheap, often wrong."""
    sequence = context[-DRAFT_CONTEXT:]
    guesses: list[int] = []
    for _ in range(k):
        guesses.append(recompute(CONFIG, sequence + guesses)[-1])
    return guesses


class Runner:
    """Greedy generation with speculative decoding: verify k drafts in one step, roll back the rest."""

    def __init__(self, cache: SequenceCache, backend: ToyBackend, draft: Draft = draft_model) -> None:
        self.control = cache.as_control()
        self.backend = backend
        self.draft = draft
        self.tokens: list[int] = []        # every token whose rows the cache holds
        self.stats = {"steps": 0, "drafted": 0, "accepted": 0, "rollbacks": 0}

    def _step(self, tokens: list[int]) -> list[int]:
        position = self.control.length()
        predictions = self.backend.forward(position, tokens)
        self.tokens += tokens
        self.stats["steps"] += 1
        return predictions

    def prefill(self, prompt: list[int]) -> int:
        """Admit the prompt, run it in chunks of at most MAX_WRITE; returns the first generated token."""
        if not self.control.can_extend(len(prompt)):
            raise ValueError(f"a prompt of {len(prompt)} tokens does not fit "
                             f"({self.control.length()} of {self.control.capacity()} used)")
        predictions: list[int] = []
        for start in range(0, len(prompt), MAX_WRITE):
            predictions = self._step(prompt[start:start + MAX_WRITE])
        return predictions[-1]

    def generate(self, prompt: list[int], max_new: int, speculate: int = MAX_WRITE - 1) -> list[int]:
        """Up to `max_new` tokens after `prompt`; stops early when the cache is full (admission)."""
        pending = self.prefill(prompt)
        output = [pending]
        while len(output) < max_new:
            # Admission: the pending token plus k drafts must fit; speculate less near the end.
            k = min(speculate, max_new - len(output))
            while k > 0 and not self.control.can_extend(1 + k):
                k -= 1
            if not self.control.can_extend(1):
                break  # the sequence is full: stop (or evict and start over)
            drafts = self.draft(self.tokens + [pending], k)
            start = self.control.length()
            predictions = self._step([pending] + drafts)
            accepted = 0
            while accepted < k and drafts[accepted] == predictions[accepted]:
                accepted += 1
            if accepted < k:
                # Roll back the rejected drafts' rows. Sound by construction: the step wrote at most
                # max_write rows, and a ring of window + max_write - 1 slots keeps what came before.
                if not self.control.rewind(start + 1 + accepted):
                    raise RuntimeError("rewind refused: the cache cannot serve the rollback")
                del self.tokens[start + 1 + accepted:]
                self.stats["rollbacks"] += 1
            self.stats["drafted"] += k
            self.stats["accepted"] += accepted
            output += drafts[:accepted] + [predictions[accepted]]
            pending = output[-1]
        return output[:max_new]


def greedy_without_cache(config: CacheConfig, prompt: list[int], max_new: int) -> list[int]:
    """What generate must produce: plain greedy decoding by recomputation, one token at a time."""
    sequence = list(prompt)
    output: list[int] = []
    while len(output) < max_new and len(sequence) <= config.capacity:
        output.append(recompute(config, sequence)[-1])
        sequence.append(output[-1])
    return output


def main(argv: Optional[list[str]] = None) -> int:
    cache = SequenceCache(CONFIG)
    runner = Runner(cache, ToyBackend(cache.as_planner(), CONFIG))

    first = runner.generate([3, 14, 15, 9, 26, 5, 35], max_new=20)
    if first != greedy_without_cache(CONFIG, [3, 14, 15, 9, 26, 5, 35], 20):
        print("request 1: speculation changed the output", file=sys.stderr)
        return 1
    print(f"request 1: {first}")

    # The same cache serves the next request after clear(). This one runs until the cache is full.
    cache.as_control().clear()
    runner.tokens.clear()
    second = runner.generate([2, 7, 18], max_new=100)
    if second != greedy_without_cache(CONFIG, [2, 7, 18], 100) or cache.as_control().length() != CONFIG.capacity:
        print("request 2: speculation changed the output, or admission did not stop at capacity", file=sys.stderr)
        return 1
    print(f"request 2: {len(second)} tokens, then the cache was full ({cache.as_control().length()} of "
          f"{CONFIG.capacity})")
    print("stats:", runner.stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
