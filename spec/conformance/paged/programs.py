"""Paged programs: the configurations the suite drives for a paged cache, the configurations it must refuse,
edge programs and random ones (the steps: engine.py's docstring).

Prompts come from a few token families (`family`), so requests share prefixes, diverge inside and at the end
of blocks, and come back after their blocks were freed and maybe evicted; extra keys (an adapter, a salt) give
the same tokens another K/V. Small pools force refusals and eviction; one large configuration (SCALE) drives
more than 64 concurrent requests over more than 1,000 blocks.
"""

from __future__ import annotations

import random
from typing import Any

from ..configs import JsonConfig
from ..engine import Step

FULL: dict[str, Any] = {"kind": "full"}
# A budget that reserves every token left (more than any prompt here): small, so a shrunk program's budget is
# tried at every smaller value (suite/shrink.py) and a minimal one says which budget matters.
WHOLE = 64


def window(w: int) -> dict[str, Any]:
    return {"kind": "window", "window": w}


def paged_config(block_size: int, num_blocks: int, max_model_len: int, groups: list[dict[str, Any]],
                 prefix_caching: bool = True, pools: str | None = None) -> JsonConfig:
    """A paged configuration; `pools` (PAGED-CONFIG) only when given: a config without it is every target's."""
    return {"block_size": block_size, "num_blocks": num_blocks, "max_model_len": max_model_len,
            "groups": groups, "prefix_caching": prefix_caching, **({} if pools is None else {"pools": pools})}


# At least 64 concurrent requests over at least 1,000 blocks (its edge program "many concurrent requests").
SCALE = paged_config(8, 1024, 96, [FULL, window(12)])
SCALE_REQUESTS = 72
PAGED_CONFIGS: tuple[JsonConfig, ...] = (
    paged_config(4, 8, 32, [FULL]),                     # a small pool: refusals and eviction
    paged_config(1, 12, 16, [FULL]),                    # blocks of one token (a radix cache's pages)
    paged_config(2, 16, 24, [FULL, window(3)]),         # a hybrid model: a full and a sliding-window group
    paged_config(4, 12, 32, [window(5)]),               # a window group alone
    paged_config(4, 10, 24, [FULL], prefix_caching=False),
    paged_config(2, 5, 12, [FULL, FULL]),               # two groups on a tight pool
    # a hybrid model whose window group has a pool of its own (SGLang's SWA pool): only to a scope with `pools`
    paged_config(2, 8, 24, [FULL, window(3)], pools="per-group"),
    SCALE,
)

_BASE = PAGED_CONFIGS[0]
BAD_PAGED_CONFIGS: tuple[JsonConfig, ...] = (
    {**_BASE, "block_size": 0}, {**_BASE, "block_size": True}, {**_BASE, "num_blocks": -1},
    {**_BASE, "num_blocks": "8"}, {**_BASE, "max_model_len": 0}, {**_BASE, "groups": []},
    {**_BASE, "groups": [window(0)]}, {**_BASE, "groups": [{"kind": "ring", "window": 2}]},
    {**_BASE, "groups": "full"}, {**_BASE, "prefix_caching": 1}, {**_BASE, "extra": 1},
    {key: value for key, value in _BASE.items() if key != "max_model_len"},
    {**_BASE, "pools": "per-layer"}, {**_BASE, "pools": True},   # PAGED-CONFIG: only to a scope with `pools`
)


def bad_paged_configs(validates_configs: bool) -> list[JsonConfig]:
    """The configurations a target must refuse at create (PAGED-CONFIG): a paged target gets the JSON."""
    return list(BAD_PAGED_CONFIGS)


def family(f: int, n: int) -> list[int]:
    """The first n tokens of prompt family f: families share no first token."""
    return [f * 101 + (i * 37) % 97 for i in range(n)]


def admit(tokens: list[int], keys: list[str] | None = None, budget: int = WHOLE, **extra: Any) -> Step:
    return {"op": "admit", "tokens": tokens, "keys": keys or [], "budget": budget, **extra}


def extend(request: Any = None, tokens: list[int] | None = None, budget: int = WHOLE) -> Step:
    return {"op": "extend", "request": {"live": 0} if request is None else request,
            "tokens": [7] if tokens is None else tokens, "budget": budget}


def free(request: Any = None) -> Step:
    return {"op": "free", "request": {"live": 0} if request is None else request}


def live(k: int) -> dict[str, int]:
    return {"live": k}


CHECK: Step = {"op": "check"}
# Calls the argument contract refuses (PAGED-ARGS, PAGED-FREE): each must raise and change nothing.
BAD_CALLS: tuple[tuple[str, Step], ...] = (
    ("free of a request never admitted", free({"unknown": 0})),
    ("free of a request already freed", free({"freed": 0})),
    ("admit of an empty prompt", admit([])),
    ("admit of a negative token", admit([1, -1])),
    ("admit of a bool token", admit([1, True])),
    ("admit of a str token", {**admit([1]), "tokens": [1, "2"]}),
    ("admit of a float token", {**admit([1]), "tokens": [1, 2.0]}),
    ("admit of tokens not a list", {**admit([1]), "tokens": 1}),
    ("admit with keys not a list of str", {**admit([1, 2]), "keys": [3]}),
    ("admit with keys a str", {**admit([1, 2]), "keys": "adapter-1"}),
    ("admit with budget 0", admit([1, 2], budget=0)),
    ("admit with a negative budget", admit([1, 2], budget=-1)),
    ("admit with a bool budget", admit([1, 2], budget=True)),
    ("admit of a live request", admit([1, 2], request=live(0))),
    ("admit with a request id not a str", admit([1, 2], request=5)),
    ("table of a request never admitted", {"op": "table", "request": {"unknown": 0}}),
    ("table of a freed request", {"op": "table", "request": {"freed": 0}}),
    ("extend of a request never admitted", extend({"unknown": 0})),
    ("extend of a freed request", extend({"freed": 0})),
    ("extend with a negative token", extend(live(0), [-3])),
    ("extend with a bool token", extend(live(0), [False])),
    ("extend with budget 0", extend(live(0), [4], budget=0)),
    ("extend with a bool budget", extend(live(0), [4], budget=True)),
)


def too_long(cfg: JsonConfig) -> list[Step]:
    """A prompt one token longer than max_model_len; an extend past it; an extend with nothing to compute."""
    m = cfg["max_model_len"]
    return [admit(family(3, m + 1)), admit(family(3, 2)), extend(live(-1), family(4, m)), extend(live(-1), [])]


def edge_paged_programs(cfg: JsonConfig) -> list[tuple[str, list[Step]]]:
    """Systematic programs: prefill and decode, chunked prefill, hits on shared prefixes (same tokens, other
    keys; a prompt equal to a cached one; divergence inside a block), decode past a shared block, free and
    re-admission, pressure that refuses and evicts, windows decoding past their window, and bad calls."""
    B, N, M = cfg["block_size"], cfg["num_blocks"], cfg["max_model_len"]
    G = len(cfg["groups"])
    two = min(2 * B, M - 1)
    short = family(0, min(two + 1, M))
    out: list[tuple[str, list[Step]]] = [
        ("prefill, decode, free", [admit(short), extend(), extend(), extend(), free(), CHECK]),
        ("chunked prefill, then decode", [admit(family(0, min(3 * B + 2, M)), budget=B)]
         + [extend(live(0), [], B)] * 3 + [extend(), extend()]),
        ("a second request hits the shared prefix", [admit(family(0, two) + [900]), admit(family(0, two) + [901]),
                                                      extend(live(0)), extend(live(1)), free(live(0)), extend(live(0)),
                                                      CHECK]),
        ("same tokens, other keys", [admit(short), admit(short, ["adapter-1"]), admit(short, ["adapter-1"]),
                                     admit(short, ["salt-2"]), extend(live(1)), extend(live(2)), CHECK]),
        ("a prompt equal to a cached one hits all but its last block", [admit(family(0, two)),
                                                                         admit(family(0, two)), extend(live(1))]),
        ("divergence inside a block", [admit(family(0, B + 2)), admit(family(0, B + 1) + [950, 951]),
                                       extend(live(0)), extend(live(1)), extend(live(0))]),
        ("a partly filled block continued by another request", [admit(family(0, B + 2)),
                                                                admit(family(0, B + 2) + [960]), extend(live(0)),
                                                                extend(live(1)), CHECK]),
        ("decode past a shared full block", [admit(family(0, two)), admit(family(0, two) + [970]),
                                             extend(live(0), [971]), extend(live(1), [972]), CHECK]),
        ("free, then the same prompt again", [admit(short), extend(), free(), admit(short), extend(), CHECK]),
        ("free of a shared prefix's first owner", [admit(short), admit(family(0, two) + [980]), free(live(0)),
                                                   extend(live(0)), admit(short), CHECK]),
    ]
    # pressure: fill the pool with other prompts, so the freed prefix is evicted (or refused), then come back
    fill = [admit(family(f, min(M, max(1, (N // (2 * G)) * B)))) for f in range(1, 4)]
    out.append(("pressure evicts a freed prefix, which comes back", [admit(short), free()] + fill
                + [free(live(0)), free(live(0)), admit(short), extend(), admit(family(5, min(M, N * B))), CHECK]))
    tail = min(M, 3 * B + 1)
    out.append(("a refused admission whose prefix is cached", [admit(family(0, two + 1)), free(),
                                                               admit(family(1, min(M, max(1, (N // G - 3) * B)))),
                                                               admit(family(0, two) + [990] * (tail - two)),
                                                               extend(live(0)), CHECK]))
    out.append(("admissions until refused, then frees", [admit(family(f, min(M, 2 * B + f))) for f in range(6)]
                + [free(live(0)), free(live(0)), admit(family(0, min(M, 2 * B))), CHECK]))
    widest = max([g.get("window", 0) for g in cfg["groups"]])
    if widest:
        out.append(("decode past the window", [admit(family(0, min(M - 3 * B, widest + 1)) or [1])]
                    + [extend()] * (2 * B + 1) + [CHECK]))
        out.append(("a window group's chunked prefill", [admit(family(0, min(M - 1, widest + 2 * B)), budget=2)]
                    + [extend(live(0), [], 2)] * (widest + B) + [CHECK]))
    out.append(("bad calls on an empty cache", [bad for _, bad in BAD_CALLS] + too_long(cfg)))
    out.append(("bad calls with live requests", [admit(short), free(), admit(short), extend()]
                + [bad for _, bad in BAD_CALLS] + too_long(cfg) + [CHECK]))
    if cfg["num_blocks"] >= 1000:
        out.append(("many concurrent requests", many_concurrent(cfg, SCALE_REQUESTS)))
    return out


def many_concurrent(cfg: JsonConfig, count: int) -> list[Step]:
    """`count` requests live at once: prompts of six families with their own tails, two key sets, chunked
    prefills, rounds of decode over every live request, every third freed, and their prompts admitted again."""
    B, M = cfg["block_size"], cfg["max_model_len"]
    rng = random.Random(count)
    prompts = [family(k % 6, min(M - 24, B * (1 + k % 4) + k % 3)) + [1000 + k] * (k % 2)
               for k in range(count)]
    keys = [["adapter-1"] if k % 5 == 4 else [] for k in range(count)]
    budgets = [rng.choice([B, 2 * B, WHOLE]) for _ in prompts]
    steps = [admit(p, keys[k], budget=budgets[k]) for k, p in enumerate(prompts)]
    # finish the chunked prefills with their first decoded token (a hit may have left nothing else to compute;
    # in admission order, the k-th live request is the k-th admitted), then decode
    steps += [extend(live(k), [8], WHOLE) for k in range(count) if budgets[k] < len(prompts[k])]
    for round_ in range(3):
        steps += [extend(live(k), [round_ + k % 7], 1) for k in range(count)]
    steps += [free(live(k)) for k in range(0, count, 3)]
    steps += [admit(prompts[k], keys[k]) for k in range(0, count, 3)]
    steps += [extend(live(k), [9], 1) for k in range(count)] + [CHECK]
    return steps


def random_paged_program(cfg: JsonConfig, rng: random.Random, size: int) -> list[Step]:
    """A random program weighted toward admissions of related prompts, decode and chunked extends, frees."""
    B, M = cfg["block_size"], cfg["max_model_len"]
    if cfg["num_blocks"] >= 1000:
        size *= 4   # the large pool: more requests at once
    program: list[Step] = []
    for _ in range(size):
        roll = rng.random()
        if roll < 0.32:
            f = rng.randrange(4)
            shared = rng.randint(1, max(1, min(M - 1, 3 * B + 1)))
            tokens = family(f, shared) + [rng.randrange(1000) for _ in range(rng.choice([0, 0, 1, 2, B]))]
            keys = rng.choice([[], [], [], ["adapter-1"], ["salt-2"]])
            budget = rng.choice([WHOLE, WHOLE, rng.randint(1, 2 * B)])
            program.append(admit(tokens[:M], keys, budget))
        elif roll < 0.70:
            k = rng.randrange(8)
            if rng.random() < 0.25:
                program.append(extend(live(k), [], rng.randint(1, 2 * B)))
            else:
                program.append(extend(live(k), [rng.randrange(1000) for _ in range(rng.choice([1, 1, 1, 2]))],
                                      rng.choice([1, WHOLE])))
        elif roll < 0.90:
            program.append(free(live(rng.randrange(8))))
        elif roll < 0.97:
            program.append(rng.choice(BAD_CALLS)[1])
        else:
            program.append(CHECK)
    return program
