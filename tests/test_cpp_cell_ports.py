"""The C++ cell caches (spec/cpp/example/cell_cache.h faithful, cell_cache_lax.h upstream-lax): each
compiles with g++ -std=c++17 (warnings as errors) and runs a small program; the faithful port answers
what kvcache.CellCache answers, the lax one answers upstream's way. (Conformance wiring comes later.)"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kvcache import CacheConfig, CellCache, CellStep, KVCacheError, LayerConfig, LayerPolicy

EXAMPLE = Path(__file__).resolve().parent.parent / "spec" / "cpp" / "example"
GXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(GXX is None, reason="no g++ on PATH: the C++ port tests need a C++17 compiler")

SMOKE = r"""
#include <cstdio>
#include <string>
#include "cell_cache.h"
#include "cell_cache_lax.h"

template <class F> void attempt(F f) {
  try { f(); } catch (const std::exception& e) {
    std::string what = e.what();
    std::printf("rejected %s\n", what.substr(0, what.find(':')).c_str());
  }
}

void show(demo::CellStepper* stepper, int layer, std::vector<int32_t> positions) {
  const demo::CellStep* s = stepper->place_step(layer, positions.data(), static_cast<int>(positions.size()));
  if (!s) { std::printf("null\n"); return; }
  std::string cells, rows;
  for (int i = 0; i < s->length; ++i) {
    cells += (i ? "," : "") + std::to_string(s->cells[i]);
    rows += i ? "|" : "";
    for (int j = 0; j < s->read_len; ++j) rows += s->mask_bits[i * s->read_len + j] ? '1' : '0';
  }
  std::printf("step L%d cells=%s rows=%s\n", layer, cells.c_str(), rows.c_str());
}

template <class Cache> int run() {
  demo::CacheConfig cfg;
  cfg.capacity = 8;
  cfg.n_layers = 2;
  cfg.layers = {{{demo::Kind::Flat, 0}, 1, 1}, {{demo::Kind::Ring, 2}, 1, 1}};
  Cache cache(cfg);
  demo::CacheBase* base = &cache;
  demo::BatchControl* c = base->as_batch_control();
  demo::CellStepper* st = base->as_cell_stepper();
  if (!c || !st || base->as_control() || base->as_planner()) return 1;
  std::printf("new %d\n", *c->seq_new());
  c->declare_step({0, 0, 0});
  show(st, 0, {0, 1, 2});
  show(st, 1, {0, 1, 2});
  int b = *c->seq_clone(0, 2);
  std::printf("clone %d len=%d next=%d\n", b, c->seq_len(b), c->next_pos(b));
  c->declare_step({0, 1});
  show(st, 0, {3, 2});
  show(st, 1, {3, 2});
  bool rm = c->seq_rm(0, 1, 3);
  std::printf("rm %s len=%d used=%d free=%d\n", rm ? "true" : "false", c->seq_len(0), cache.used_end(),
              cache.free_cells());
  attempt([&] { std::printf("%d\n", c->seq_len(7)); });
  attempt([&] { std::printf("%s\n", c->seq_rm(9, 0, std::nullopt) ? "true" : "false"); });
  attempt([&] { std::printf("%d\n", c->seq_len(64)); });
  c->declare_step({0});
  show(st, 0, {5});
  attempt([&] { std::printf("new %d\n", *c->seq_new()); });
  attempt([&] { show(st, 1, {5}); });
  std::printf("free=%d used=%d\n", cache.free_cells(), cache.used_end());
  c->clear();
  std::printf("clear free=%d used=%d\n", cache.free_cells(), cache.used_end());
  return 0;
}

int main(int argc, char**) { return argc > 1 ? run<demo::CellCacheLax>() : run<demo::CellCache>(); }
"""

# By hand (flat + ring(2), capacity 8), the shared part first.
COMMON = ["new 0", "step L0 cells=0,1,2 rows=100|110|111", "step L1 cells=0,1,2 rows=100|110|011",
          "clone 1 len=2 next=2", "step L0 cells=3,4 rows=11110|11001", "step L1 cells=3,4 rows=00110|01001",
          "rm true len=2 used=5 free=4"]
FAITHFUL = COMMON + ["rejected CELL-SEQ-LIVE", "rejected CELL-SEQ-LIVE", "rejected CELL-SEQ-ID",
                     "step L0 cells=2 rows=10110", "rejected CELL-FORWARD", "step L1 cells=2 rows=00100",
                     "free=3 used=5", "clear free=8 used=0"]
# upstream: 0 for a dead or out-of-range id, true for seq_rm of a dead id; a seq_new between the layers
# of a forward succeeds and drops the placement, so layer 1 places position 5 again - now not newer: null.
LAX = COMMON + ["0", "true", "0", "step L0 cells=2 rows=10110", "new 2", "null", "free=3 used=5",
                "clear free=8 used=0"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert GXX is not None
    out = tmp_path_factory.mktemp("cell_cpp")
    (out / "smoke.cpp").write_text(SMOKE)
    flags = ["-std=c++17", "-O1", "-Wall", "-Wextra", "-Wpedantic", "-Werror", f"-I{EXAMPLE}"]
    done = subprocess.run([GXX, *flags, "-o", str(out / "smoke"), str(out / "smoke.cpp")], capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return out / "smoke"


@pytest.mark.slow   # compiles the ports (the smoke fixture)
def test_the_faithful_port_runs_the_program(smoke: Path) -> None:
    done = subprocess.run([smoke], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.splitlines() == FAITHFUL


@pytest.mark.slow   # compiles the ports (the smoke fixture)
def test_the_lax_port_answers_upstreams_way(smoke: Path) -> None:
    done = subprocess.run([smoke, "lax"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.splitlines() == LAX


def _line(step: CellStep, layer: int) -> str:
    rows = "|".join("".join(str(b) for b in step.row(i)) for i in range(step.length))
    return f"step L{layer} cells={','.join(map(str, step.cells))} rows={rows}"


def test_the_python_reference_answers_the_faithful_ports_lines() -> None:
    """CELL-MASK, CELL-RM, CELL-SEQ-LIVE, CELL-SEQ-ID, CELL-FORWARD: the same program on kvcache.CellCache."""
    c = CellCache(CacheConfig(8, 2, [LayerConfig(LayerPolicy.flat()), LayerConfig(LayerPolicy.ring(2))]))
    lines = [f"new {c.seq_new()}"]
    assert c.declare_step([0, 0, 0])
    lines += [_line(c.place_step(layer, [0, 1, 2]), layer) for layer in (0, 1)]
    b = c.seq_clone(0, 2)
    assert b is not None
    lines.append(f"clone {b} len={c.seq_len(b)} next={c.next_pos(b)}")
    assert c.declare_step([0, 1])
    lines += [_line(c.place_step(layer, [3, 2]), layer) for layer in (0, 1)]
    lines.append(f"rm {str(c.seq_rm(0, 1, 3)).lower()} len={c.seq_len(0)} used={c.used_end()} free={c.free_cells()}")
    for call in (lambda: c.seq_len(7), lambda: c.seq_rm(9, 0), lambda: c.seq_len(64)):
        with pytest.raises(KVCacheError) as caught:
            call()
        lines.append(f"rejected {caught.value.rule}")
    assert c.declare_step([0])
    lines.append(_line(c.place_step(0, [5]), 0))
    with pytest.raises(KVCacheError) as caught:
        c.seq_new()
    lines += [f"rejected {caught.value.rule}", _line(c.place_step(1, [5]), 1),
              f"free={c.free_cells()} used={c.used_end()}"]
    c.clear()
    lines.append(f"clear free={c.free_cells()} used={c.used_end()}")
    assert lines == FAITHFUL
