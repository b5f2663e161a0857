"""The op face with torch tensors: torch in, torch out, the same values as numpy; `attend` agrees with torch's
scaled_dot_product_attention (upstream's mechanism). Skipped, with its reason, where torch is not installed
(torch is never a dependency of kvcache-spec); `kvcache.op` never imports torch itself (checked without it)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from kvcache.op import AttendSpec, CacheConfig, CellReferenceCache, ContiguousReferenceCache, LayerPolicy, \
    MaskKind, attend
from .test_op_reference import column, labelled


def test_importing_the_op_face_does_not_import_torch() -> None:
    code = "import sys, kvcache.op; assert 'torch' not in sys.modules, 'kvcache.op imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True)


torch = pytest.importorskip("torch", reason="torch is not installed (an optional extra of the test run)")


def _same_answer(numpy_answer: tuple[object, ...], torch_answer: tuple[object, ...]) -> None:
    k_np, v_np, spec_np = numpy_answer
    k_t, v_t, spec_t = torch_answer
    assert isinstance(k_t, torch.Tensor) and isinstance(v_t, torch.Tensor)
    assert k_t.dtype == torch.float32
    assert np.array_equal(k_t.numpy(), k_np) and np.array_equal(v_t.numpy(), v_np)
    assert isinstance(spec_t, AttendSpec) and isinstance(spec_np, AttendSpec) and spec_t.kind is spec_np.kind
    if spec_np.kind is MaskKind.EXPLICIT:
        assert isinstance(spec_t.mask, torch.Tensor) and spec_t.mask.dtype == torch.bool
        assert np.array_equal(spec_t.mask.numpy(), spec_np.mask)


def test_torch_in_torch_out_contiguous() -> None:
    config = CacheConfig(n_layers=2, n_kv_heads=2, head_dim=3, capacity=8, batch_size=2, v_head_dim=2,
                         layers=(LayerPolicy.flat(), LayerPolicy.ring(2)), max_write=2)
    by_numpy, by_torch = ContiguousReferenceCache(config), ContiguousReferenceCache(config)
    for start, q_len in ((0, 2), (2, 1), (3, 2)):
        positions = list(range(start, start + q_len))
        for layer in (0, 1):
            k, v = labelled(positions, layer, 2, 2, 3, 2)
            answer = by_numpy.update_and_fetch(layer, k, v, column(positions))
            tk, tv = torch.from_numpy(k).double(), torch.from_numpy(v).double()  # cast to float32 on store
            _same_answer(answer, by_torch.update_and_fetch(layer, tk, tv, torch.tensor(column(positions))))


def test_torch_in_torch_out_cells() -> None:
    config = CacheConfig(n_layers=1, n_kv_heads=1, head_dim=2, capacity=8, layers=(LayerPolicy.ring(2),))
    by_numpy, by_torch = CellReferenceCache(config), CellReferenceCache(config)
    for seq_ids, positions in (([0, 0, 1], [0, 1, 0]), ([1, 0], [1, 2])):
        k, v = labelled(list(range(len(seq_ids))), 0, 1, 1, 2, 2)
        by_numpy.begin_step(seq_ids)
        by_torch.begin_step(seq_ids)
        answer = by_numpy.update_and_fetch(0, k, v, column(positions))
        _same_answer(answer, by_torch.update_and_fetch(0, torch.from_numpy(k), torch.from_numpy(v),
                                                       torch.tensor(positions).reshape(-1, 1)))


@pytest.mark.parametrize("kind", list(MaskKind))
def test_attend_agrees_with_torch_sdpa(kind: MaskKind) -> None:
    """OP-MASK as upstream's attend applies it: SDPA with repeated K/V heads, is_causal for CAUSAL."""
    generator = torch.Generator().manual_seed(3)
    B, Hq, Hkv, rows, D, Dv = 2, 6, 2, 4, 5, 3
    q_len = rows if kind is MaskKind.CAUSAL else 2
    q = torch.randn(B, Hq, q_len, D, generator=generator)
    k = torch.randn(B, Hkv, rows, D, generator=generator)
    v = torch.randn(B, Hkv, rows, Dv, generator=generator)
    mask = torch.rand(q_len, rows, generator=generator) < 0.6
    mask[:, -1] = True
    spec = AttendSpec(kind, mask if kind is MaskKind.EXPLICIT else None)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(Hq // Hkv, dim=1), v.repeat_interleave(Hq // Hkv, dim=1),
        attn_mask=spec.mask if kind is MaskKind.EXPLICIT else None, is_causal=kind is MaskKind.CAUSAL, scale=0.5)
    out = attend(q, k, v, spec, scale=0.5, out_dtype=torch.float16)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float16 and out.shape == (B, Hq, q_len, Dv)
    torch.testing.assert_close(out.float(), expected, rtol=2e-3, atol=2e-3)
    assert attend(q, k, v, spec).dtype == torch.float32
    bf16 = attend(q.bfloat16(), k.bfloat16(), v.bfloat16(), spec, scale=0.5)
    assert bf16.dtype == torch.bfloat16 and attend(q, k, v, spec, out_dtype=torch.bfloat16).dtype == torch.bfloat16
    torch.testing.assert_close(bf16.float(), expected, rtol=5e-2, atol=5e-2)
    with pytest.raises(ValueError, match="OP-ARGS"):
        attend(q.numpy(), k.numpy(), v.numpy(), spec, out_dtype=torch.bfloat16)   # numpy has no bfloat16


def test_mixed_kinds_are_refused() -> None:
    """OP-ARGS: k and v of one kind (the answer takes k's)."""
    cache = ContiguousReferenceCache(CacheConfig(n_layers=1, n_kv_heads=1, head_dim=1, capacity=4))
    k, v = labelled([0], 0, 1, 1, 1, 1)
    before = cache._state()
    with pytest.raises(TypeError, match="OP-ARGS"):
        cache.update_and_fetch(0, torch.from_numpy(k), v, column([0]))
    assert cache._state() == before


def test_torch_in_torch_out_with_sinks_and_a_trim() -> None:
    """OP-SINKS, OP-TRIM with torch tensors: the same answers as numpy through a trim and past it."""
    config = CacheConfig(n_layers=2, n_kv_heads=1, head_dim=2, capacity=12,
                         layers=(LayerPolicy.ring(3, 1), LayerPolicy.flat()), max_write=2)
    by_numpy, by_torch = ContiguousReferenceCache(config), ContiguousReferenceCache(config)
    for start, q_len in ((0, 2), (2, 2), (4, 1), (3, 2)):   # after 5 tokens a trim of 2: the step at 3 follows
        if start == 3:
            by_numpy.trim(2)
            by_torch.trim(2)
        positions = list(range(start, start + q_len))
        for layer in (0, 1):
            k, v = labelled(positions, layer, 1, 1, 2, 2)
            answer = by_numpy.update_and_fetch(layer, k, v, column(positions))
            _same_answer(answer, by_torch.update_and_fetch(layer, torch.from_numpy(k), torch.from_numpy(v),
                                                           torch.tensor(column(positions))))
    assert by_numpy.used(0) == by_torch.used(0) == 5
