"""llama.cpp as a cell-recompute target (SPEC.md 5.3), through llama-cpp-python's low-level bindings: one
target per memory mode, the library's defaults first.

    kvcache conformance --strict --target "cmd:python -m kvcache_spec.conformance.cell.llamacpp"
    kvcache conformance --strict --target "cmd:python -m kvcache_spec.conformance.cell.llamacpp unified"

Needs the extra `llamacpp` (llama-cpp-python 0.3.36, built from its sdist, and gguf). Run as `cmd:` (the
module serves itself over the protocol, spec/PROTOCOL.md): llama.cpp aborts the process on some calls
(GGML_ASSERT), which is then a crash finding and the run goes on with a fresh process.

The modes (MODES): llama_context_default_params() has kv_unified false and swa_full true, and the target
without a mode runs those. `unified` (one cell stream shared by every sequence: shared prefixes share cells),
`swa_small` (each sliding layer's cache sized to its window, not to n_ctx) and `unified_swa_small` (both: the
one target this project ran before issue 41) are targets of their own. Each declares the preconditions
llama.cpp's source states for its mode (scope relaxation `requires=`, SPEC.md 6.1), and no more.

The model is written at run time, never downloaded: a tiny GGUF with random F32 weights from a fixed seed
(vocab 32, n_embd 32, 2 heads, n_ff 64). Layers as the config says: flat layers are a llama model; a sliding
layer alone, or a sliding layer 0 beside a dense layer 1, is a gemma2 model (its loader makes even layers
sliding), whose sliding window is the config's. Other layer patterns are outside what llama.cpp builds and
are refused at creation, as are capacities it would not build exactly (it pads n_ctx to a multiple of 256).

One cache is one llama.cpp context: n_seq_max 63 (ids [0, 63), the spec's), n_ubatch 4 (so a sliding cache of
a window-4 layer without swa_full is 256 cells, smaller than a dense one of 512: it wraps within a 300-token
prefill). Unified, n_ctx = capacity cells shared by all sequences; not unified, llama.cpp gives each sequence a
stream of n_ctx / n_seq_max cells, so n_ctx = capacity * 63 and each sequence has `capacity` cells (the spec's
capacity counts cells across sequences: no program of the suite fills one cache with several sequences). The
recompute runs in a second context of the same model, cleared before each recompute: the positions a
recompute spans are decoded as one sequence (a filler token at each gap, removed again before the last
token), then the last.

Scope: flat, ring, seq-state; not position-gaps (llama.cpp keeps each sequence's positions consecutive). A
sequence's state (CELL-STATE) is saved with llama_state_seq_get_size / get_data, or llama_state_seq_save_file (no
prompt tokens) read back, and restored with llama_state_seq_set_data or llama_state_seq_load_file: their own calls,
the bytes as they are (base64 on the wire), 0 from a restore answered as a refusal.
"""

from __future__ import annotations

import base64
import ctypes
import os
import sys
import tempfile
from typing import Any, Optional

MAX_SEQS, VOCAB, EMBD, HEADS, FF = 63, 32, 32, 2, 64
N_UBATCH = 4
GGML_TYPE_F32 = 0
SEED = 20251206


def _is_int(value: Any) -> bool:
    return type(value) is int


def _architecture(windows: list[int]) -> Optional[str]:
    """The model llama.cpp builds with these layer windows, or None when it builds none exactly."""
    if all(w == 0 for w in windows):
        return "llama"
    if windows[0] >= 1 and all(w == 0 for w in windows[1::2]) and all(w == windows[0] for w in windows[0::2]):
        return "gemma2"   # gemma2's loader: layer il is sliding iff il is even
    return None


def write_model(path: str, arch: str, n_layers: int, window: int) -> None:
    """A tiny random-weight GGUF model (F32) at `path`."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(SEED + n_layers * 100 + window)
    writer = gguf.GGUFWriter(path, arch)
    writer.add_context_length(4096)
    writer.add_embedding_length(EMBD)
    writer.add_block_count(n_layers)
    writer.add_feed_forward_length(FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("none")
    writer.add_vocab_size(VOCAB)
    if arch == "gemma2":
        writer.add_sliding_window(window)
    names = gguf.TENSOR_NAMES
    tensor = gguf.MODEL_TENSOR

    def add(key: Any, shape: tuple[int, ...], scale: float, bid: Optional[int] = None) -> None:
        name = names[key].format(bid=bid) + ".weight"
        data = np.ones(shape, np.float32) if scale == 0 else (rng.standard_normal(shape) * scale).astype(np.float32)
        writer.add_tensor(name, data)

    add(tensor.TOKEN_EMBD, (VOCAB, EMBD), 1.0)
    add(tensor.OUTPUT_NORM, (EMBD,), 0)
    if arch == "llama":
        add(tensor.OUTPUT, (VOCAB, EMBD), 0.5)
    for bid in range(n_layers):
        add(tensor.ATTN_NORM, (EMBD,), 0, bid)
        for key in (tensor.ATTN_Q, tensor.ATTN_K):
            add(key, (EMBD, EMBD), 0.25, bid)   # scores of a few units: soft attention, every attended row counts
        add(tensor.ATTN_V, (EMBD, EMBD), 0.5, bid)
        add(tensor.ATTN_OUT, (EMBD, EMBD), 0.5, bid)
        add(tensor.FFN_NORM, (EMBD,), 0, bid)
        add(tensor.FFN_GATE, (FF, EMBD), 0.2, bid)
        add(tensor.FFN_UP, (FF, EMBD), 0.2, bid)
        add(tensor.FFN_DOWN, (EMBD, FF), 0.2, bid)
        if arch == "gemma2":
            add(tensor.ATTN_POST_NORM, (EMBD,), 0, bid)
            add(tensor.FFN_POST_NORM, (EMBD,), 0, bid)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


class _Llama:
    """The process's llama.cpp: the backend once, one loaded model per (architecture, layers, window)."""

    models: dict[tuple[str, int, int], Any] = {}
    folder: Optional[str] = None

    @classmethod
    def model(cls, arch: str, n_layers: int, window: int) -> Any:
        import llama_cpp as lc

        key = (arch, n_layers, window)
        if key not in cls.models:
            if cls.folder is None:
                lc.llama_backend_init()
                cls._quiet(lc)
                cls.folder = tempfile.mkdtemp(prefix="kvcache-llamacpp-")
            path = os.path.join(cls.folder, f"{arch}-{n_layers}-{window}.gguf")
            write_model(path, arch, n_layers, window)
            params = lc.llama_model_default_params()
            model = lc.llama_model_load_from_file(path.encode(), params)
            if not model:
                raise RuntimeError(f"llama.cpp did not load the model {path}")
            cls.models[key] = model
        return cls.models[key]

    @staticmethod
    def _quiet(lc: Any) -> None:
        """llama.cpp's log to stderr only from warnings up (the protocol channel is stdout anyway)."""
        def log(level: int, text: bytes, user_data: Any) -> None:
            if level in (3, 4) and text:   # GGML_LOG_LEVEL_WARN, _ERROR
                sys.stderr.write(text.decode("utf-8", "replace"))
        callback = lc.llama_log_callback(log)
        _Llama._log = callback   # type: ignore[attr-defined]   # kept alive: llama.cpp holds the pointer
        lc.llama_log_set(callback, ctypes.c_void_p(0))


# The preconditions llama.cpp's source states on caller errors (scope relaxation `requires=`, SPEC.md 6.1):
# every memory call asserts its ids in range (GGML_ASSERT in src/llama-kv-cache.cpp: seq_rm, seq_cp, seq_keep,
# seq_add), and without kv_unified a copy between two sequences' streams asserts a whole-sequence copy
# ("seq_cp() is only supported for full KV buffers").
EVERY_MODE_REQUIRES = "ids-in-range"
STREAMS_REQUIRE = "ids-in-range+whole-copies"


class LlamaCppCells:
    """One llama.cpp context as a cell cache seen through its outputs (the face of SPEC.md 5.3), in the
    library's default memory mode: a stream per sequence (kv_unified false), full-size sliding caches
    (swa_full true)."""

    kvcache_layout = "cell-recompute"
    kvcache_scope: tuple[str, ...] = ("flat", "ring", "seq-state", f"requires={STREAMS_REQUIRE}")
    kv_unified = False
    swa_full = True

    def __init__(self, config: dict[str, Any]) -> None:
        import llama_cpp as lc

        self.lc = lc
        sizes: list[Any] = [config.get(key) for key in ("capacity", "n_layers", "n_kv_heads", "head_dim", "v_head_dim",
                                             "batch_size")]
        layers = config.get("layers")
        if not all(_is_int(n) and n >= 1 for n in sizes) or config["batch_size"] != 1 \
                or not isinstance(layers, list) or len(layers) not in (1, sizes[1]) \
                or not all(isinstance(p, dict) and _is_int(p.get("window")) and p["window"] >= 0
                           and p.get("kind") == ("ring" if p["window"] else "flat") for p in layers):
            raise ValueError(f"[OP-CONFIG] {config}")
        capacity, n_layers = sizes[0], sizes[1]
        windows = [p["window"] for p in layers] * (n_layers // len(layers))
        arch = _architecture(windows)
        if arch is None or capacity % 256:
            raise ValueError(f"outside what llama.cpp builds exactly: layers {windows} (a llama model: flat only; "
                             f"gemma2: sliding on even layers, dense on odd ones), capacity {capacity} (n_ctx is "
                             f"padded to a multiple of 256)")
        self.n_layers, self.capacity = n_layers, capacity
        self.model = _Llama.model(arch, n_layers, windows[0])
        self.ctx = self._context(capacity, self.kv_unified)
        self.oracle: Any = None   # the recompute's context, made on first use
        self.batch = lc.llama_batch_init(capacity + 1, 0, 1)

    def _context(self, n_ctx: int, unified: bool) -> Any:
        lc = self.lc
        params = lc.llama_context_default_params()
        # not unified, llama.cpp splits n_ctx into one stream of n_ctx / n_seq_max cells per sequence
        params.n_ctx = n_ctx if unified else n_ctx * MAX_SEQS
        params.n_batch, params.n_ubatch = n_ctx, N_UBATCH
        params.n_seq_max, params.kv_unified, params.swa_full = MAX_SEQS, unified, self.swa_full
        params.n_threads = params.n_threads_batch = 1
        # K/V in F32 (llama.cpp's default is F16) and no flash attention (its CPU kernel rounds through F16):
        # a token's output computed in two batch compositions, or over cells in another order, then differs
        # by float32 rounding only - measured 1e-6, against CELL-RECOMPUTE's tolerance of 1e-3
        params.type_k = params.type_v = GGML_TYPE_F32
        params.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        ctx = lc.llama_init_from_model(self.model, params)
        if not ctx:
            raise RuntimeError("llama.cpp made no context")
        return ctx

    def __del__(self) -> None:
        lc = getattr(self, "lc", None)
        if lc is None:
            return
        for ctx in (getattr(self, "ctx", None), getattr(self, "oracle", None)):
            if ctx:
                lc.llama_free(ctx)
        if getattr(self, "batch", None) is not None:
            lc.llama_batch_free(self.batch)

    # --- the verbs: llama.cpp's memory API, as it is --------------------------------------------------
    def memory(self, ctx: Any = None) -> Any:
        return self.lc.llama_get_memory(ctx or self.ctx)

    def seq_cp(self, src: Any, dst: Any, upto: Any) -> bool:
        self.lc.llama_memory_seq_cp(self.memory(), src, dst, 0, -1 if upto is None else upto)
        return True   # void in llama.cpp

    def seq_rm(self, seq: Any, p0: Any, p1: Any) -> bool:
        return bool(self.lc.llama_memory_seq_rm(self.memory(), seq, p0, -1 if p1 is None else p1))

    def seq_keep(self, seq: Any) -> bool:
        self.lc.llama_memory_seq_keep(self.memory(), seq)
        return True   # void in llama.cpp

    def seq_add(self, seq: Any, p0: Any, p1: Any, delta: Any) -> bool:
        self.lc.llama_memory_seq_add(self.memory(), seq, p0, -1 if p1 is None else p1, delta)
        return True   # void in llama.cpp

    def next_pos(self, seq: Any) -> int:
        return int(self.lc.llama_memory_seq_pos_max(self.memory(), seq)) + 1

    def clear(self) -> None:
        self.lc.llama_memory_clear(self.memory(), True)

    # --- a sequence's state (CELL-STATE): llama.cpp's state calls, as they are ------------------------------
    def _state_file(self) -> str:
        return os.path.join(_Llama.folder or tempfile.gettempdir(), f"seq-state-{os.getpid()}.bin")

    def seq_save(self, seq: Any, file: Any) -> str:
        """The state of seq as base64: llama_state_seq_get_data (sized by llama_state_seq_get_size), or the file
        llama_state_seq_save_file writes (with no prompt tokens), read back."""
        lc = self.lc
        if file:
            path = self._state_file()
            if not lc.llama_state_seq_save_file(self.ctx, path.encode(), seq, (lc.llama_token * 1)(), 0):
                raise RuntimeError("llama_state_seq_save_file returned 0")
            with open(path, "rb") as handle:
                return base64.b64encode(handle.read()).decode()
        size = int(lc.llama_state_seq_get_size(self.ctx, seq))
        buffer = (ctypes.c_uint8 * size)()
        written = int(lc.llama_state_seq_get_data(self.ctx, buffer, size, seq))
        if written != size:
            raise RuntimeError(f"llama_state_seq_get_data wrote {written} bytes of {size}")
        return base64.b64encode(bytes(buffer)).decode()

    def seq_load(self, seq: Any, data: Any, file: Any) -> bool:
        """llama_state_seq_set_data of the bytes into seq, or llama_state_seq_load_file of them written to a file:
        0 ("Failed to load", include/llama.h) is False, a refusal."""
        lc = self.lc
        raw = base64.b64decode(data)
        if file:
            path = self._state_file()
            with open(path, "wb") as handle:
                handle.write(raw)
            count = ctypes.c_size_t(0)
            return bool(lc.llama_state_seq_load_file(self.ctx, path.encode(), seq, (lc.llama_token * 1)(), 1,
                                                     ctypes.byref(count)))
        buffer = (ctypes.c_uint8 * len(raw)).from_buffer_copy(raw)
        return bool(lc.llama_state_seq_set_data(self.ctx, buffer, len(raw), seq))

    def decode(self, seq_ids: Any, positions: Any, tokens: Any) -> Any:
        """llama_decode of one batch, logits for every token: 0 the outputs, 1 no free cells (False)."""
        if not isinstance(seq_ids, list) or not isinstance(positions, list) or not isinstance(tokens, list) \
                or not len(seq_ids) == len(positions) == len(tokens) or len(seq_ids) > self.capacity \
                or not all(_is_int(x) and -2**31 <= x < 2**31 for x in seq_ids + positions + tokens):
            raise ValueError("a batch needs one int32 id, position and token per token, at most n_ctx tokens")
        code = self._decode(self.ctx, seq_ids, positions, tokens, [True] * len(tokens))
        if code == 1:
            return False
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code}")
        return [self._logits(self.ctx, i) for i in range(len(tokens))]

    def _decode(self, ctx: Any, seq_ids: list[int], positions: list[int], tokens: list[int],
                outputs: list[bool]) -> int:
        batch = self.batch
        batch.n_tokens = len(tokens)
        for i, (seq, pos, token, out) in enumerate(zip(seq_ids, positions, tokens, outputs)):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, pos, 1, out
            batch.seq_id[i][0] = seq
        return int(self.lc.llama_decode(ctx, batch))

    def _logits(self, ctx: Any, i: int) -> list[float]:
        row = self.lc.llama_get_logits_ith(ctx, i)
        return [float(row[j]) for j in range(VOCAB)]

    def recompute(self, tokens: list[int], positions: list[int]) -> list[float]:
        """The last token's output over the others, decoded as one sequence into the cleared second context:
        the span before the last token with a filler at each gap, the fillers removed, then the last token
        (at the position after the span, so llama.cpp's consecutive positions hold). With more than one
        layer a gap cannot be recomputed this way (the rows after it would attend the fillers): refused."""
        if self.oracle is None:
            self.oracle = self._context(self.capacity, True)   # one sequence: one stream
        ctx, lc = self.oracle, self.lc
        lc.llama_memory_clear(self.memory(ctx), True)
        *rows, last = list(zip(positions, tokens))
        span = list(range(rows[0][0], last[0])) if rows else []
        held = dict(rows)
        gaps = [p for p in span if p not in held]
        if gaps and self.n_layers > 1:
            raise ValueError("a recompute over rows with gaps needs one layer (llama.cpp positions are consecutive)")
        if span:
            code = self._decode(ctx, [0] * len(span), span, [held.get(p, 0) for p in span], [False] * len(span))
            if code != 0:
                raise RuntimeError(f"llama_decode of the recompute's rows returned {code}")
            for p in gaps:
                lc.llama_memory_seq_rm(self.memory(ctx), 0, p, p + 1)
        code = self._decode(ctx, [0], [last[0]], [last[1]], [True])
        if code != 0:
            raise RuntimeError(f"llama_decode of the recompute's last token returned {code}")
        return self._logits(ctx, 0)


class Unified(LlamaCppCells):
    """kv_unified: one stream of n_ctx cells for every sequence; a fork shares cells (the ids asserted below
    LLAMA_MAX_SEQ, 256, in this mode: src/llama-kv-cache.cpp keeps 256 ids on the one stream)."""

    kvcache_scope = ("flat", "ring", "seq-state", f"requires={EVERY_MODE_REQUIRES}")
    kv_unified = True


class SwaSmall(LlamaCppCells):
    """swa_full false: each sliding layer's cache holds about its window (per sequence), not n_ctx cells."""

    swa_full = False


class UnifiedSwaSmall(Unified):
    """Both non-default modes: the one target this project ran before issue 41."""

    swa_full = False


# The targets by mode, the default first: `python -m kvcache_spec.conformance.cell.llamacpp [MODE]`.
MODES: dict[str, type[LlamaCppCells]] = {"default": LlamaCppCells, "unified": Unified, "swa_small": SwaSmall,
                                         "unified_swa_small": UnifiedSwaSmall}


ENTRY = "kvcache_spec.conformance.cell.llamacpp"   # the command's module (a thin entry to this one)


def main(argv: Optional[list[str]] = None) -> int:
    """Serve the target over the protocol (a crash of llama.cpp kills only this process)."""
    from ..._extras import exit_unless_installed
    from ..serve import USAGE, protocol_channel, serve
    exit_unless_installed("llamacpp", f"python -m {ENTRY}")
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1 or (args and args[0] not in MODES):
        print(f"usage: python -m {ENTRY} [{'|'.join(MODES)}]   (the library's defaults without a mode; {USAGE})",
              file=sys.stderr)
        return 2
    factory = MODES[args[0] if args else "default"].__name__
    return serve(f"python:{__name__}:{factory}", sys.stdin, protocol_channel())


if __name__ == "__main__":
    sys.exit(main())
