"""The executable model of the op face (`update_and_fetch`): small, brute force, layout-free.

The op face hands a cache one layer's K/V for a step and gets back a history and a mask semantic;
what matters is which tokens each query attends (OP-ATTEND). The model keeps exactly that and
nothing of any layout: the tokens each sequence holds, as {token uid: position}, and the step in
progress (its owners, positions, uids and the layers already served). A token written by a step is
held on every layer once every layer served the step; before that, only the layers served hold it,
and a step abandoned partway leaves nothing (OP-STEP).

Token uids are fresh for every token written and never reused, so a stale row can never pass for a
current one. A contiguous cache has one sequence (id 0); a cell cache's ids are the caller's.

Every call answers a `Rejected` (a caller error: nothing changes, OP-ATOMIC) or applies its effect.
`Rejected.feature` names the part of the op face a rejection (or an abandoned step) needs a target to
implement - `positions` (the contiguous cache reads `position`) and `steps` (a contiguous forward is
one step across layers) - so a target whose declared scope leaves that part out is not judged on it.

This module does not import `kvcache`: the model and the reference are independent.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional, Sequence, Union

MAX_POSITION = 2**31 - 2          # OP-POS: no position is a -1 marker, a next position fits a C++ int
MAX_SEQS = 63                     # OP-STEP: ids in [0, 63) (bit 63 of an int64 owner word is its sign)
CONTIGUOUS, CELL = "contiguous", "cell"


@dataclass(frozen=True)
class Rejected:
    """The spec refuses the call: `rule` is the rule id, `why` what is at fault."""

    rule: str
    why: str
    feature: str = ""   # the scope feature a target needs for this refusal to be its business ('' = every target)
    case: str = ""      # a short name of what is wrong (tells two causes under one rule apart)


@dataclass(frozen=True)
class OpConfig:
    kind: str                      # CONTIGUOUS or CELL
    n_layers: int
    windows: tuple[int, ...]       # per layer: 0 = flat, w >= 1 = the newest w positions
    n_kv_heads: int
    head_dim: int
    v_head_dim: int
    capacity: int
    batch_size: int
    max_write: Optional[int] = None   # OP-MAX-WRITE: the most tokens a step writes (with a ring layer); None = no bound
    keeps: tuple[int, ...] = ()       # OP-SINKS: per layer, the sink positions a ring layer keeps (empty = none)
    bounded: bool = True   # OP-CAP binds; False for a target declaring `unbounded` (SPEC.md 6.1): capacity a hint
    chunks: tuple[int, ...] = ()      # OP-CHUNK: per layer, a chunk layer's chunk size (0 = not chunked; empty = none)
    record_past: bool = False         # OP-RECORD: ring layers keep their past until a trim

    def keep(self, layer: int) -> int:
        return self.keeps[layer] if self.keeps else 0

    def chunk(self, layer: int) -> int:
        return self.chunks[layer] if self.chunks else 0

    def chunk_start(self, layer: int, position: int) -> int:
        """OP-CHUNK: the first position of the chunk holding `position` on a chunk layer (0 on any other)."""
        size = self.chunk(layer)
        return position - position % size if size else 0

    def retained(self, layer: int) -> int:
        """OP-TRIM: the newest positions beside its sinks a ring layer retains at least (its floor's lag)."""
        return self.windows[layer] - self.keep(layer) - 1 + (self.max_write or 0)


def _is_int(value: Any) -> bool:
    return type(value) is int


def make_config(cfg: dict[str, Any], kind: str) -> Union[OpConfig, Rejected]:
    """The model's reading of a JSON op config (OP-CONFIG, OP-BATCH)."""
    try:
        sizes = {name: cfg[name] for name in ("capacity", "n_layers", "n_kv_heads", "head_dim", "batch_size")}
        sizes["v_head_dim"] = cfg.get("v_head_dim", cfg["head_dim"])
        layers = cfg["layers"]
    except (KeyError, TypeError):
        return Rejected("OP-CONFIG", "a config field is missing")
    for name, value in sizes.items():
        if not _is_int(value) or value < 1:
            return Rejected("OP-CONFIG", f"{name} must be an int >= 1, got {value!r}")
    if not isinstance(layers, list) or len(layers) not in (1, sizes["n_layers"]):
        return Rejected("OP-CONFIG", "layers must be one policy, or one per layer")
    windows: list[int] = []
    keeps: list[int] = []
    chunks: list[int] = []
    for entry in layers:
        if not isinstance(entry, dict):
            return Rejected("OP-CONFIG", f"a layer policy is {entry!r}")
        window = entry.get("window")
        if not isinstance(window, int) or not _is_int(window) or (entry.get("kind") in ("flat", "chunk") and window != 0) \
                or (entry.get("kind") == "ring" and window < 1) or entry.get("kind") not in ("flat", "ring", "chunk"):
            return Rejected("OP-CONFIG", f"layer policy {entry!r} is not flat (window 0), ring (window >= 1) or chunk "
                                         "(window 0)")
        windows.append(window)
        chunk = entry.get("chunk", 0)
        if not _is_int(chunk) or (chunk < 1 if entry.get("kind") == "chunk" else chunk != 0) or (chunk and kind == CELL):
            # OP-CHUNK: a chunk of 0 holds no query; a chunk on another kind of layer has no meaning
            return Rejected("OP-CONFIG", f"layer policy {entry!r}: chunk must be an int >= 1 on a chunk layer (absent "
                                         "on another; the cell cache has none)", case="chunk")
        chunks.append(chunk)
        keep = entry.get("keep", 0)
        if not _is_int(keep) or not 0 <= keep < max(window, 1) or (keep and kind == CELL):
            # OP-SINKS: keep >= window leaves no position for the window part; the cell cache has no sinks
            return Rejected("OP-CONFIG", f"layer policy {entry!r}: keep must be an int in [0, window) on a ring "
                                         "layer (0 on a flat one)", case="keep")
        keeps.append(keep)
    if kind == CELL and sizes["batch_size"] != 1:
        return Rejected("OP-BATCH", "a cell cache needs batch_size 1")
    if cfg.get("sizing", "dynamic") not in ("dynamic", "static"):
        return Rejected("OP-CONFIG", f"sizing {cfg.get('sizing')!r}")
    max_write = cfg.get("max_write")
    if max_write is not None and (not _is_int(max_write) or max_write < 1):
        return Rejected("OP-CONFIG", f"max_write must be null or an int >= 1, got {max_write!r}")
    record_past = cfg.get("record_past", False)
    if type(record_past) is not bool or (record_past and kind == CELL):
        return Rejected("OP-CONFIG", f"record_past must be true or false (false on a cell cache), got {record_past!r}",
                        case="record_past")
    n_layers = sizes["n_layers"]
    windows = windows * n_layers if len(windows) == 1 else windows
    keeps = keeps * n_layers if len(keeps) == 1 else keeps
    chunks = chunks * n_layers if len(chunks) == 1 else chunks
    return OpConfig(kind, n_layers, tuple(windows), sizes["n_kv_heads"], sizes["head_dim"], sizes["v_head_dim"],
                    sizes["capacity"], sizes["batch_size"],
                    max_write if kind == CONTIGUOUS and any(windows) else None,   # cells have no rings to bound
                    tuple(keeps) if any(keeps) else (), chunks=tuple(chunks) if any(chunks) else (),
                    record_past=record_past)


@dataclass
class Step:
    """The step in progress: declared owners; positions and uids once the first layer is served."""

    seqs: tuple[int, ...]
    positions: Optional[tuple[int, ...]] = None
    uids: tuple[int, ...] = ()
    served: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class Shapes:
    """What a fetch was handed: k [B, H, q, D], v [B, H, q, Dv], position [q, 1] (as shape tuples)."""

    k: tuple[int, ...]
    v: tuple[int, ...]
    position: tuple[int, ...]
    kinds: tuple[str, str, str] = ("f", "f", "i")   # k, v, position: floating, floating, integer (numpy's kind)


Attends = list[list[int]]   # per query of the step: the sorted uids it must attend
Label = tuple[int, int]     # OP-ROWS: what a batch row holds for a token: (the uid written, the batch row it was written for)
RowAttends = list[list[Optional[list[Label]]]]   # per batch row, per query: its labels, None for a pad query (OP-PAD)

# OP-STATE: the forms a state is loaded in - as state() gave it, or broken as the rule says a load must refuse
WHOLE = "whole"
STATE_FORMS: dict[str, str] = {
    "truncated": "cut short",
    "flipped": "one byte changed",
    "foreign-config": "taken under another config",
    "foreign-version": "written in another format version",
}


# OP-QUANTIZE: the bits a quantize(bits) takes, and the error it may leave in an element of a row written
QUANTIZE_BITS = range(2, 9)


def quantize_bound(bits: int, low: float, high: float) -> float:
    """OP-QUANTIZE: how far an element of a row whose written values span [low, high] may read back after a
    quantize(bits): half a step of 2^bits - 1 steps over the row's range (float32 rounding aside)."""
    return (high - low) / (2 * ((1 << bits) - 1))


@dataclass(frozen=True)
class SavedState:
    """OP-STATE: a state as the model knows one: the config it was taken under, the model as it stood then with
    no step open, and the form it is loaded in (WHOLE, or a key of STATE_FORMS). The bytes are the target's."""

    cfg: OpConfig
    held: "OpModel"
    form: str = WHOLE


class OpModel:
    """One cache's op-face state. Every verb returns a Rejected (nothing changed) or its answer."""

    def __init__(self, cfg: OpConfig) -> None:
        self.cfg = cfg
        self.held: dict[int, dict[int, int]] = {}   # seq -> {uid: position}: tokens on every layer
        self.step: Optional[Step] = None
        self.dropped_declaration = False   # the last verb dropped a declaration no layer had used
        self.abandoned = 0   # steps abandoned partway (a target without the `steps` feature is not judged past one)
        # OP-TRIM: per layer, the floor F: a ring layer may have dropped its positions below F (its sinks aside)
        self.floors = [0] * cfg.n_layers
        # OP-RECORD: the floors the rings would have if the config did not record its past (a trim owed only
        # because it does is the recording's: the suite names OP-RECORD when such a trim is refused)
        self.unrecorded = [0] * cfg.n_layers
        # OP-PAD: per batch row, the positions below which it holds pads; OP-ROWS: per batch row, the label it
        # holds for each held token (uid -> (uid, row written for)); absent = the token itself, for this row
        self.pads: list[int] = [0] * cfg.batch_size
        self.row_labels: list[dict[int, Label]] = [{} for _ in range(cfg.batch_size)]
        self.rows_moved = False   # a batch verb moved rows since the last reset (a finding then names OP-ROWS)
        self.bits: Optional[int] = None   # OP-QUANTIZE: the bits the cache was quantized to (None: exact)

    def snapshot(self) -> "OpModel":
        """A copy of the state (a call refused that the model served is followed from the state before it)."""
        copy = OpModel(self.cfg)
        copy.held = {seq: dict(tokens) for seq, tokens in self.held.items()}
        copy.step = None if self.step is None else replace(self.step, served=set(self.step.served))
        copy.dropped_declaration, copy.abandoned = self.dropped_declaration, self.abandoned
        copy.floors, copy.unrecorded = list(self.floors), list(self.unrecorded)
        copy.pads, copy.row_labels = list(self.pads), [dict(labels) for labels in self.row_labels]
        copy.rows_moved, copy.bits = self.rows_moved, self.bits
        return copy

    # --- observations ------------------------------------------------------------------------------
    def seq_len(self, seq: int) -> int:
        pending = self.step.seqs.count(seq) if self.step and self.step.positions is not None else 0
        return len(self.held.get(seq, {})) + pending

    def used(self, layer: int) -> int:
        """Contiguous: the rows layer `layer` holds (the pending step counts on the layers it served)."""
        pending = len(self.step.seqs) if self.step and layer in self.step.served else 0
        return len(self.held.get(0, {})) + pending

    def live_uids(self) -> set[int]:
        uids = {uid for tokens in self.held.values() for uid in tokens}
        if self.step is not None:
            uids |= set(self.step.uids)
        return uids

    def free_cells(self) -> int:
        """Cells no token holds; mid-step the open step's placed tokens hold theirs."""
        return self.cfg.capacity - len(self.live_uids())

    def can_extend(self, n: int) -> bool:
        """Cell (OP-CAP): whether begin_step of n tokens is admitted now - the open step's tokens, which
        begin_step abandons, count as free."""
        pending = len(self.step.uids) if self.step is not None else 0
        return n <= self.free_cells() + pending

    def seqs_in_play(self) -> list[int]:
        seqs = set(self.held) | (set(self.step.seqs) if self.step else set())
        return sorted(seqs)

    # --- the step's end ----------------------------------------------------------------------------
    def _abandon(self) -> None:
        """OP-STEP: a step not every layer served leaves nothing behind."""
        if self.step is not None and self.step.served:
            self.abandoned += 1
        self.step = None

    def _commit(self) -> None:
        assert self.step is not None and self.step.positions is not None
        for seq, pos, uid in zip(self.step.seqs, self.step.positions, self.step.uids):
            self.held.setdefault(seq, {})[uid] = pos
        self.step = None

    # --- state out and in (OP-STATE) ---------------------------------------------------------------
    def state(self) -> SavedState:
        """What the cache holds with the open step left out (the step stays open here)."""
        held = self.snapshot()
        held.step = None
        return SavedState(self.cfg, held)

    def load_state(self, saved: SavedState) -> Optional[Rejected]:
        """Everything replaced by the saved state (an open step abandoned), or a Rejected for a state not whole or
        of another config (nothing changes)."""
        if saved.form != WHOLE:
            return Rejected("OP-STATE", f"the state is {STATE_FORMS[saved.form]}", case=f"state {saved.form}")
        if saved.cfg != self.cfg:
            return Rejected("OP-STATE", "the state was taken under another config", case="state foreign-config")
        self._abandon()
        self.held = {seq: dict(tokens) for seq, tokens in saved.held.held.items()}
        self.floors, self.unrecorded = list(saved.held.floors), list(saved.held.unrecorded)
        # OP-PAD, OP-ROWS: each batch row's pads and what it holds are the state's too (rows moved before the save)
        self.pads, self.row_labels = list(saved.held.pads), [dict(labels) for labels in saved.held.row_labels]
        self.rows_moved = saved.held.rows_moved
        return None

    # --- verbs -------------------------------------------------------------------------------------
    def reset(self) -> None:
        self.held, self.step, self.dropped_declaration = {}, None, False
        self.floors = [0] * self.cfg.n_layers
        self.unrecorded = [0] * self.cfg.n_layers
        self.pads = [0] * self.cfg.batch_size   # OP-PAD: a reset forgets the padding with the tokens
        self.row_labels = [{} for _ in range(self.cfg.batch_size)]
        self.rows_moved = False

    def trim_answer(self, n: Any) -> Union[Rejected, str]:
        """OP-TRIM's ordered procedure (the first check that applies decides), asked before trim(n): a Rejected
        for an n that is no int (bool included), negative, or above the tokens held before an open step (which
        the trim abandons first); else "owed" when n == 0 (the state a new step at L leaves, owed by OP-STEP)
        or every layer of the least size still holds what the next query attends (`_keeps_for`), else
        "optional": a layer may have dropped rows, so the target serves it (judged by its later answers) or
        refuses it."""
        if not _is_int(n):
            return Rejected("OP-TRIM", f"n {n!r} is not an int", case="n type")
        held = len(self.held.get(0, {}))
        if not 0 <= n <= held:
            return Rejected("OP-TRIM", f"n {n} is not in [0, {held}]: the tokens held",
                            case="n negative" if n < 0 else "n above held")
        end = held - n
        if n == 0 or all(self._keeps_for(layer, floor, end) for layer, floor in enumerate(self.floors)):
            return "owed"
        return "optional"

    def _keeps_for(self, layer: int, floor: int, end: int) -> bool:
        """OP-TRIM, OP-CHUNK, OP-RECORD: whether a layer of the least size, its floor `floor`, still holds every
        position the query at `end` attends: a ring while nothing is dropped (floor <= keep), or, recording its
        past, while the positions beside its sinks that query reads are >= floor; a chunk layer while that query's
        chunk starts at or above its floor; a flat layer always."""
        cfg = self.cfg
        window, keep = cfg.windows[layer], cfg.keep(layer)
        if window:
            return floor <= keep or (cfg.record_past and end - (window - keep - 1) >= floor)
        return cfg.chunk_start(layer, end) >= floor

    def trim_owed(self, n: Any) -> bool:
        return self.trim_answer(n) == "owed"

    def trim(self, n: Any) -> Optional[Rejected]:
        """Contiguous: drop the newest n tokens of every layer (OP-TRIM), an open step abandoned first (OP-STEP).
        Refused only for an n `trim_answer` refuses; an optional trim a target refused is followed from a
        snapshot taken before it (the target keeps its state)."""
        answer = self.trim_answer(n)
        if isinstance(answer, Rejected):
            return answer
        end = len(self.held.get(0, {})) - n
        self._abandon()
        self.held = {0: {uid: pos for uid, pos in self.held.get(0, {}).items() if pos < end}} if end else {}
        # a recording ring gives its past up at a trim (transformers' crop): it keeps the w - k - 1 positions
        # the next query reads beside its sinks and itself
        self.floors = [max(min(floor, end), end - (self.cfg.windows[l] - self.cfg.keep(l) - 1))
                       if self.cfg.windows[l] and self.cfg.record_past else min(floor, end)
                       for l, floor in enumerate(self.floors)]
        self.unrecorded = [min(floor, end) for floor in self.unrecorded]
        return None

    def quantize(self, bits: Any) -> Optional[Rejected]:
        """Contiguous (OP-QUANTIZE): every token held, and every one written later, is held within
        quantize_bound(bits, ...) of what was written; positions and lengths stay, an open step is abandoned first
        (OP-STEP). A bits that is no int in QUANTIZE_BITS, or a second quantize, is refused (nothing changes)."""
        if self.cfg.kind != CONTIGUOUS:
            return Rejected("OP-QUANTIZE", "the cell cache has no quantize", case="cell")
        if not _is_int(bits):
            return Rejected("OP-QUANTIZE", f"bits {bits!r} is not an int", case="bits type")
        if bits not in QUANTIZE_BITS:
            return Rejected("OP-QUANTIZE", f"bits {bits} is not in [{QUANTIZE_BITS[0]}, {QUANTIZE_BITS[-1]}]",
                            case="bits range")
        if self.bits is not None:
            return Rejected("OP-QUANTIZE", f"the cache is quantized already (to {self.bits} bits)", case="twice")
        self._abandon()
        self.bits = bits
        return None

    def begin_step(self, seq_ids: Any) -> Optional[Rejected]:
        """Cell: declare the owner of each token of the next forward (OP-STEP, OP-CAP)."""
        if not isinstance(seq_ids, list) or not seq_ids:
            return Rejected("OP-STEP", "begin_step needs at least one token")
        for seq in seq_ids:
            if not _is_int(seq) or not 0 <= seq < MAX_SEQS:
                return Rejected("OP-STEP", f"seq id {seq!r} is not an int in [0, {MAX_SEQS})")
        if not self.can_extend(len(seq_ids)):   # the open step's tokens, abandoned by this declaration, count
            return Rejected("OP-CAP", f"{len(seq_ids)} tokens, {self.free_cells()} free cells and "
                                      f"{len(self.step.uids) if self.step else 0} of the open step")
        self._abandon()
        self.step = Step(tuple(seq_ids))
        self.dropped_declaration = False
        return None

    def seq_cp(self, src: Any, dst: Any, upto: Any = None) -> Optional[Rejected]:
        for name, seq in (("src", src), ("dst", dst)):
            if not _is_int(seq) or not 0 <= seq < MAX_SEQS:
                return Rejected("OP-FORK", f"{name} {seq!r} is not an int in [0, {MAX_SEQS})")
        if upto is not None and (not _is_int(upto) or upto < 0):
            return Rejected("OP-FORK", f"upto {upto!r} is not None or an int >= 0")
        if src == dst:
            return Rejected("OP-FORK", "src == dst")
        # judged after the abandonment this verb causes (as begin_step's admission is): a stopped step's
        # tokens are gone the moment a verb is called, so they do not make dst live
        if self.held.get(dst):
            return Rejected("OP-FORK", f"dst {dst} holds {len(self.held[dst])} tokens: a fork needs an empty "
                                       "destination")
        self._abandon_started()
        shared = {uid: pos for uid, pos in self.held.get(src, {}).items() if upto is None or pos < upto}
        if shared:
            self.held[dst] = shared
        return None

    def seq_rm(self, seq: Any, p0: Any = 0, p1: Any = None) -> Optional[Rejected]:
        if not _is_int(seq) or not 0 <= seq < MAX_SEQS:
            return Rejected("OP-RM", f"seq {seq!r} is not an int in [0, {MAX_SEQS})")
        if not _is_int(p0) or p0 < 0:
            return Rejected("OP-RM", f"p0 {p0!r} is not an int >= 0")
        if p1 is not None and (not _is_int(p1) or p1 < p0):
            return Rejected("OP-RM", f"p1 {p1!r} is not None or an int >= p0")
        self._abandon_started()
        kept = {uid: pos for uid, pos in self.held.get(seq, {}).items() if not (pos >= p0 and (p1 is None or pos < p1))}
        self.held.pop(seq, None)
        if kept:
            self.held[seq] = kept
        return None

    # --- llama.cpp's further verbs, on the face of a cell cache seen through its outputs (SPEC.md 5.3) ---
    def seq_keep(self, seq: Any) -> Optional[Rejected]:
        """CELL-KEEP: every other sequence's tokens are gone; seq keeps its own (shared ones too)."""
        if not _is_int(seq) or not 0 <= seq < MAX_SEQS:
            return Rejected("CELL-KEEP", f"seq {seq!r} is not an int in [0, {MAX_SEQS})")
        self._abandon_started()
        self.held = {seq: self.held[seq]} if self.held.get(seq) else {}
        return None

    def seq_add(self, seq: Any, p0: Any, p1: Any, delta: Any) -> Optional[Rejected]:
        """CELL-SHIFT: seq's tokens at positions in [p0, p1) move by delta, for seq only (a sequence sharing one
        keeps it where it was); refused when a moved position leaves [0, MAX_POSITION] or meets one seq holds."""
        if not _is_int(seq) or not 0 <= seq < MAX_SEQS:
            return Rejected("CELL-SHIFT", f"seq {seq!r} is not an int in [0, {MAX_SEQS})")
        if not _is_int(p0) or p0 < 0 or p1 is not None and (not _is_int(p1) or p1 < p0) or not _is_int(delta):
            return Rejected("CELL-SHIFT", f"p0 {p0!r}, p1 {p1!r}, delta {delta!r}: not p0 >= 0, p1 None or >= p0, "
                                          "delta an int")
        tokens = self.held.get(seq, {})
        moved = {uid: pos + delta for uid, pos in tokens.items() if pos >= p0 and (p1 is None or pos < p1)}
        if any(not 0 <= pos <= MAX_POSITION for pos in moved.values()):
            return Rejected("CELL-SHIFT", f"a position moved by {delta} leaves [0, {MAX_POSITION}]")
        after = {**tokens, **moved}
        if len(set(after.values())) != len(after):
            return Rejected("CELL-SHIFT", f"a position moved by {delta} meets one sequence {seq} holds")
        self._abandon_started()
        if after:
            self.held[seq] = after
        return None

    def seq_load(self, seq: Any, rows: Sequence[tuple[int, int]], first_uid: int) -> Optional[Rejected]:
        """CELL-STATE: seq holds exactly the saved rows ((uid, position) pairs, as seq_save found them) in new
        cells - uids first_uid, first_uid + 1, ... - and nothing it held before; OP-CAP when the free cells, seq's
        own counted free, are too few (nothing changed)."""
        if not _is_int(seq) or not 0 <= seq < MAX_SEQS:
            return Rejected("CELL-STATE", f"seq {seq!r} is not an int in [0, {MAX_SEQS})")
        own = self.held.pop(seq, {})
        if self.free_cells() < len(rows):
            if own:
                self.held[seq] = own
            return Rejected("OP-CAP", f"{len(rows)} rows, {self.free_cells()} free cells")
        self._abandon_started()
        if rows:
            self.held[seq] = {first_uid + i: pos for i, (_, pos) in enumerate(rows)}
        return None

    def _abandon_started(self) -> None:
        """A verb abandons the step in progress (OP-STEP): served partway, or only declared - a declaration
        no layer has used is a step not every layer served too. Dropping a bare declaration is the
        `declarations` feature (upstream's cell cache deliberately keeps it), so the refusal it causes
        later is marked with that feature."""
        if self.step is not None:
            self.dropped_declaration = not self.step.served
            self._abandon()

    def fetch(self, layer: Any, shapes: Shapes, positions: Sequence[Any],
              uids: Sequence[int]) -> Union[Rejected, Attends]:
        """update_and_fetch: the uids each query of the step must attend on `layer`, or a Rejected.
        `uids` name the step's tokens when this call begins the step (the caller labels K/V with them)."""
        cfg = self.cfg
        if not _is_int(layer) or not 0 <= layer < cfg.n_layers:
            return Rejected("OP-ARGS", f"layer_id {layer!r} is not an int in [0, {cfg.n_layers})", case="layer_id")
        for name, kind, wanted, rank, shape in (("k", shapes.kinds[0], "f", 4, shapes.k),
                                                ("v", shapes.kinds[1], "f", 4, shapes.v),
                                                ("position", shapes.kinds[2], "i", 2, shapes.position)):
            if kind != wanted or len(shape) != rank:
                what = "floating-point" if wanted == "f" else "integer"
                return Rejected("OP-ARGS", f"{name} must be a {what} tensor of {rank} dimensions, got kind {kind!r} "
                                           f"shape {list(shape)}", "positions" if name == "position" and
                                cfg.kind == CONTIGUOUS else "", case=f"{name} {'dtype' if kind != wanted else 'rank'}")
        # the step's q_len: the token count two of k, v and position agree on (else k's), so the case names
        # the argument that disagrees (k's q_len one too many is not v's)
        counts = [shapes.k[2], shapes.v[2], shapes.position[0]]
        q = next((count for count in counts if counts.count(count) >= 2), shapes.k[2])
        want_k = (cfg.batch_size, cfg.n_kv_heads, q, cfg.head_dim)
        want_v = (cfg.batch_size, cfg.n_kv_heads, q, cfg.v_head_dim)
        for name, shape, want in (("k", shapes.k, want_k), ("v", shapes.v, want_v)):
            if shape != want:
                wrong = next(dim for dim, got, size in zip(("batch", "heads", "q_len", "width"), shape, want)
                             if got != size)
                return Rejected("OP-ARGS", f"k {list(shapes.k)} / v {list(shapes.v)} are not {list(want_k)} / "
                                           f"{list(want_v)}", case=f"{name} {wrong}")
        if shapes.position != (q, 1):
            # a contiguous cache may leave `position` unread (the `positions` feature)
            return Rejected("OP-ARGS", f"position has shape {list(shapes.position)}, not [q_len, 1] = [{q}, 1]",
                            "positions" if cfg.kind == CONTIGUOUS else "",
                            case="position q_len" if shapes.position[0] != q else "position cols")
        if q < 1:
            return Rejected("OP-ARGS", "q_len must be >= 1", case="q_len 0")
        for pos in positions:
            if not _is_int(pos) or not 0 <= pos <= MAX_POSITION:
                return Rejected("OP-POS", f"position {pos!r} is not an int in [0, {MAX_POSITION}]", "positions",
                                case="position range")
        if cfg.kind == CELL:
            return self._fetch_cell(layer, tuple(positions), tuple(uids))
        return self._fetch_contiguous(layer, tuple(positions), tuple(uids))

    def _fetch_cell(self, layer: int, positions: tuple[int, ...], uids: tuple[int, ...]) -> Union[Rejected, Attends]:
        step = self.step
        if step is None:
            return Rejected("OP-STEP", "no step declared: begin_step must precede every forward",
                            "declarations" if self.dropped_declaration else "", case="no step")
        if layer in step.served:
            return Rejected("OP-STEP", f"layer {layer} served twice in one step")
        if step.positions is not None:
            if positions != step.positions:
                return Rejected("OP-STEP", f"positions {list(positions)} differ from the step's {list(step.positions)}")
        else:
            if len(positions) != len(step.seqs):
                return Rejected("OP-STEP", f"{len(positions)} positions for {len(step.seqs)} declared tokens")
            bad = self._bad_order(step.seqs, positions)
            if bad is not None:
                return bad
        return self._serve(layer, positions, uids)

    def _bad_order(self, seqs: tuple[int, ...], positions: tuple[int, ...]) -> Optional[Rejected]:
        """OP-POS: within the step each sequence's positions increase, and all are newer than it holds."""
        newest = {seq: max(self.held.get(seq, {}).values(), default=-1) for seq in set(seqs)}
        for seq, pos in zip(seqs, positions):
            if pos <= newest[seq]:
                return Rejected("OP-POS", f"sequence {seq} already holds position {newest[seq]} >= {pos}: "
                                          "a re-placed or older position", "positions")
            newest[seq] = pos
        return None

    def _fetch_contiguous(self, layer: int, positions: tuple[int, ...],
                          uids: tuple[int, ...]) -> Union[Rejected, Attends]:
        step = self.step
        continuing = step is not None and layer not in step.served
        if continuing:
            assert step is not None
            if len(positions) != len(step.seqs):   # a cache of independent per-layer histories serves it
                return Rejected("OP-STEP", f"{len(positions)} tokens on layer {layer}, the step has "
                                           f"{len(step.seqs)}", "steps")
            if positions != step.positions:
                return Rejected("OP-STEP", f"positions {list(positions)} differ from the step's "
                                           f"{list(step.positions or ())}", "positions")
            return self._serve(layer, positions, uids)
        held = len(self.held.get(0, {}))
        if positions != tuple(range(held, held + len(positions))):
            return Rejected("OP-POS", f"positions {list(positions)} do not continue the history of {held} tokens",
                            "positions")
        if self.cfg.bounded and held + len(positions) > self.cfg.capacity:
            return Rejected("OP-CAP", f"{held} + {len(positions)} tokens exceed capacity {self.cfg.capacity}")
        if self.cfg.max_write is not None and len(positions) > self.cfg.max_write:
            return Rejected("OP-MAX-WRITE", f"a step of {len(positions)} tokens, max_write {self.cfg.max_write}")
        self._abandon()
        self.step = Step((0,) * len(positions))
        # OP-TRIM: a step begun moves every ring layer's floor, served or not: a cache may map the step's
        # positions to ring slots once for every layer (a shared slot map), freeing them before it writes
        # (a recording ring keeps its past until a trim, OP-RECORD); a chunk layer may drop what lies below the
        # chunk of the step's first query (OP-CHUNK)
        end = positions[-1] + 1
        self.floors = [max(floor, end - self.cfg.retained(l)) if self.cfg.windows[l] and not self.cfg.record_past
                       else max(floor, self.cfg.chunk_start(l, positions[0])) for l, floor in enumerate(self.floors)]
        self.unrecorded = [max(floor, end - self.cfg.retained(l)) if self.cfg.windows[l] else floor
                           for l, floor in enumerate(self.unrecorded)]
        return self._serve(layer, positions, uids)

    def _serve(self, layer: int, positions: tuple[int, ...], uids: tuple[int, ...]) -> Attends:
        step = self.step
        assert step is not None
        if step.positions is None:
            step.positions = positions
            step.uids = uids[:len(positions)]
        step.served.add(layer)
        window, keep = self.cfg.windows[layer], self.cfg.keep(layer)
        attends: Attends = []
        for seq, pos in zip(step.seqs, positions):
            # OP-ATTEND, OP-SINKS: the window's newest w - k positions, and the first k; OP-CHUNK: its own chunk
            start = self.cfg.chunk_start(layer, pos)
            seen = [uid for uid, q in self.held.get(seq, {}).items()
                    if start <= q <= pos and (window == 0 or q < keep or q > pos - (window - keep))]
            seen += [uid for s, q, uid in zip(step.seqs, positions, step.uids)
                     if s == seq and start <= q <= pos and (window == 0 or q < keep or q > pos - (window - keep))]
            attends.append(sorted(seen))
        if len(step.served) == self.cfg.n_layers:
            self._commit()
        return attends

    # --- rows of a batch that differ, and the batch verbs (OP-PAD, OP-ROWS) ---------------------------
    def label(self, row: int, uid: int) -> Label:
        """OP-ROWS: what batch row `row` holds for token `uid` (a token written since the last verb: its own)."""
        return self.row_labels[row].get(uid, (uid, row))

    def row_attends(self, attends: Attends, positions: Sequence[int]) -> RowAttends:
        """OP-PAD, OP-ROWS: per batch row, the labels each query of a served step attends - the step's shared
        `attends` without the row's pads, each token as the row holds it; a pad query's entry None (not judged)."""
        where = dict(self.held.get(0, {}))
        if self.step is not None:   # the step still open: its tokens are not held yet
            where.update(zip(self.step.uids, self.step.positions or ()))
        out: RowAttends = []
        for row, pad in enumerate(self.pads):
            out.append([None if pos < pad else [self.label(row, uid) for uid in uids if where.get(uid, pad) >= pad]
                        for pos, uids in zip(positions, attends)])
        return out

    def _batch_free(self, verb: str) -> Optional[Rejected]:
        if self.cfg.kind != CONTIGUOUS:
            return Rejected("OP-ROWS", f"{verb}: the cell cache has one batch row (OP-BATCH)", case="cell")
        return None

    def pad(self, left_padding: Any) -> Optional[Rejected]:
        """OP-PAD: on a cache that holds nothing, batch row b's first left_padding[b] positions become pads."""
        wrong = self._batch_free("pad")
        if wrong is not None:
            return Rejected("OP-PAD", wrong.why, case="cell")
        if not isinstance(left_padding, list) or len(left_padding) != self.cfg.batch_size:
            return Rejected("OP-PAD", f"left_padding {left_padding!r} is not a list of {self.cfg.batch_size} ints "
                                      "(one per batch row)", case="length")
        for pad in left_padding:
            if not _is_int(pad) or not 0 <= pad <= self.cfg.capacity:
                return Rejected("OP-PAD", f"a pad {pad!r} is not an int in [0, capacity {self.cfg.capacity}]",
                                case="pad type" if not _is_int(pad) else "pad range")
        if self.held.get(0) or self.step is not None:
            return Rejected("OP-PAD", "padding is declared before the first step (the cache holds tokens)",
                            case="not empty")
        self.pads = list(left_padding)
        return None

    def _rows_error(self, verb: str, rows: Any, *, distinct: bool, length: Optional[int]) -> Optional[Rejected]:
        """OP-ROWS: a list of batch-row indices, each an int (not a bool) in [0, batch), not empty; distinct
        where the verb keeps each row at most once; exactly `length` of them where the batch keeps its size."""
        wrong = self._batch_free(verb)
        if wrong is not None:
            return wrong
        batch = self.cfg.batch_size
        if not isinstance(rows, list) or not rows:
            return Rejected("OP-ROWS", f"{verb}: rows {rows!r} is not a non-empty list (an empty batch)", case="empty")
        for row in rows:
            if not _is_int(row):
                return Rejected("OP-ROWS", f"{verb}: row {row!r} is not an int", case="row type")
            if not 0 <= row < batch:
                return Rejected("OP-ROWS", f"{verb}: row {row} is not in [0, {batch})", case="row range")
        if length is not None and len(rows) != length:
            return Rejected("OP-ROWS", f"{verb}: {len(rows)} rows for a batch of {length}", case="length")
        if distinct and len(set(rows)) != len(rows):
            return Rejected("OP-ROWS", f"{verb}: rows {rows} repeat a row", case="repeat")
        return None

    def _take(self, rows: list[int]) -> None:
        """The batch becomes the rows named, in that order (an open step abandoned first: OP-STEP)."""
        self._abandon_started()
        self.pads = [self.pads[row] for row in rows]
        self.row_labels = [{uid: self.label(row, uid) for uid in self.held.get(0, {})} for row in rows]
        self.cfg = replace(self.cfg, batch_size=len(rows))
        self.rows_moved = True

    def select(self, rows: Any) -> Optional[Rejected]:
        """OP-ROWS: keep the rows named, in that order, each at most once (mlx-lm's filter, transformers'
        batch_select_indices)."""
        wrong = self._rows_error("select", rows, distinct=True, length=None)
        if wrong is None:
            self._take(rows)
        return wrong

    def reorder(self, rows: Any) -> Optional[Rejected]:
        """OP-ROWS: batch row b becomes row rows[b] (beam search's beam_idx: repeats allowed, the size kept)."""
        wrong = self._rows_error("reorder", rows, distinct=False, length=self.cfg.batch_size)
        if wrong is None:
            self._take(rows)
        return wrong

    def repeat(self, times: Any) -> Optional[Rejected]:
        """OP-ROWS: each row `times` times in a row (transformers' batch_repeat_interleave, as beams start)."""
        wrong = self._batch_free("repeat")
        if wrong is not None:
            return wrong
        if not _is_int(times) or times < 1:
            return Rejected("OP-ROWS", f"repeat: times {times!r} is not an int >= 1", case="times")
        self._take([row for row in range(self.cfg.batch_size) for _ in range(times)])
        return None

    def extend(self, other: Any) -> Optional[Rejected]:
        """OP-ROWS: other's rows (each with its own history and pads) after this cache's; both hold the same
        positions (rows that differ in length differ by their pads) and have configs equal but for batch_size."""
        wrong = self._batch_free("extend")
        if wrong is not None:
            return wrong
        if not isinstance(other, OpModel) or replace(other.cfg, batch_size=1) != replace(self.cfg, batch_size=1):
            return Rejected("OP-ROWS", "extend: other is not a cache of this config", case="config")
        mine, theirs = self.held.get(0, {}), other.held.get(0, {})
        if len(mine) != len(theirs) or other.step is not None and other.step.served:
            return Rejected("OP-ROWS", f"extend: other holds {len(theirs)} positions, this cache {len(mine)}",
                            case="length")
        at = {pos: uid for uid, pos in theirs.items()}
        self._abandon_started()
        self.pads += other.pads
        self.row_labels = [{uid: self.label(row, uid) for uid in mine} for row in range(self.cfg.batch_size)] + \
            [{uid: other.label(row, at[pos]) for uid, pos in mine.items()} for row in range(other.cfg.batch_size)]
        self.floors = [max(a, b) for a, b in zip(self.floors, other.floors)]
        self.unrecorded = [max(a, b) for a, b in zip(self.unrecorded, other.unrecorded)]
        self.cfg = replace(self.cfg, batch_size=self.cfg.batch_size + other.cfg.batch_size)
        self.rows_moved = True
        return None

    def extract(self, row: Any) -> Union[Rejected, "OpModel"]:
        """OP-ROWS: batch row `row` as a cache of its own (batch 1, its history and pads); this one unchanged."""
        wrong = self._rows_error("extract", [row], distinct=True, length=None)
        if wrong is not None:
            return wrong
        out = self.snapshot()
        out.step = None
        out._take([row])
        return out
