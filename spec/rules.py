"""The rules of the spec, as data, in one place (like h11's `_state.py`).

Each rule has an id, a one-line statement, why it exists, and the bug class it prevents. The model
(`model.py`) cites these ids when it rejects a call; the reference implementation cites them in
its contracts; tests and vectors cite them in their names and flags. Nothing else lives here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    id: str
    statement: str
    why: str


RULES: tuple[Rule, ...] = (
    # --- the ground truth: everything below is derived from it or guards it
    Rule("DATA-SOUND",
         "Executing a step's plan on a layer's pool (write the new rows, then read) gives, for every row read, "
         "the current-branch content of the logical position it claims.",
         "This is what attention needs; every other rule exists to make it true or to refuse what would break it."),
    # --- configuration
    Rule("CFG-TYPE", "A cache is built from a CacheConfig, whose integer fields are ints (bool is not) in [.., INT_MAX]; the whole tree "
         "(every layer, every policy) is validated again when the cache is built, and the cache keeps its own copy.",
         "A bool or a float that slips into a size is a silent bug in every language with implicit conversions."),
    Rule("CFG-CAPACITY", "capacity >= 1.", "A cache that can hold no token can serve no step."),
    Rule("CFG-LAYERS", "n_layers >= 1, and layers has 1 entry (broadcast) or exactly n_layers.",
         "Upstream indexes layers[l] unchecked: a size mismatch is an out-of-bounds read."),
    Rule("CFG-POLICY", "A flat layer has window 0; a ring layer has window >= 1; kind is FLAT or RING.",
         "A window on a flat layer, or a zero window on a ring, has no meaning and hides a config mix-up."),
    Rule("CFG-MAX-WRITE", "max_write is None (each ring layer's own window) or >= 1.",
         "It sizes the ring (window + max_write - 1 slots); zero or negative breaks the arithmetic."),
    Rule("CFG-SHAPE", "n_kv_heads >= 1 and head_dim >= 1.", "A backend allocates rows of this shape."),
    Rule("CFG-INITIAL-CAPACITY", "initial_capacity >= 0.", "It is an allocation hint; negative is nonsense."),
    Rule("CFG-DEDUP", "Layers with equal policies share one policy object; a layer's layout depends only on its own policy.",
         "A group's window applied to full-attention layers is a known bug class (transformers, vLLM)."),
    # --- arguments
    Rule("ARG-INT", "Every integer argument is a Python int; bool is not an int here.",
         "plan(True, ...) meaning layer 1 is the kind of silent coercion a spec must forbid."),
    Rule("ARG-RANGE", "Integer arguments lie in their domain: n, position, new_len in [0, INT_MAX].",
         "Negatives and values past a C++ int wrap around silently in other implementations."),
    Rule("ARG-TYPE", "Non-integer arguments have their declared type (a str key, a callable builder whose result is a cache, a "
         "cache for kvcache.et); commit takes exactly a SeqStepPlan (no subclass) and judges it by its field values only.",
         "A wrong type must fail at the boundary with its name, not deep inside."),
    Rule("LAYER-RANGE", "plan, depth and retained_from take 0 <= layer < n_layers.",
         "Upstream checked the layer on plan but not on depth: an out-of-bounds read on the backend's face."),
    # --- length and admission
    Rule("LEN-BOUNDS", "One logical length for the whole model, 0 <= length <= capacity.",
         "Reading the model's length from one sliding layer instead of the whole model is a known bug class."),
    Rule("ADMIT", "can_extend(n) is length + n <= capacity; plan refuses (None) exactly when position + T > capacity.",
         "Admission is the only refusal of plan; an input of exactly the capacity must be admitted."),
    # --- steps
    Rule("STEP-T", "A step has T >= 1 new tokens.", "An empty step writes nothing and reads a span that does not exist."),
    Rule("STEP-T-MAX", "T <= max_write of every ring layer (max_write defaults to the layer's window).",
         "A step is planned for every layer; more than max_write rows would overwrite rows the same step reads."),
    Rule("STEP-APPEND",
         "plan(layer, position, T) takes position == length (a new step) or (position, T) equal to the open step, "
         "the step last committed, which other layers may still plan (per-layer commit, as the MLX runtime does).",
         "A gap reads rows never written; an overlap or a different T within a step corrupts rows other layers read."),
    Rule("PLAN-PURE", "plan changes no state.",
         "Backends plan speculatively and per layer; a plan that moved the length would skip tokens."),
    Rule("PLAN-SHAPE", "write and read are one or two non-empty runs, in logical order, every row in [0, depth(layer)).",
         "A backend gathers at most two runs; a row past depth is an out-of-bounds write."),
    Rule("PLAN-WRITE", "The write runs cover exactly the logical positions [position, position + T).",
         "Multi-token steps that never evict, or write past the window, are known bug classes (mlx-lm, llama.cpp)."),
    Rule("PLAN-READ",
         "The read runs cover exactly [read_base_pos, position + T): read_base_pos is 0 for flat and "
         "max(0, position - window + 1) for ring - the union of the new tokens' windows of `window` keys each.",
         "Windows of w versus w+1 keys, and chunked prefill over-attending on sliding layers, are known bug classes."),
    Rule("LAYOUT-CANON",
         "Canonical layout: flat row = position; ring row = position mod (window + max_write - 1).",
         "Exact layout conformance: a ring start computed from past_length % window after a short prefill is a known bug."),
    Rule("DEPTH", "depth(layer) is capacity for flat and min(capacity, window + max_write - 1) for ring.",
         "The backend allocates exactly the rows the canonical layout touches; a ring sized to the window breaks rollback."),
    # --- commit
    Rule("COMMIT-ISSUED", "commit(plan) takes only a plan this cache plans, for some layer, for the current step.",
         "A forged or stale plan would move the length to a place no layer wrote."),
    Rule("COMMIT-ADVANCE",
         "Committing a new step sets length = position + T and opens the step; committing the open step again changes nothing.",
         "One commit per step is enough, and the per-layer pattern commits once per layer: both must give one length."),
    Rule("PROTO-COMMIT",
         "Consumer obligation: a step whose rows any layer wrote is committed before the next step, rewind or clear; "
         "rewinds and clears happen between complete steps.",
         "plan is pure, so the cache cannot see rows written by an uncommitted step; they would break the rewind floor."),
    # --- rollback
    Rule("REWIND-GROW", "rewind(new_len) with new_len > length is refused.", "A rewind cannot invent tokens."),
    Rule("REWIND-SOUND",
         "rewind(new_len <= length) succeeds iff every layer can serve the next step at new_len soundly (DATA-SOUND), "
         "for every admissible T; rewind(length) and rewind(0) always succeed.",
         "Rollback after a ring wraps must neither corrupt reads (unsound floor) nor be refused when safe (speculative decoding)."),
    Rule("ATOMIC", "A refused call and a caller error leave the state exactly as it was.",
         "A half-applied rollback is the worst failure: the cache and the pools disagree silently."),
    Rule("RETAINED",
         "retained_from(layer) is the oldest position p such that the layer holds every row of [p, length) intact, "
         "counting the open step as written on every layer (the cache cannot see a backend's progress); "
         "0 <= retained_from <= length.",
         "Rollback unsupported or silently ignored after a ring wraps is a known bug class."),
    Rule("CLEAR", "clear() forgets all history: length 0, no open step, nothing retained.",
         "A cleared cache is reused for a new sequence; stale rows must never be read as current."),
    # --- faces, adapter, registry
    Rule("FACES", "as_control() and as_planner() return the same object seen through each face.",
         "Runner and backend must agree on one length; two objects would drift."),
    Rule("ET-MAP",
         "kvcache.et.plan maps a refusal to OutOfResources and a caller error to InvalidArgument; "
         "kvcache.et.rewind maps a refusal or a caller error to InvalidArgument; a Result holds a value with Error.Ok "
         "or no value with another Error member, never both or neither.",
         "OutOfResources tells a runner to stop or evict; a bad layer is a bug (upstream lumps it in: a deliberate difference)."),
    Rule("REG-KEYS",
         "Builders are keyed by the pair (backend_id, kind); make_unique_key() returns distinct keys across threads.",
         "A joined string key lets ('a:b', 'c') and ('a', 'b:c') collide."),
    Rule("REG-SESSION", "A CacheSession installs its cache under a key that holds no cache (a live key is refused) and, on exit, erases "
         "the key if it still holds its cache; control() is the runner face.",
         "A cache left in the global registry leaks across requests."),
    Rule("THREADS", "The registries are thread-safe; a SequenceCache is not (one sequence, one runner).",
         "Saying so prevents a future caller from sharing one cache across threads without a lock."),
    # --- conformance scope
    Rule("SCOPE-BORDER",
         "An implementation that declares a partial scope (layer kinds, the max_write field) refuses at creation "
         "every valid configuration that needs a feature outside it.",
         "A flat-only cache that accepts a sliding-window layer and serves it as full history gives silently "
         "wrong attention; a refusal at build time is loud and costs nothing."),
)

BY_ID: dict[str, Rule] = {rule.id: rule for rule in RULES}
assert len(BY_ID) == len(RULES), "rule ids are unique"
