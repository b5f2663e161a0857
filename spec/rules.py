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
    prevents: str = ""  # the bug class, when `why` does not already name it (the CELL- family says it here)


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
    Rule("ARG-INT", "Every integer argument is exactly a Python int; bool is not an int here, nor is any other "
         "subclass of int.",
         "plan(True, ...) meaning layer 1 is the kind of silent coercion a spec must forbid; a subclass whose == or hash "
         "lies would pass a check and then corrupt the table it is stored in (two ids of one hash, a position that "
         "compares newer than everything)."),
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
         "for every admissible T; rewind(length) and rewind(0) always succeed; a successful rewind, rewind(length) included, "
         "closes the open step (no layer may plan it again).",
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
    # --- the cell layout (many sequences over one pool of per-token cells; spec/cell_model.py)
    Rule("CELL-DATA-SOUND",
         "Every query token of a placed step attends exactly the cells that hold its own sequence's current history "
         "inside its window - no cell of another sequence, no stale cell, none missing - and each attended cell holds "
         "the content written for that (sequence history, position). A sequence's history is the list of (position, "
         "content) it wrote; a fork's history is its source's history below the cut, then its own. The window of a query "
         "at position q is [q - w + 1, q] on a ring-policy layer of window w and [0, q] on a flat layer.",
         "This is what batched attention needs; every other CELL- rule exists to make it true or to refuse what would "
         "break it. The model checks it by executing each step on a data-level pool, never by the mask formula.",
         "A token attending another sequence's cell, a stale cell or missing one of its own (llama.cpp's seq_id bugs)."),
    Rule("CELL-MAX-SEQS", "max_seqs is an int (bool is not) in [1, 64]; sequence ids are ints in [0, max_seqs).",
         "Upstream keeps owners as one 64-bit word (kMaxSeqs = 64); smaller values let a model checker reach "
         "'every id is live'.",
         "An owner bit past the word's width (undefined shift), or a limit no test can reach."),
    Rule("CELL-SEQ-ID",
         "Every sequence id argument is an int (bool is not; ARG-INT) in [0, max_seqs); otherwise a typed error.",
         "Upstream answers false / 0 / nullopt for an id out of range; an id out of range is a caller bug, raised as "
         "layers are (LAYER-RANGE).",
         "A negative or too large id shifting an owner bit out of the word, silently addressing another sequence."),
    Rule("CELL-SEQ-LIVE",
         "declare_step's ids, seq_clone's src, seq_rm's id and the id of seq_len and next_pos must be live; "
         "otherwise a typed error.",
         "A runner that addresses a dead sequence has lost track of it; in this layout that is how tokens end up "
         "attending another sequence's cells once the id is handed out again. Upstream answers true / 0 (lenient).",
         "A runner writing into, or reading the length of, a sequence it already finished or never created."),
    Rule("CELL-NEW",
         "seq_new() hands out the lowest id that is not live; the new sequence is live with an empty history; "
         "None when all max_seqs ids are live.",
         "Deterministic ids make runs replayable and comparable across implementations; None is the only refusal.",
         "An id handed out twice (two runners sharing one sequence), or ids exhausted without a refusal."),
    Rule("CELL-ID-REUSE",
         "No cell carries an owner id that is not live, so a reused id starts with an empty history and never sees "
         "a cell it did not write.",
         "Ids are reused (64 of them); a stale owner bit left on a cell would hand the old sequence's keys to the new one.",
         "A new sequence attending cells of the sequence that had its id before (a stale owner bit)."),
    Rule("CELL-FORK",
         "seq_clone(src, upto) hands out the lowest non-live id (None when none) whose history is src's history "
         "restricted to positions < upto (all when upto is None); the cells are co-owned, nothing is copied; later "
         "writes and removals of either side do not change the other's history. upto is None or an int in "
         "[0, INT_MAX]. A fork whose cut keeps nothing is a live sequence with an empty history.",
         "Forks share a prompt's cells (beam search, parallel sampling) and must be snapshots; an empty fork is a "
         "valid new sequence (upstream answers nullopt when src owns no cell: a port that refuses is over-strict).",
         "A fork that copies instead of sharing, shares past its cut, or sees cells its source gains later."),
    Rule("CELL-RM",
         "seq_rm(s, p0, p1) drops s's ownership of its cells with position in [p0, p1) (p1 None: to the end) and "
         "answers True; p0 is an int in [0, INT_MAX], p1 None or an int with p0 <= p1 <= INT_MAX (p0 == p1 is an "
         "empty range). A cell no sequence owns any more becomes free; a cell another sequence still owns keeps its "
         "position and content for it. When s owns nothing afterwards, s stops being live.",
         "Rollback of rejected drafts and the removal of a finished sequence; a shared prefix must survive the "
         "removal of one of its owners.",
         "seq_rm ranges off by one at either end; removing from a shared cell freeing it for its other owner."),
    Rule("CELL-OWNERS",
         "A free cell has no owner and no position; an occupied cell has at least one owner, all live; a sequence "
         "never owns two cells of one position; seq_len(s) is the number of cells s owns; next_pos(s) is one past "
         "s's newest position (0 when it owns none).",
         "The table's bookkeeping is what masks are built from; seq_len and next_pos are what a runner continues from.",
         "Position bookkeeping (newest position, next position) out of date after removals and forks."),
    Rule("CELL-USED-END",
         "used_end() is one past the highest occupied cell (0 when none); free_cells() is capacity minus the occupied "
         "cells; can_extend(n) is n <= free_cells() (n an int in [0, INT_MAX]).",
         "The read window of a step is [0, used_end); admission counts free cells, wherever they are.",
         "A read window that misses an occupied cell at the top, or admission that counts the extent, not the cells."),
    Rule("CELL-DECLARE",
         "declare_step(seq_ids) takes a non-empty list or tuple of live ids, one per token of the next forward (an id "
         "may repeat: a multi-token step; several ids: a batch); an empty one is a typed error; more tokens than free "
         "cells is a refusal (False, nothing changed); otherwise it opens a forward and answers True.",
         "Admission happens once per forward, before any layer runs; the only refusal is the lack of cells.",
         "Admission that counts cells but not the ids (a token for a dead sequence), or a forward admitted half."),
    Rule("CELL-POS",
         "place_step's positions: one int in [0, INT_MAX - 1] per declared token (so next_pos, one past the newest "
         "position, is at most INT_MAX and fits an int); each token's position is greater than "
         "every position its sequence already holds and than every earlier token of the same sequence in this step "
         "(a sequence's positions strictly increase; gaps are allowed). Otherwise a typed error, nothing changed.",
         "A sequence never holds two cells of one position (CELL-OWNERS); RoPE positions come from the runner; "
         "upstream's next_pos returns an int, so a position INT_MAX would make it overflow.",
         "A rewritten position leaving two cells of one position in one sequence, both attended."),
    Rule("CELL-WINDOW-POS",
         "Windows measure positions, not tokens: a query at q on a ring-policy layer of window w sees its sequence's "
         "cells with position in [q - w + 1, q], however many that is (a sequence with gaps sees fewer keys).",
         "RoPE and the window mask are defined on positions; the kernel never sees token counts.",
         "Sliding windows counted in tokens where positions have gaps, or vice versa."),
    Rule("CELL-PLACE",
         "The first place_step of a forward places each declared token in a cell that was free, owned by its "
         "sequence only, with its position; the later layers of the forward reuse that placement (the same cells). "
         "No cell that holds history is ever overwritten.",
         "Every layer writes a token's K/V into the same cell, so one table describes every layer's pool.",
         "A token placed over a cell another sequence still reads; layers of one forward writing different cells."),
    Rule("CELL-LAYOUT-CANON",
         "Canonical placement: each token takes the lowest free cell, in token order (exact layout conformance only; "
         "semantic conformance allows any free cells).",
         "Upstream's placement, so two conforming caches can be compared cell by cell.",
         "Placement drift between a port and the reference that only shows as different read windows."),
    Rule("CELL-STEP-SHAPE",
         "A CellStep has length equal to the declared length, read_len equal to used_end() after placement, cells "
         "distinct and in [0, read_len), and mask_bits of exactly length * read_len bytes, each 0 or 1 (row-major: "
         "row i is query token i); layers with the same window get equal steps.",
         "The backend indexes the mask as [length x read_len] and gathers cells [0, read_len) without checks.",
         "A mask row read past its end; a query token's own cell outside the read window."),
    Rule("CELL-MASK",
         "Mask bit (i, j) is 1 iff cell j is occupied, owned by token i's sequence, and its position p satisfies "
         "p <= q_i and (flat layer, or p >= q_i - w + 1).",
         "The formula a cache computes; it follows from CELL-DATA-SOUND under CELL-OWNERS, and the model checks the "
         "data-level rule instead.",
         "Masks built from owner bits that are out of date (stale memoized steps after a verb)."),
    Rule("CELL-FORWARD",
         "A forward is declare_step, then place_step on every layer exactly once, in any order, with the same "
         "positions; it closes when every layer is served. While it is open, declare_step, seq_new, seq_clone and "
         "seq_rm raise a typed ForwardError and change nothing; queries are allowed; clear() is always allowed and "
         "forgets it. place_step with nothing declared, on a layer already served in this forward, or with positions "
         "different from the first layer's is a typed error.",
         "A verb between the layers of one forward would make the layers of one token attend different tables, or "
         "leave cells written on some layers only; upstream silently invalidates the placement instead.",
         "Masks built before a verb changed the table; cells holding K/V on some layers only."),
    Rule("CELL-CLEAR", "clear() frees every cell, makes no id live and forgets any open forward.",
         "A cleared cache serves new sequences; nothing of the old ones may be seen, and it is the escape hatch from "
         "an abandoned forward.",
         "A cleared cache whose reused ids still see old cells, or a forward that outlives clear()."),
    Rule("CELL-ATOMIC", "A refusal or a typed error of the cell layout changes nothing (every query answers as before).",
         "A half-applied verb leaves the table and the backend's pools disagreeing silently.",
         "A declare_step refused after part of the forward was admitted; a seq_rm that raised after freeing cells."),
)


# --- the op face (`update_and_fetch(layer_id, k, v, position) -> (k_hist, v_hist, AttendSpec)`), layout-free:
# the rules state what each query attends, not where the cache keeps it (SPEC.md part 5).
OP_RULES: tuple[Rule, ...] = (
    Rule("OP-ATTEND",
         "A query of sequence s at position p on layer l with window w (0 = flat) attends exactly the tokens s holds "
         "on layer l at positions q <= p (and q > p - w when windowed), each once, with the K and the V written for "
         "that token on that layer; nothing of another sequence, nothing removed, nothing never written on l. With "
         "batch_size B > 1 (contiguous) batch row b attends only rows written for batch row b. A target declaring "
         "lossy=<tol> (SCOPE-LOSSY) may hold K and V that differ from what was written by up to tol.",
         "This is what attention needs; every other OP- rule exists to make it true or to refuse what would break it.",
         "A query that sees another sequence's token, a removed token, a token twice, or a row never written."),
    Rule("OP-MASK",
         "AttendSpec NONE: every query attends every returned row. CAUSAL: torch's is_causal (upper-left): query i "
         "attends rows 0..i; a cache answers it only when q_len == rows (a fresh full prefill), and a CAUSAL answer "
         "with q_len != rows is wrong. EXPLICIT: a bool mask of shape [q_len, rows], true = attend, broadcast over "
         "batch and heads, or [B, q_len, rows], one per batch row (OP-PAD); a mask of another shape or dtype is wrong.",
         "The cache hands back a mask semantic that another function applies; both sides must read it alike.",
         "A CAUSAL over a continuation (upper-left alignment hides the history); a mask of the wrong shape."),
    Rule("OP-HIST",
         "k_hist is [B, Hkv, rows, D] and v_hist [B, Hkv, rows, Dv], with the same rows, in float32.",
         "attend indexes K and V by the same row and the mask by that row count.",
         "V rows shifted against K rows; an MLA value width lost."),
    Rule("OP-ARGS",
         "k is [B, Hkv, q_len, D], v [B, Hkv, q_len, Dv], both floating-point, position [q_len, 1] integers; B == "
         "batch_size, Hkv == "
         "n_kv_heads, D == head_dim, Dv == v_head_dim; q_len >= 1 and equal across k, v and position; layer_id is an "
         "int (not bool) in [0, n_layers). A target declaring trusted-args is sent no call that breaks "
         "this (SCOPE-TRUSTED-ARGS).",
         "A shape the cache does not check is silently broadcast or truncated into the history.",
         "A step whose K, V and positions disagree in length; an MLA value of the key's width."),
    Rule("OP-POS",
         "Every position is an int in [0, 2**31 - 2]; within a step one sequence's positions strictly increase; each is "
         "newer than every position its sequence already holds, not counting an open step this call abandons. "
         "Contiguous cache: a new step's positions are consecutive and continue that history with no gap (the first "
         "equals the tokens held).",
         "A re-placed or older position gives a query two tokens at one position; -1 is a free-cell marker.",
         "Re-placed positions; positions colliding with internal markers; a contiguous row that is not its position."),
    Rule("OP-STEP",
         "A step is one forward: each layer served at most once by update_and_fetch, every layer with the same q_len and "
         "positions. Cell: begin_step(seq_ids) (a non-empty list or tuple of ints in [0, 63)) declares each token's "
         "owner, the first layer served places the tokens, and a forward with no step declared is refused. "
         "Contiguous: a step begins at the first layer served, and serving a layer already served begins the next. "
         "A step not every layer served (cell: or declared and served by none) is abandoned when the next begins, at "
         "begin_step, seq_cp, seq_rm, trim and reset: none of its tokens remain on any layer, and a dropped declaration "
         "declares nothing. Until then its tokens are held on the layers that served it.",
         "A forward is atomic across layers: otherwise a layer that never wrote a token is later asked to attend it. "
         "The ids are upstream's, [0, 63): its owners word is an int64 whose bit 63 is the sign.",
         "A step stopped partway whose cells stay owned; a layer served twice in one step."),
    Rule("OP-FORK",
         "seq_cp(src, dst, upto=None): dst then holds, on every layer, src's tokens at positions < upto (all when None), "
         "sharing their K/V. src != dst, dst holds nothing once the open step is abandoned, upto None or an int >= 0.",
         "Merging two histories can put two tokens at one position; upstream says nothing about a live destination.",
         "A fork onto a live destination that then attends two tokens at one position."),
    Rule("OP-RM",
         "seq_rm(s, p0=0, p1=None) removes s's tokens at positions in [p0, p1) (to the end when None) on every layer; "
         "other sequences sharing them keep them. p0 an int >= 0, p1 None or an int >= p0.",
         "Eviction and truncation are per sequence; a shared prefix belongs to every sequence holding it.",
         "A removal that frees a cell another sequence still attends."),
    Rule("OP-CAP",
         "Contiguous: a new step is refused when the tokens held once the open step is abandoned, plus q_len, exceed "
         "capacity (STATIC and DYNAMIC agree); a target declaring unbounded has no capacity "
         "(SCOPE-UNBOUNDED). Cell: free_cells() counts the cells no token holds (an open step's placed tokens hold "
         "theirs); begin_step of n tokens is refused exactly when n exceeds the free cells once the open step is "
         "abandoned, and can_extend(n) is exactly whether it is admitted.",
         "The cache bounds hard at capacity; admission is decided before anything is written.",
         "A step that overflows after writing part of its rows."),
    Rule("OP-BATCH",
         "The cell cache requires batch_size == 1 (refused at construction); the contiguous cache serves B batch rows "
         "that share positions.",
         "Every sequence of a cell cache shares one token axis, so a second batch row has no meaning there.",
         "Batch rows of a cell cache silently mixed into one history."),
    Rule("OP-ATOMIC",
         "A refused call changes nothing a later call can observe: every check runs before an open step is abandoned, "
         "and a refused forward keeps the step's declaration. Refusals are typed errors with the rule id: a malformed "
         "argument or config a ValueError or TypeError, a refusal decided by the cache's state (capacity, admission, "
         "the forward protocol) also a RuntimeError, as upstream raises.",
         "A half-applied call leaves history rows the caller does not know about.",
         "K grown by a step whose V was refused; cells claimed by a step that then failed."),
    Rule("OP-CONFIG",
         "capacity > 0, n_layers > 0, layers of size 1 or n_layers, policies valid, n_kv_heads, head_dim, v_head_dim "
         ">= 1, batch_size >= 1, every size an int (not bool). A relaxation may leave some of these refusals "
         "unowed (SCOPE-TRUSTED-ARGS, SCOPE-USER-CONFIG, SCOPE-UNBOUNDED, SCOPE-LAZY-SHAPES).",
         "A cache built from a nonsensical config fails later, far from the cause.",
         "A zero-layer or zero-head cache that accepts steps it cannot serve."),
    Rule("OP-MAX-WRITE",
         "Contiguous: with max_write set (an int >= 1; null = no bound) and a ring layer in the config, a step of more "
         "than max_write tokens is refused on every layer, before anything changes.",
         "A runtime cache keeps a ring of window + max_write - 1 rows per ring layer (upstream's MLX runtime), so a "
         "longer step would overwrite rows its own queries read; the runner chunks prefill to fit.",
         "A step longer than max_write served into a ring that cannot hold it; an exact fit refused."),
    Rule("OP-SINKS",
         "A ring layer of window w with keep k (an int in [0, w); absent = 0) is what one query attends: the query at "
         "position p attends exactly the positions q <= p with q < k or q > p - (w - k) (the first k are sinks, kept "
         "for every query); a config with keep >= w, keep < 0, a keep that is not an int, or a keep on a flat layer is "
         "refused.",
         "StreamingLLM's attention sinks (mlx-lm's RotatingKVCache(max_size=w, keep=k)): the first tokens carry "
         "attention mass a plain window drops; at keep >= w no new token would ever be attended.",
         "Sinks dropped by a multi-token step; a keep at or above the window served, every decoded token written "
         "where no query attends it."),
    Rule("OP-TRIM",
         "Contiguous: trim(n) drops the newest n tokens of every layer (held goes from L to L - n), the first "
         "check that applies deciding: (1) n not an int (a bool included): refused; (2) n < 0 or n > L, L the "
         "tokens held before an open step: refused; (3) an open step is abandoned (OP-STEP), and the trim goes "
         "on from L; (4) n = 0: owed; (5) every ring layer of window w, keep k still retains everything - its "
         "floor F <= k, where F starts at 0, becomes max(F, end - (w - k - 1 + max_write)) (max_write null "
         "counts 0) when a step ending at end begins, and min(F, L - n) at a trim (a recording ring's: OP-RECORD) "
         "- and every chunk layer the chunk the query at L - n reads (OP-CHUNK): owed; (6) otherwise "
         "optional: the target serves it, every later answer then judged by its rows, or refuses it, changing "
         "nothing. A valid n is never refused for what a ring may have dropped.",
         "Speculative decoding rolls back its rejected draft tokens (HF's crop, mlx-lm's trim); whether a ring "
         "can give them back is a fact about the rows it kept, which only its later answers show: a cache that "
         "keeps more than a ring of the least size serves the rollback right, one that lost a row answers "
         "wrong, one that refuses (mlx-lm's is_trimmable: offset < max_size) is right.",
         "A trim that only lowers the length (the rows come back); a trim past a wrapped ring that then serves "
         "overwritten rows; a negative trim that grows the cache over rows never written."),
    Rule("OP-CHUNK",
         "Contiguous: a chunk layer of chunk size c (an int >= 1, window 0) is what one query attends: the query at "
         "position p attends exactly the positions q with c * floor(p / c) <= q <= p. Its floor F becomes max(F, "
         "c * floor(s / c)) when a step whose first position is s begins, and min(F, L - n) at a trim; it holds the "
         "chunk the query at L - n reads while c * floor((L - n) / c) >= F (OP-TRIM). A config with a chunk "
         "below 1 or not an int, a chunk layer with a window or without a chunk, or a chunk on another kind of "
         "layer is refused; the cell cache has no chunk layers.",
         "Chunked attention (llama4's attention_chunk_size, mlx-lm's ChunkedKVCache) bounds each query to its own "
         "chunk: a cache may drop every earlier chunk once a step starts in a new one, and a trim back across the "
         "boundary then needs rows only a cache that kept them has.",
         "A query attending across its chunk's start (a sliding window of c instead of a chunk); a chunk start "
         "that a trim back across the boundary does not move back; a chunk of 0 served."),
    Rule("OP-RECORD",
         "Contiguous: with record_past true (a bool; absent = false), every ring layer of window w, keep k keeps "
         "its past until a trim: a step begun moves no ring's floor, and a trim to L - n sets it to max(min(F, "
         "L - n), L - n - (w - k - 1)); it retains what the query at L - n reads while F <= k or F <= L - n - (w - k "
         "- 1) (OP-TRIM) - so after an owed trim (or a reset) a trim no lower than it left is owed however far the "
         "steps between them went. A record_past that is not a bool is refused; the cell cache records no past.",
         "Speculative decoding over sliding layers (transformers' activate_past_recording, then crop after each "
         "verification) keeps the rows a rollback needs beyond the window; a cache that promises it and keeps "
         "only its window cannot give back what it rejected.",
         "A recording ring that keeps only its window (an owed trim refused, or served over rows it lost); a "
         "record_past of 1 or 'yes' taken for true."),
    Rule("OP-PAD",
         "Contiguous: pad(left_padding) on a cache holding nothing (one int in [0, capacity] per batch row) makes batch "
         "row b's positions below left_padding[b] its pads, until a reset: no query of row b at a position >= "
         "left_padding[b] attends a pad of row b, on any layer, however the batch is reordered later; a query at a "
         "pad position is not judged (its output is the caller's to discard). A wrong length, a pad that is no int "
         "or out of range, or a cache already holding tokens is refused.",
         "Batched generation left-pads shorter prompts (mlx-lm's BatchKVCache(left_padding), transformers' "
         "attention_mask): the pads share the positions but are no tokens of the row, so a query that attends one "
         "reads filler as context.",
         "A pad attended after a step (the mask of a shared causal prefix); a reorder or select that leaves a "
         "row's pads behind with its old index."),
    Rule("OP-ROWS",
         "Contiguous: select(rows) keeps the batch rows named, in that order (distinct); reorder(rows) makes row b "
         "the old row rows[b] (len(rows) == B, repeats allowed: beam_idx); repeat(k) repeats each row k times in a "
         "row (k an int >= 1); extend(other) appends the rows of another cache of the same config but batch_size "
         "that holds the same positions; extract(row) returns row `row` as a cache of batch 1, this one unchanged. "
         "Each row keeps its own history and pads; positions are kept; an open step is abandoned (OP-STEP). An "
         "empty list, an index that is no int (a bool, a float) or out of [0, B), a repeat in select, a wrong "
         "length for reorder, or an other of another config or length is refused, changing nothing.",
         "Beam search and continuous batching move whole rows (transformers' reorder_cache, "
         "batch_select_indices, batch_repeat_interleave; mlx-lm's filter, extend, extract): each row's K, V and "
         "pads must move together, on every layer.",
         "A reorder applied to K and not V or to some layers; a row's pads left at its old index; a negative "
         "index wrapping to the last row; True taken for row 1."),
    Rule("OP-STATE",
         "Contiguous: state() answers the cache's state as bytes - what it holds with an open step left out (the "
         "step stays open) - and load_state(data) replaces everything the cache holds with a state so taken: every "
         "later call answers as the saved cache's would, its trims owed alike (OP-TRIM), whether loaded into a "
         "fresh cache or a live one. data that is not bytes, truncated, changed in any byte, taken under another "
         "config or written in another format version is refused, naming what is wrong, and nothing changes.",
         "Prompt caches are saved and loaded (mlx-lm's save_prompt_cache / load_prompt_cache, llama.cpp's state "
         "files): a state that loads wrong gives wrong attention for the rest of a generation without a sound, "
         "while a refused one costs only a recompute.",
         "A round trip that loses a ring's position or a row; a corrupted, truncated or foreign state accepted."),
    Rule("OP-QUANTIZE",
         "Contiguous: quantize(bits) (an int in [2, 8]) turns the cache, between steps or mid-generation, into a "
         "quantized one: every token it holds, and every token written to it later, reads back within "
         "(max - min) / (2 (2^bits - 1)) of what was written in every element (max and min over that token's row "
         "as written: one layer, batch row, head, K or V), plus float32 rounding; its positions, used lengths and "
         "masks are unchanged (an open step is abandoned: OP-STEP), and a reset keeps it quantized. A bits that is "
         "no int (a bool, a float) or out of range, or a second quantize, is refused and nothing changes.",
         "mlx-lm converts its KVCache to a QuantizedKVCache mid-generation (to_quantized(group_size, bits), "
         "--quantized-kv-start) and transformers quantizes its caches: a conversion that loses a row, keeps the "
         "wrong one, or rounds coarser than its bits say degrades every later token without a sound.",
         "A conversion that drops or shifts a row; one rounding coarser than its bits (an error past the bound); "
         "bits=True taken for 1, or 4.0 served."),
)

# --- a cell cache seen only through its outputs (SPEC.md section 5.3): the op face's cell verbs, and a decode
RECOMPUTE_RULES: tuple[Rule, ...] = (
    Rule("CELL-RECOMPUTE",
         "A cell cache observed through its outputs answers, for every token of a decode, the output the same target "
         "computes when it recomputes that token from nothing over exactly the rows the spec says it attends: its "
         "sequence's (token, position) entries at positions up to its own, each once, decoded as one sequence into a "
         "fresh state; equal to a float tolerance. With more than one layer the check binds where every one of those "
         "rows was written over the entries now below it. Windows are not applied to that set: the recompute "
         "applies each layer's window to it as the decode does (on a window-w layer the query at q attends the rows "
         "at positions >= q - w + 1), so the rule compares the two computations and does not decide the window.",
         "Runtimes such as llama.cpp expose no K/V rows: with one layer a token's output is a function of exactly the "
         "(token, position) rows it attends, so the target's own recompute over the spec's set is the oracle.",
         "A token attending a removed cell, another sequence's cell, two cells at one position, or missing one of its "
         "own (llama.cpp's seq_cp onto a live destination; a sliding layer rewound below what it still holds)."),
    Rule("CELL-KEEP",
         "seq_keep(s) (s an int in [0, 63)) removes every token of every other sequence; s keeps its own, the ones it "
         "shares too.",
         "llama.cpp's seq_keep ends every sequence but one (a chosen beam) in one call; a cell s shares must survive it.",
         "A kept sequence losing a cell it shared with a removed one; another sequence left holding cells."),
    Rule("CELL-SHIFT",
         "seq_add(s, p0, p1, delta) moves s's tokens at positions in [p0, p1) (to the end when p1 is None) by delta, for "
         "s only: a sequence sharing one keeps it where it was; s's later queries attend them at their new positions. p0 "
         "an int >= 0, p1 None or an int >= p0, delta an int; the move is refused when, after it, a moved token's "
         "position lies outside [0, 2**31 - 2] or equals the position of a token of s the move left in place (a "
         "position a moved token vacates may be taken by another moved token).",
         "A context shift (seq_rm of the oldest, then seq_add of the rest by minus that many) keeps a long "
         "conversation inside the cache; RoPE makes a key's position part of what it is.",
         "A shift that moves a shared cell for every owner, keys left at their old positions, or two tokens of one "
         "sequence shifted onto one position."),
    Rule("CELL-STATE",
         "seq_save(s) answers the state of sequence s as bytes, and seq_load(d, data) of a state so taken makes d "
         "(an int in [0, 63), the same sequence or another, live or not) hold exactly the saved tokens at their "
         "positions - "
         "what d held before is gone, other sequences are untouched - so that every later decode of d answers as the "
         "saved sequence's would (CELL-RECOMPUTE over the saved rows); through a file alike. data cut short or "
         "changed in any byte is refused, and nothing changes.",
         "Runners save a conversation's sequence and restore it later, or into another slot (llama.cpp's "
         "llama_state_seq_get_data / set_data and its state files, a server's slot save and restore): a state that "
         "loads wrong gives wrong outputs for the rest of the conversation without a sound.",
         "A restored sequence missing rows a sliding layer dropped from the state, rows restored at other positions "
         "or into another sequence's cells; a truncated or corrupted state accepted, or refused after it emptied "
         "the destination."),
)

# --- conformance scope (SPEC.md section 6.1): what a target declares it implements, and what it owes less
SCOPE_RULES: tuple[Rule, ...] = (
    Rule("SCOPE-BORDER",
         "An implementation that declares a partial scope (layer kinds, the max_write field, one fixed max_seqs "
         "for a cell cache, the narrowest width min_head_dim of an op target, one fixed keep=N of its ring layers) "
         "refuses at creation every valid "
         "configuration outside it; a lazy-shapes target, given no sizes at creation, owes it only for those outside "
         "by something besides their sizes (SCOPE-LAZY-SHAPES).",
         "A flat-only cache that accepts a sliding-window layer and serves it as full history gives silently "
         "wrong attention; a refusal at build time is loud and costs nothing."),
    Rule("SCOPE-DECLARE",
         "A scope is a list of names: features of the target's layout (all: every one), max_seqs=N (an int in "
         "[1, 64]), keep=N (an int >= 0; N > 0 needs sinks) and relaxations, which only an op layout declares "
         "(unbounded and no-length only op-contiguous; trusted-args a paged one too). An unknown name, a value missing, repeated or out of its range, user-config "
         "without trusted-args, or a relaxation the layout cannot declare is an error before anything runs; a cmd: "
         "target's hello only ignores and reports unknown names.",
         "A typo that silently widened or narrowed what is owed would make a verdict mean something else than it "
         "says; a relaxation that relaxes nothing on its layout (unbounded on a cell cache) would still silence "
         "checks."),
    Rule("SCOPE-TWINS",
         "A scope fixing max_seqs=N, keep=N or min_head_dim=N is also driven over the twin of every suite "
         "configuration outside it by those alone: max_seqs set to N; each ring layer ring(w, keep k) made "
         "ring(w - k + N, keep N); head_dim raised to max(head_dim, N), and a v_head_dim that differed raised to "
         "max(v_head_dim, N), plus 1 when that equals the new head_dim. The originals stay outside, checked "
         "refused at creation (SCOPE-BORDER).",
         "A cache with upstream's fixed 64 ids, mlx-lm's keep 4 or a quantizer's 32-channel groups must still be "
         "driven over every layer family and edge the suite has (capacity 1, window 1, a window part of 1, MLA), "
         "not only over the configurations that happen to fit it."),
    Rule("SCOPE-TRUSTED-ARGS",
         "trusted-args: the target is sent no malformed call (a clause of the argument contract broken: a shape, "
         "dtype or rank, q_len 0, an id or int out of range, a position outside [0, 2**31 - 2], a trim's n outside "
         "[0, held] or not an int; on a paged target any call PAGED-ARGS or PAGED-FREE refuses) and no invalid "
         "configuration, and owes none of their refusals; what the state refuses (positions that do not continue "
         "the history, a step past max_write or the capacity, a reservation that does not fit) and the refusal "
         "of a valid configuration outside the scope stay owed.",
         "Hugging Face's DynamicCache and mlx-lm's KVCache are called by model code only and check nothing, nor "
         "do vLLM's KVCacheManager and SGLang's RadixCache, which trust their scheduler: their contract, not "
         "their bug; what their state refuses is still what keeps attention right."),
    Rule("SCOPE-USER-CONFIG",
         "user-config=<key>[+<key>] (keys capacity, max_write, window, keep; with trusted-args): an invalid "
         "configuration a change of these keys alone makes valid (tried over capacity 1..16, max_write None or "
         "1..8, window 1..16 on every ring layer at once, keep 0..4) is still sent, and its refusal is owed.",
         "Some keys come from the library's user, not its model code (mlx-lm's --max-kv-size is every ring's "
         "window, passed unchecked): a user reaches such a configuration with one flag."),
    Rule("SCOPE-UNBOUNDED",
         "unbounded (op-contiguous only): the target has no capacity: a step past the config's capacity is served "
         "as OP-ATTEND says; OP-CAP is not owed, nor the refusal of a configuration whose only fault is its "
         "capacity (0 included).",
         "Growing caches (DynamicCache, mlx-lm's KVCache) have no capacity; a cell cache's capacity is its free "
         "cells, which admission needs, so it cannot declare one away."),
    Rule("SCOPE-LAZY-SHAPES",
         "lazy-shapes: the config holds no n_kv_heads, head_dim, v_head_dim or batch_size; each layer learns them "
         "from its first update after creation or reset, which is well-formed. Not owed: the refusal of an "
         "invalid size (OP-CONFIG) and of a configuration outside the scope by its sizes alone. Owed (unless "
         "trusted-args): the refusal of a later update on that layer whose sizes differ from the first's (OP-ARGS).",
         "Library caches allocate at their first update, from its tensors: they cannot refuse a size they were "
         "never told, but can refuse one that contradicts what they learnt."),
    Rule("SCOPE-LOSSY",
         "lossy=<tol> (tol a float, 0 < tol < 0.5): stored K and V may differ from what was written by up to tol in "
         "every element; the suite writes row codes of small integers and reads a row as the one code within tol "
         "of it.",
         "Quantized caches store K and V lossily by design; below half of 1 a row still reads as at most one code, "
         "so which token a query attends stays decidable (OP-ATTEND)."),
    Rule("SCOPE-MIN-HEAD-DIM",
         "min_head_dim=<N> (N an int >= 1): the target serves only head_dim and v_head_dim >= N; a configuration "
         "with a narrower width is outside its scope, refused at creation, and its twin is driven instead "
         "(SCOPE-TWINS).",
         "A quantizer groups channels (HF's QuantizedCache 64, mlx-lm's 32): narrower rows cannot be stored, a "
         "limit of the design, stated up front."),
    Rule("SCOPE-WINDOW-STEPS",
         "window-steps (op): a ring layer may refuse a step longer than its window, while flat layers serve any "
         "length; such a refusal is not over-strict, and the program is not judged past it; every other refusal "
         "stays owed.",
         "Some libraries' sliding layers take at most a window per call (litgpt's KVCache raises on a longer "
         "prefill): their contract, and past it the step stands served on some layers and refused on one, which "
         "no rule describes."),
    Rule("SCOPE-NO-LENGTH",
         "no-length (op-contiguous): the cache keeps no length of its own and need not answer used(layer); it is "
         "judged by its answers alone, OP-ATTEND naming every token each query attends.",
         "A cache whose caller passes the positions keeps no count; one invented beside the rows would be wrong "
         "exactly where it matters, since an abandoned step and a trim lower what a layer holds."),
    Rule("SCOPE-REQUIRES",
         "requires=<precondition>[+<precondition>] (op-cell, cell-recompute): a call breaking a declared "
         "precondition on the caller (ids-in-range: every sequence id an int in [0, 63); empty-destination: seq_cp "
         "onto a sequence holding nothing, never its source; whole-copies: seq_cp with upto None; ordered-ranges: a "
         "range's p0 an int >= 0, its end None or an int >= p0) is never sent; the calls that keep it are judged "
         "as before.",
         "A library may document a precondition on its caller - llama.cpp asserts every id in range (GGML_ASSERT) "
         "and, with a stream per sequence, whole copies - and a call breaking it is then the caller's error; a "
         "target declares one only where the library's header or source states it, and names the line."),
    Rule("SCOPE-VERSION",
         "A target is judged on the features of the spec version it declares (spec=N; naming a feature declares "
         "the version that added it; none declared is spec 1): a configuration, configuration key or call of a "
         "later version is never sent, neither driven nor checked at the border.",
         "A cache written against an earlier release must keep its verdict when the suite grows: judged on what "
         "came later, a spec-1 cache that never heard of keep would be handed one and serve the ring as keep 0."),
)
# --- the paged layout (SPEC.md part 7; spec/paged_model.py): requests over a pool of fixed-size blocks, with block
# tables per KV group and prefix caching, as serving engines keep their KV memory. Ids are the target's own: the
# rules judge the data its tables map to, and counts computed from what it shows.
PAGED_RULES: tuple[Rule, ...] = (
    Rule("PAGED-DATA-SOUND",
         "Every position a live request attends maps, through that request's table of that group, to a slot holding "
         "exactly the K/V computed for that position from that request's own prefix (its tokens up to it) and keys, "
         "whoever computed it: on a full group every position it computed, on a window group of window W its last "
         "W - 1, and while a step computes, everything that step's queries read.",
         "This is what attention needs; every other PAGED- rule exists to make it true or to refuse what would break "
         "it. The suite checks it by the values it wrote, never by block ids.",
         "Another request's K/V, a stale block or an unwritten slot served with no error."),
    Rule("PAGED-CONFIG",
         "A configuration has exactly block_size, num_blocks and max_model_len (ints, bool not, in [1, INT_MAX]), "
         "groups (a non-empty list of {kind: full} or {kind: window, window: W}, W an int in [1, INT_MAX]) and "
         "prefix_caching (a bool), and optionally pools (\"shared\", the default, or \"per-group\": each group a "
         "pool of its own of num_blocks blocks, block ids per pool); anything else is refused at creation, naming "
         "the key.",
         "A pool of no blocks, a zero window or a misspelt key serves nothing right and fails far from the cause.",
         "A zero block size dividing positions into no block; a window group read as a full one."),
    Rule("PAGED-ARGS",
         "admit takes a request id (a str) not live, tokens (a non-empty list of ints in [0, INT_MAX], bool not) of "
         "at most max_model_len, keys (a list of str) and a budget (an int in [1, INT_MAX]); extend takes a live "
         "request, tokens (a list of such ints, possibly empty) keeping the total within max_model_len and leaving at "
         "least one token to compute, and a budget; table takes a live request; a call breaking this is refused "
         "with a typed error naming the argument.",
         "A bad id or count that slips into a block table is a silent corruption in every engine: the scheduler's "
         "bug must stop at the boundary, loudly.",
         "A negative or bool token hashed into a prefix; an empty prompt admitted with nothing to compute; a "
         "request admitted twice under one id."),
    Rule("PAGED-RESERVE",
         "A served admit with hit h reserves slots for the n = min(len(tokens) - h, budget) positions h .. h + n - 1 "
         "and returns h; a served extend appends its tokens, reserves the n = min(total - computed, budget) "
         "positions after the computed ones and returns n; computed then grows by n.",
         "The model runner writes exactly the positions it was given slots for; a short reservation leaves "
         "positions written nowhere, a long one computes tokens the runner never asked for.",
         "A chunked prefill whose budget is ignored; a decode token given no slot."),
    Rule("PAGED-HIT",
         "A prefix hit h of an admission is a whole number of blocks, at most len(tokens) - 1, and covers only a "
         "prefix some request computed with identical tokens and identical keys; it is 0 when prefix_caching is "
         "false.",
         "Reusing K/V is right only when everything that determines it is equal - every token before and the extra "
         "keys (adapter, images, salt); the last prompt token is computed because its logits are needed, and only "
         "whole blocks are cached.",
         "A hash collision or a hash of the block alone serving another request's prefix; a hit across different "
         "extra keys; a prompt hit whole, leaving no logits."),
    Rule("PAGED-HIT-GROUPS",
         "One hit length holds for every group: after an admission with hit h each group maps every position the "
         "request's queries from h on read.",
         "The groups are layers of one model: a token computed once reads all of them, so a hit one group cannot "
         "serve is a hit no group may take.",
         "A hybrid model whose full group hits further than its window group holds, the window's blocks missing."),
    Rule("PAGED-SHARE-FULL",
         "A block id in more than one live table is in the same group at the same block index in each, and full "
         "(all B positions computed) for every holder.",
         "A partly filled block is still being written by its owner: shared, the next write of one request lands "
         "in the other's slots.",
         "Two requests that diverge inside a block both writing their next token into it."),
    Rule("PAGED-NO-REWRITE",
         "A slot holding a position some live request must hold is never given to another position, and a cached "
         "block is rewritten only after it is evicted, never while a hit can still map to it.",
         "Shared and cached blocks are read by requests that did not write them; a rewrite changes their K/V under "
         "them with no error.",
         "A shared block rewritten by one of its holders; a cached block reused in place and then hit."),
    Rule("PAGED-REFCOUNT",
         "A block's reference count (when the target shows counts; per-group pools: one dict per group) equals the "
         "number of (live request, group) tables holding it.",
         "Counts decide when a block can be evicted: one too low frees a block still read, one too high leaks it "
         "forever.",
         "A double-counted shared page; a count not dropped on free."),
    Rule("PAGED-EVICT",
         "Only a block no live table holds is evicted (its slots given to other positions), and once evicted it is "
         "never hit as the prefix it held before.",
         "Eviction under pressure is where use-after-free happens: a block still in a table, or still indexed by "
         "its old hash, serves the wrong K/V.",
         "An in-use block evicted to admit another request; a stale hit on a block whose slots were reused."),
    Rule("PAGED-CONSERVE",
         "available() plus the number of distinct block ids held in live tables equals num_blocks; with per-group "
         "pools, pool by pool (available() is then one count per group).",
         "Every block is free, cached or held, and each once: a block counted twice or lost shows as a pool that "
         "grows or shrinks.",
         "A leaked block after a refusal or a free; a shared block freed twice into the free list."),
    Rule("PAGED-ATOMIC",
         "A refused (malformed) call changes nothing: available(), every live table and every reference count are "
         "as before. A refusal (None) changes nothing either - a refused admission leaves the request not live - "
         "but the releases a window group may make at any time (PAGED-WINDOW-RELEASE): block indexes whose "
         "positions all lie before every window their request still needs may turn None, and available() grows "
         "by exactly the blocks no live table holds any more; every other entry and count stays.",
         "A scheduler retries a refused request later or stops; blocks taken by a refusal leak, and a half-made "
         "table serves garbage. Releasing what no window reads is always allowed (vLLM's allocate_slots does it "
         "before it checks the fit), so a refusal may grow available(), never shrink it.",
         "Blocks allocated for part of a request that was then refused; a hit's blocks touched by a refusal."),
    Rule("PAGED-FREE",
         "free(request) of a live request ends it and releases each of its references exactly once; free of a "
         "request not live (never admitted, or already freed) is refused.",
         "Every block a request held is returned once: twice frees a block another request holds, never leaks it.",
         "A double free putting a shared block in the free list; a free of an unknown id that releases something."),
    Rule("PAGED-WINDOW-RELEASE",
         "A window group releases (maps to None) only block indexes whose positions all lie before every window "
         "the request still needs; a full group releases nothing of a live request.",
         "Sliding-window groups hand blocks back as they leave the window; one released early is read by the next "
         "token.",
         "A window block released one block early; a window measured as W positions where W - 1 are read."),
    Rule("PAGED-IDLE-FIT",
         "With no other request live, an admission or extension is not refused when the whole request fits the "
         "pool - every group holding each of its tokens (all of them, not the budget's chunk) in whole blocks; "
         "with per-group pools, each group's pool.",
         "A refusal says 'not now': on an idle pool that can hold the request, now is the best there will be, and a "
         "target that refuses everything would otherwise never be wrong; a chunked prefill whose whole prompt can "
         "never fit is futile, so its first chunk may be refused (vLLM reserves the whole prompt).",
         "A cache that leaks blocks until it refuses every request; a watermark that refuses on an empty pool."),
)
RULES = RULES + OP_RULES + RECOMPUTE_RULES + SCOPE_RULES + PAGED_RULES
# The scope rules that bind the conformance suite (what it sends a target declaring a scope item, and what that
# target owes) rather than a call of a cache: no model or reference cites them (spec/trace.py, EXEMPTIONS).
DECLARATION_RULES: tuple[str, ...] = tuple(rule.id for rule in SCOPE_RULES if rule.id != "SCOPE-BORDER")

BY_ID: dict[str, Rule] = {rule.id: rule for rule in RULES}
assert len(BY_ID) == len(RULES), "rule ids are unique"
