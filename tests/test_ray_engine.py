"""The model checkers' Ray engine (kvcache_proofs.ray_engine) gives the embedded engine's results: the
same verdicts, states, transitions and checks, and the same shortest counterexample length, whether a
configuration is one Ray task or partitioned over the workers by fingerprint. Runs only
where Ray is installed (`pip install 'kvcache-spec[cluster]'`); CI has a stage that installs it."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

ray = pytest.importorskip("ray", reason="the Ray engine's tests need Ray: pip install 'kvcache-spec[cluster]'")

from kvcache_proofs import _cell_broken, ray_engine  # noqa: E402 - after the skip
from kvcache_proofs import cell_model_checker as cmc  # noqa: E402
from kvcache_proofs.model_checker import check_all, check_config, replay  # noqa: E402
from kvcache_spec.cell_stateful import CellConfigSpec  # noqa: E402

#: Every broken variant is found within it (not a flat and a windowed layer at capacity 1: see
#: tests/test_cell_symmetry.py's BROKEN_BOUNDS); the search that holds uses both layer kinds.
BOUNDS = cmc.CellBounds(groups=((2, 2, (cmc.FLAT, cmc.BOTH)),), max_tokens=2, max_position=3)
BROKEN_BOUNDS = cmc.CellBounds(groups=((2, 2, (cmc.FLAT,)),), max_tokens=2, max_position=3)


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_search_that_holds_explores_the_same_states(workers: int) -> None:
    spec = CellConfigSpec(2, (0, 2), 2)
    embedded = check_config(spec, layout=cmc.layout(BOUNDS))
    layout = cmc.layout(BOUNDS)
    distributed = ray_engine.check_config_ray(spec, ray_engine.start(workers, layout, cmc.cell_reference_factory),
                                              layout)
    assert embedded.counterexample is None and distributed.counterexample is None and distributed.complete
    assert ((distributed.states, distributed.transitions, distributed.checks, distributed.beyond)
            == (embedded.states, embedded.transitions, embedded.checks, embedded.beyond))


@pytest.mark.parametrize("name", sorted(_cell_broken.BROKEN))
def test_a_broken_variant_gets_the_same_shortest_counterexample_length(name: str) -> None:
    factory: Any = _cell_broken.BROKEN[name]
    embedded = check_all(BROKEN_BOUNDS, factory, jobs=1, layout=cmc.layout(BROKEN_BOUNDS))
    distributed = check_all(BROKEN_BOUNDS, factory, jobs=2, engine="ray", layout=cmc.layout(BROKEN_BOUNDS),
                            ray_partition_from=1)   # every configuration partitioned over the 2 workers
    assert embedded.counterexample is not None and distributed.counterexample is not None, name
    assert embedded.counterexample.config == distributed.counterexample.config
    assert len(embedded.counterexample.ops) == len(distributed.counterexample.ops)
    cx = distributed.counterexample
    assert replay(cx.config, cx.ops, factory, cmc.layout(BROKEN_BOUNDS))   # the path replays to a failure


def test_the_command_runs_on_ray() -> None:
    """`python -m kvcache_proofs.model_checker --layout cell --engine ray`: the quick profile holds."""
    from kvcache_proofs import model_checker

    assert model_checker.main(["--layout", "cell", "--profile", "quick", "--jobs", "2", "--engine", "ray",
                              "--time-budget", "600"]) == 0


@pytest.mark.parametrize("partition_from", [None, 2])
def test_configurations_fan_out_with_the_embedded_results(partition_from: Any) -> None:
    """Every configuration one Ray task (None), or those of 2 cells and more partitioned over the workers
    after the others (2): the embedded engine's configurations, states, transitions, checks and depth
    overruns, configuration by configuration."""
    layout = cmc.layout(BOUNDS)
    embedded = check_all(BOUNDS, jobs=1, layout=layout)
    distributed = check_all(BOUNDS, jobs=2, engine="ray", layout=layout, ray_partition_from=partition_from)
    assert embedded.ok and distributed.ok and distributed.configs_checked == embedded.configs_checked == len(BOUNDS.configs())
    assert ((distributed.states, distributed.transitions, distributed.checks, distributed.beyond)
            == (embedded.states, embedded.transitions, embedded.checks, embedded.beyond))


def test_a_fanned_out_search_stops_at_the_first_counterexample_with_the_embedded_length() -> None:
    factory: Any = _cell_broken.BROKEN[sorted(_cell_broken.BROKEN)[0]]
    embedded = check_all(BROKEN_BOUNDS, factory, jobs=1, layout=cmc.layout(BROKEN_BOUNDS))
    distributed = check_all(BROKEN_BOUNDS, factory, jobs=2, engine="ray", layout=cmc.layout(BROKEN_BOUNDS))
    assert embedded.counterexample is not None and distributed.counterexample is not None
    assert distributed.counterexample.config == embedded.counterexample.config
    assert len(distributed.counterexample.ops) == len(embedded.counterexample.ops)


def test_the_crosshair_gate_fans_out_on_ray_with_the_same_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate's analyses in batches, a Ray task each (a zygote per batch: CrossHair imported once per
    batch, the cell plugin registered there): every row's status and path count as with the gate's own
    processes, in one batch (one per node) and dealt over two (free_cells' 11 obligations in the full
    cell scope, from the plugin's symbolic cell state: its postcondition and the invariants)."""
    from kvcache_proofs import crosshair_engines
    from kvcache_proofs import crosshair_gate as gate

    def rows(engine: str) -> dict[tuple[str, int], tuple[str, int]]:
        result = gate.run_gate(300.0, sequence_cache="none", cell_cache="full", engine=engine,
                               select="kvcache._cells.CellCache.free_cells")
        assert not result.problems, result.problems
        return {row.obligation.key: (row.status, row.paths) for row in result.rows if row.status != gate.NOT_RUN}

    here, on_ray = rows("processes"), rows("ray")
    assert len(here) >= 2 and on_ray == here
    assert all(status == gate.CONFIRMED and paths > 0 for status, paths in on_ray.values()), on_ray
    one_batch = crosshair_engines._run_on_ray
    monkeypatch.setattr(crosshair_engines, "_run_on_ray", lambda *args: one_batch(*args, batches=2))
    assert rows("ray") == here


def test_the_gate_deals_its_jobs_into_batches_each_once() -> None:
    from kvcache_proofs.crosshair_engines import _batches

    jobs = [(f"job {k}", (k,)) for k in range(7)]
    for count in (1, 2, 3, 7, 9):
        dealt = _batches(jobs, count)
        assert len(dealt) == min(count, len(jobs)) and all(dealt)
        assert sorted(job for batch in dealt for job in batch) == sorted(jobs)
    assert _batches([], 2) == []
