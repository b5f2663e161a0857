from kvcache import CacheConfig, LayerConfig, LayerPolicy, SequenceCache

# A flat layer and a sliding-window layer (window 3). A step writes at most max_write = 4 tokens.
config = CacheConfig(capacity=32, n_layers=2, max_write=4,
                     layers=[LayerConfig(LayerPolicy.flat()), LayerConfig(LayerPolicy.ring(3))])
cache = SequenceCache(config)
runner, backend = cache.as_control(), cache.as_planner()
# The backend's pools, allocated once: a row holds (logical position, token); -1 = never written.
pools = [[(-1, 0)] * backend.depth(layer) for layer in range(config.n_layers)]


def run_step(tokens: list[int]) -> list[int]:
    """The backend: every layer plans, scatters, gathers (checking each row) and commits.

    The toy model predicts, after the token at t, the sum of the tokens it sees on the ring layer
    (positions t-2..t: a banded mask) modulo 10.
    """
    position, T = runner.length(), len(tokens)
    for layer in range(config.n_layers):
        plan = backend.plan(layer, position, T)
        assert plan is not None                        # None only if the runner skipped admission
        written = [run.start + i for run in plan.write for i in range(run.len)]
        for offset, row in enumerate(written):
            pools[layer][row] = (position + offset, tokens[offset])        # scatter
        read = [pools[layer][run.start + i] for run in plan.read for i in range(run.len)]   # gather
        assert [p for p, _ in read] == list(range(plan.read_base_pos, position + T))
        backend.commit(plan)                                               # per-layer commit
    return [sum(tok for q, tok in read if t - 3 < q <= t) % 10 for t in range(position, position + T)]


prompt = [1, 2, 3, 4, 5, 6]
assert runner.can_extend(len(prompt))                 # admission before the prompt
for start in range(0, len(prompt), 4):                # prefill in chunks of at most max_write
    predictions = run_step(prompt[start:start + 4])
sequence, pending = list(prompt), predictions[-1]
stats = {"accepted": 0, "rolled back": 0}

while runner.can_extend(1):
    k = 3                                             # drafts per step: 1 + k <= max_write
    while not runner.can_extend(1 + k):               # admission: speculate only what fits
        k -= 1
    drafts = [(pending + 2 * i + 1) % 10 for i in range(k)]   # a draft model's guesses
    start = runner.length()
    predictions = run_step([pending] + drafts)        # verify all drafts in one step
    accepted = 0
    while accepted < k and drafts[accepted] == predictions[accepted]:
        accepted += 1
    if accepted < k:
        assert runner.rewind(start + 1 + accepted)    # roll back the rejected drafts' rows
        stats["rolled back"] += k - accepted
    stats["accepted"] += accepted
    sequence += [pending] + drafts[:accepted]
    pending = predictions[accepted]
    assert pending == sum(sequence[-3:]) % 10         # what recomputing without a cache gives

assert runner.length() == len(sequence) == config.capacity   # stopped by admission, nothing lost
