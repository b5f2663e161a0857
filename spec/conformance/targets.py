"""Targets: the implementation under test, behind one small interface.

`python:MODULE:FACTORY` calls FACTORY(kvcache.CacheConfig) in this process; `cmd:COMMAND` runs a
subprocess speaking the JSON-lines protocol of spec/PROTOCOL.md. Both give `Outcome`s with JSON-like
values (a plan is {"write": [[start, len], ...], "read": [...], "read_base_pos": n}), so the engine
never sees a target's own types. A subprocess that crashes, hangs, writes garbage, speaks another
protocol version or exits raises `TargetCrash`; the target is killed (whole process group) and reaped.
"""

from __future__ import annotations

import abc
import collections
import contextlib
import ctypes
import importlib
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any, Callable, Iterator, Optional

from .. import model
from ..target_contract import foreign_plan, read_plan
from . import scope as scopes
from .configs import JsonConfig, to_kvcache

PROTOCOL_NAME = "kvcache-conformance"
PROTOCOL_VERSION = 1
# Methods a target may leave out (announced in hello's `methods`). `live` is the cell layout's: upstream's
# cell cache (PR #21902) keeps its live set private; its live ids are then seen only through the verbs.
OPTIONAL_METHODS = ("length", "depth", "retained_from", "live", "ref_counts")
MAX_LINE_BYTES = 1 << 20          # a response line longer than this is garbage
STDERR_KEEP_BYTES = 16 << 10      # the tail of the target's log kept for findings


@dataclass(frozen=True)
class Outcome:
    """What a call did: returned `value` (ok), or raised / answered an error (not ok)."""

    ok: bool
    value: Any = None
    error: str = ""


class TargetCrash(Exception):
    """The target died, hung past its timeout, or broke the protocol."""


class TargetError(Exception):
    """The target cannot be loaded or started at all (a usage or environment error)."""


class HarnessInterrupted(BaseException):
    """The harness got SIGTERM, SIGINT or SIGHUP: stop now, kill the target, write a partial report.

    A BaseException, and re-raised untouched by `PythonTarget`, so the harness's own stop is never
    blamed on an in-process target (a target's own SystemExit or KeyboardInterrupt is a finding)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signal_name = signal.Signals(signum).name


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """While the suite runs: SIGTERM, SIGINT and SIGHUP raise `HarnessInterrupted` once; later ones are
    ignored while the harness kills its target and writes the partial report. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Optional[FrameType]) -> None:
        for number in STOP_SIGNALS:
            signal.signal(number, signal.SIG_IGN)
        raise HarnessInterrupted(signum)

    previous = {number: signal.signal(number, handler) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


#: What an in-process target must not take from the harness: its stop signals and its safety alarm.
KEPT_SIGNALS = STOP_SIGNALS + (signal.SIGALRM,)
#: signal.getsignal without its enum conversion (the C function; typeshed has no stub for `_signal`).
_getsignal: Callable[[int], Any] = importlib.import_module("_signal").getsignal


def harness_handlers() -> Optional[tuple[Any, ...]]:
    """The harness's handlers of KEPT_SIGNALS before a call into an in-process target (main thread only;
    `_signal.getsignal`: signal.getsignal's enum conversion would cost a fifth of a cell run)."""
    if threading.get_ident() != threading.main_thread().ident:
        return None
    return tuple(_getsignal(number) for number in KEPT_SIGNALS)


def restore_handlers(kept: Optional[tuple[Any, ...]]) -> None:
    """A handler the target installed (SIG_IGN on SIGTERM, say) is undone when its call returns, so the
    harness still stops on its signals."""
    if kept is None:
        return
    for number, handler in zip(KEPT_SIGNALS, kept):
        if _getsignal(number) is not handler:
            signal.signal(number, handler)


@contextlib.contextmanager
def safety_alarm(seconds: float) -> Iterator[None]:
    """The wall-clock safety net, also inside a call: after `seconds`, SIGALRM raises
    `HarnessInterrupted` (SIGALRM) - even out of an in-process target's endless loop, which no
    per-request timeout bounds. Main thread with setitimer only; elsewhere the suite checks the net
    between programs."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return
    armed = True

    def handler(signum: int, frame: Optional[FrameType]) -> None:
        if armed:
            raise HarnessInterrupted(signum)

    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def signal_text(code: Optional[int]) -> str:
    """An exit status as words: 'killed by SIGSEGV', 'exit code 3'."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def die_with_parent() -> None:
    """PR_SET_PDEATHSIG (Linux; elsewhere a no-op): this process gets SIGKILL when its parent dies, even
    by SIGKILL. As a target's preexec_fn, a hung target is never orphaned (elsewhere the closed stdin -
    PROTOCOL.md: exit on end of input - does it); `kvcache verify` gives it to the processes it starts."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)   # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


LAYOUTS = ("sequence", "cell", "op-contiguous", "op-cell", "cell-recompute", "paged")   # the layouts a target may implement (PROTOCOL.md)
OP_LAYOUTS = ("op-contiguous", "op-cell")   # python: targets only: the op face passes tensors
JSON_CONFIG_LAYOUTS = OP_LAYOUTS + ("cell-recompute", "paged")   # a python: factory of these gets the JSON config
# The protocol's methods of each layout and their parameters (PROTOCOL.md, "Methods", "Cell methods");
# a parameter in OPTIONAL_PARAMS may be left out (null).
FACE_METHODS: dict[str, dict[str, tuple[str, ...]]] = {
    "sequence": {"can_extend": ("n",), "capacity": (), "length": (), "rewind": ("new_len",), "clear": (),
                 "plan": ("layer", "position", "T"), "commit": ("plan",), "depth": ("layer",),
                 "retained_from": ("layer",), "faces": ()},
    "cell": {"declare_step": ("seq_ids",), "place_step": ("layer", "positions"), "seq_new": (),
             "seq_clone": ("src", "upto"), "seq_rm": ("seq_id", "p0", "p1"), "seq_len": ("seq_id",),
             "next_pos": ("seq_id",), "free_cells": (), "used_end": (), "live": (), "can_extend": ("n",),
             "capacity": (), "clear": (), "faces": ()},
    # the op face (spec/op_model.py; PROTOCOL.md, "Op-face targets"): upstream's method names, arguments in order
    "op-contiguous": {"update_and_fetch": ("layer_id", "k", "v", "position"), "used": ("layer_id",), "reset": (),
                      "trim": ("n",), "state": (), "load_state": ("data",), "pad": ("left_padding",),
                      "select": ("rows",), "reorder": ("rows",), "repeat": ("times",), "quantize": ("bits",),
                      # OP-ROWS' extend and extract (feature `merge`): the harness verbs of the side cache
                      "aside": (), "swap": (), "extend": (), "extract": ("row",)},
    "op-cell": {"update_and_fetch": ("layer_id", "k", "v", "position"), "begin_step": ("seq_ids",),
                "seq_cp": ("src", "dst", "upto"), "seq_rm": ("seq", "p0", "p1"), "seq_len": ("seq",),
                "free_cells": (), "reset": ()},
    # a cell cache seen only through its outputs (SPEC.md 5.3; cell/recompute.py): llama.cpp's verbs
    "cell-recompute": {"decode": ("seq_ids", "positions", "tokens"), "recompute": ("tokens", "positions"),
                       "seq_cp": ("src", "dst", "upto"), "seq_rm": ("seq", "p0", "p1"), "next_pos": ("seq",),
                       "seq_keep": ("seq",), "seq_add": ("seq", "p0", "p1", "delta"), "clear": (),
                       "seq_save": ("seq", "file"), "seq_load": ("seq", "data", "file")},
    # a serving engine's paged KV memory (spec/paged_model.py; paged/engine.py): requests over a block pool
    "paged": {"admit": ("request", "tokens", "keys", "budget"), "extend": ("request", "tokens", "budget"),
              "free": ("request",), "table": ("request",), "available": (), "ref_counts": ()},
}
OPTIONAL_PARAMS = ("upto", "p1")
# The methods a scope feature adds (scope.py): called only on a target that declares the feature.
FEATURE_METHODS = {"trim": "trim", "state": "state", "load_state": "state", "pad": "pad", "select": "select",
                   "reorder": "batch-verbs", "repeat": "batch-verbs", "quantize": "quantize",
                   "seq_save": "seq-state", "seq_load": "seq-state",
                   "aside": "merge", "swap": "merge", "extend": "merge", "extract": "merge"}   # method -> its feature
# The side cache's verbs (feature `merge`; PROTOCOL.md, "Op-face targets"): a target holds a second cache beside
# the live one. aside(): the live cache becomes the side cache (the previous one dropped), none live until the
# next create; swap(): live and side exchange; extend(): the live cache's extend(side), the side cache left as it
# is; extract(row): the live cache's extract(row) becomes the side cache. create replaces the live cache only.
SIDE_VERBS = ("aside", "swap", "extend", "extract")


class Target(abc.ABC):
    name: str
    layout: str = "sequence"            # a python: factory's `kvcache_layout`, a cmd: target's hello
    optional: frozenset[str] = frozenset(OPTIONAL_METHODS)
    scope: scopes.Scope = scopes.FULL   # what the target declares it implements (scope.py)

    def declared_scope(self) -> scopes.Scope:
        """The scope the target declares (a subprocess is started to read its handshake)."""
        return self.scope

    validates_configs = False   # True: it gets JSON configs, so the spec's CFG-* checks are its own

    def fresh(self) -> None:
        """Drop any state shared between programs (a subprocess is killed; the next create restarts it)."""

    def kill(self) -> None:
        """Stop the target now (the harness is interrupted): no goodbye, no waiting."""
        self.close()

    @abc.abstractmethod
    def create(self, cfg: JsonConfig) -> Outcome:
        """Build a fresh cache from `cfg` (replacing the current one)."""

    @abc.abstractmethod
    def call(self, method: str, args: dict[str, Any]) -> Outcome:
        """Call one face method on the current cache."""

    def close(self) -> None:
        """Release the target (end a subprocess)."""

    def log_tail(self) -> str:
        return ""


class ModelAsTarget(Target):
    """A layout's model as a target (its modeltarget.py): the golden vectors' answers, and a sanity
    target for the engine. The layout gives the model's reading of a config, its initial state and
    the answer of each call."""

    def __init__(self) -> None:
        self.cfg: Any = None
        self.state: Any = None

    def configured(self, cfg: JsonConfig) -> Any:
        """The model's configuration, or its Rejected (with `rule` and `argument`)."""
        raise NotImplementedError

    def initial(self, made: Any) -> Any:
        raise NotImplementedError

    def create(self, cfg: JsonConfig) -> Outcome:
        made = self.configured(cfg)
        if isinstance(made, model.Rejected):
            return Outcome(False, error=f"[{made.rule}] {made.argument}")
        self.cfg, self.state = made, self.initial(made)
        return Outcome(True)


# --- plans as JSON --------------------------------------------------------------------------------

def plan_to_json(plan: Any) -> Any:
    """A target's plan object as JSON, read by the Python target contract (`kvcache_spec.target_contract`);
    a plan that breaks it comes back as {"unreadable": what is wrong}, which the engine fails (PLAN-SHAPE)."""
    if plan is None:
        return None
    value = read_plan(plan)
    if isinstance(value, str):
        return {"unreadable": value}
    return {"write": [list(run) for run in value.write], "read": [list(run) for run in value.read],
            "read_base_pos": value.read_base_pos}


def plan_key(plan: Any) -> str:
    return json.dumps(plan, sort_keys=True)


def cell_step_to_json(step: Any) -> Any:
    """A target's CellStep as JSON ({"length", "read_len", "cells", "mask_bits"}); one without those
    fields comes back as {"unreadable": what is wrong}, which the engine fails (CELL-STEP-SHAPE)."""
    if step is None:
        return None
    try:
        return {"length": step.length, "read_len": step.read_len, "cells": list(step.cells),
                "mask_bits": list(bytes(step.mask_bits))}
    except (AttributeError, TypeError, ValueError) as error:
        return {"unreadable": f"{type(step).__name__}: {error}"}


# --- Python targets -------------------------------------------------------------------------------

def import_target_module(module_name: str) -> Any:
    """The module of a python: target, found from the current directory too when it is not on sys.path
    (the `kvcache` console script does not put it there; `python -m` and `--isolate`'s served process
    do), so a target loads the same in process and isolated."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name != module_name.split(".")[0] or os.getcwd() in sys.path:
            raise
        sys.path.insert(0, os.getcwd())
        return importlib.import_module(module_name)


class PythonTarget(Target):
    """FACTORY(config) -> an object with SequenceCache's public methods; exceptions count as errors."""

    def __init__(self, spec: str) -> None:
        self.name = spec
        try:
            _, module_name, factory_name = spec.split(":", 2)
            self.factory = getattr(import_target_module(module_name), factory_name)
        except (ValueError, ImportError, AttributeError) as error:
            raise TargetError(f"cannot load {spec!r}: {error}") from error
        try:
            self.scope = scopes.from_factory(self.factory)
        except scopes.ScopeError as error:
            raise TargetError(f"{spec}: kvcache_scope: {error}") from error
        self.layout = getattr(self.factory, "kvcache_layout", "sequence")
        if self.layout not in LAYOUTS:
            raise TargetError(f"{spec}: kvcache_layout is {self.layout!r}, not one of {LAYOUTS}")
        try:
            scopes.check_layout(self.scope, self.layout)
        except scopes.ScopeError as error:
            raise TargetError(f"{spec}: kvcache_scope: {error}") from error
        self.cache: Any = None
        self.side: Any = None   # the side cache (SIDE_VERBS): dropped by fresh(), kept by create
        self.issued: dict[str, Any] = {}   # plan JSON -> the target's own plan object
        # an op-face factory gets the JSON config (it builds its own config object, so it validates it)
        # and says which tensors it takes: "numpy" (the default) or "torch"
        self.validates_configs = self.layout in JSON_CONFIG_LAYOUTS
        self.tensors = getattr(self.factory, "kvcache_tensors", "numpy")
        if self.tensors not in ("numpy", "torch"):
            raise TargetError(f"{spec}: kvcache_tensors is {self.tensors!r}, not 'numpy' or 'torch'")

    def fresh(self) -> None:
        self.side = None   # a new program starts with no side cache

    def create(self, cfg: JsonConfig) -> Outcome:
        kept = harness_handlers()
        try:
            return self._create(cfg)
        except HarnessInterrupted:
            kept = None   # the stop handler has set the handlers it wants
            raise
        finally:
            restore_handlers(kept)

    def _create(self, cfg: JsonConfig) -> Outcome:
        self.cache, self.issued = None, {}
        try:
            if self.layout in JSON_CONFIG_LAYOUTS:   # the op, recompute and paged faces build their own from the JSON
                self.cache = self.factory(dict(cfg))
                if self.layout == "paged":   # its optional ref_counts(), as for the other layouts' optional methods
                    self.optional = frozenset(m for m in OPTIONAL_METHODS if callable(getattr(self.cache, m, None)))
                return Outcome(True)
            config = to_kvcache(cfg)
            # a cell config carries max_seqs (CELL-MAX-SEQS), handed over unchecked: the target checks it
            self.cache = self.factory(config, **({"max_seqs": cfg["max_seqs"]} if "max_seqs" in cfg else {}))
        except HarnessInterrupted:
            raise
        except Exception as error:
            return Outcome(False, error=f"{type(error).__name__}: {error}")
        except BaseException as error:   # SystemExit, KeyboardInterrupt, ... raised by the target itself
            raise _base_crash(error) from None
        self.optional = frozenset(m for m in OPTIONAL_METHODS if callable(getattr(self.cache, m, None)))
        return Outcome(True)

    def _plan_object(self, value: Any) -> Any:
        """The plan to hand to commit (the Python target contract): the target's own object when it issued
        this one, else a foreign (forged) one."""
        if not isinstance(value, dict):
            return value
        issued = self.issued.get(plan_key(value))
        return issued if issued is not None else foreign_plan(value)

    def call(self, method: str, args: dict[str, Any]) -> Outcome:
        kept = harness_handlers()
        try:
            return self._call(method, args)
        except HarnessInterrupted:
            kept = None   # the stop handler has set the handlers it wants
            raise
        finally:
            restore_handlers(kept)

    def _call(self, method: str, args: dict[str, Any]) -> Outcome:
        cache = self.cache
        try:
            if method == "faces" and self.layout == "cell":
                return Outcome(True, {"same_object": cache.as_batch_control() is cache.as_cell_stepper()})
            if method == "faces":
                return Outcome(True, {"same_object": cache.as_control() is cache.as_planner()})
            if method == "place_step":
                return Outcome(True, cell_step_to_json(cache.place_step(args["layer"], args["positions"])))
            if method == "live":
                live = cache.live()
                return Outcome(True, sorted(live) if isinstance(live, (set, frozenset)) else live)
            if method == "plan":
                result = cache.plan(args["layer"], args["position"], args["T"])
                value = plan_to_json(result)
                if value is not None:
                    self.issued[plan_key(value)] = result
                return Outcome(True, value)
            if method == "commit":
                return Outcome(True, cache.commit(self._plan_object(args["plan"])))
            if method in SIDE_VERBS and self.layout == "op-contiguous":
                return self._side_verb(method, args)
            if method == "update_and_fetch" and self.tensors == "torch":
                import torch   # only a target that asks for torch tensors needs torch installed
                args = {name: torch.from_numpy(value) if name in ("k", "v", "position") else value
                        for name, value in args.items()}
            function = getattr(cache, method)
            names = FACE_METHODS[self.layout].get(method)   # by name: a replayed call's params are sorted
            return Outcome(True, function(*(args.values() if names is None else (args.get(n) for n in names))))
        except HarnessInterrupted:
            raise
        except Exception as error:
            return Outcome(False, error=f"{type(error).__name__}: {error}")
        except BaseException as error:   # SystemExit, KeyboardInterrupt, ... raised by the target itself
            raise _base_crash(error) from None

    def _side_verb(self, method: str, args: dict[str, Any]) -> Outcome:
        """The side cache's verbs (SIDE_VERBS) on the objects themselves: the cache's own extend and extract."""
        if method == "aside":
            self.side, self.cache = self.cache, None
        elif method == "swap":
            self.cache, self.side = self.side, self.cache
        elif self.cache is None:
            raise RuntimeError(f"{method}: no live cache (create it first)")
        elif method == "extend":
            return Outcome(True, self.cache.extend(self.side))
        else:
            self.side = self.cache.extract(args.get("row"))
        return Outcome(True, None)


def _base_crash(error: BaseException) -> TargetCrash:
    if isinstance(error, SystemExit):
        return TargetCrash(f"the target called exit({error.code!r})")
    return TargetCrash(f"the target raised {type(error).__name__} (a BaseException): {error}"[:300])


# --- subprocess targets ---------------------------------------------------------------------------

class SubprocessTarget(Target):
    """A process speaking spec/PROTOCOL.md on stdin/stdout; its stderr is its log (kept, bounded)."""

    validates_configs = True

    def __init__(self, spec: str, timeout: float = 5.0, start_timeout: Optional[float] = None) -> None:
        self.name = spec
        try:
            self.argv = shlex.split(spec[len("cmd:"):] if spec.startswith("cmd:") else spec)
        except ValueError as error:   # unbalanced quotes, a trailing backslash
            raise TargetError(f"cannot parse the command {spec!r}: {error}") from None
        if not self.argv:
            raise TargetError("cmd: target needs a command")
        # Starting may load a runtime (a Python interpreter, a JIT): the handshake gets longer.
        self.timeout = timeout
        self.start_timeout = max(5 * timeout, 5.0) if start_timeout is None else start_timeout
        self.process: Optional[subprocess.Popen[bytes]] = None
        self.buffer = b""
        self.next_id = 0
        self.stderr_tail: collections.deque[bytes] = collections.deque()
        self.stderr_bytes = 0
        self.lock = threading.Lock()
        self.requests = 0
        self.starts = 0   # processes started (1 + restarts after crashes, hangs and fresh-process re-runs)
        self.info: dict[str, Any] = {}

    # -- process lifetime
    def _start(self) -> None:
        try:
            self.process = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, start_new_session=True, bufsize=0,
                                            preexec_fn=die_with_parent if sys.platform == "linux" else None)
        except OSError as error:
            raise TargetError(f"cannot start {self.argv!r}: {error}") from error
        self.starts += 1
        self.buffer = b""
        assert self.process.stdout is not None and self.process.stdin is not None
        os.set_blocking(self.process.stdout.fileno(), False)
        os.set_blocking(self.process.stdin.fileno(), False)
        threading.Thread(target=self._drain_stderr, args=(self.process,), daemon=True).start()
        hello = self._request("hello", {"protocol": PROTOCOL_NAME, "versions": [PROTOCOL_VERSION]},
                              self.start_timeout)
        result = hello.value if hello.ok else None
        if not isinstance(result, dict) or result.get("protocol") != PROTOCOL_NAME \
                or type(result.get("version")) is not int or result.get("version") != PROTOCOL_VERSION:
            self._kill()
            raise TargetCrash(f"protocol: handshake answered {hello.value if hello.ok else hello.error!r}, "
                              f"expected protocol {PROTOCOL_NAME!r} version {PROTOCOL_VERSION}")
        self.info = result
        self.layout = result.get("layout", "sequence")
        if self.layout not in LAYOUTS:
            self._kill()
            raise TargetCrash(f"protocol: hello: layout {self.layout!r} is not one of {list(LAYOUTS)}")
        try:
            self.scope = scopes.FULL if "scope" not in result else \
                scopes.parse(result["scope"], "declared in the target's hello")
            scopes.check_layout(self.scope, self.layout)
        except scopes.ScopeError as error:
            self._kill()
            raise TargetCrash(f"protocol: hello: {error}") from None
        methods = result.get("methods", [])
        self.optional = frozenset(m for m in OPTIONAL_METHODS if isinstance(methods, list) and m in methods)

    def _drain_stderr(self, process: subprocess.Popen[bytes]) -> None:
        """Keep reading the log so a chatty target never blocks on a full pipe; keep only the tail."""
        assert process.stderr is not None
        while True:
            chunk = process.stderr.read1(65536) if hasattr(process.stderr, "read1") else process.stderr.read(65536)
            if not chunk:
                return
            with self.lock:
                self.stderr_tail.append(chunk)
                self.stderr_bytes += len(chunk)
                kept = sum(len(c) for c in self.stderr_tail)
                while kept - len(self.stderr_tail[0]) >= STDERR_KEEP_BYTES:
                    kept -= len(self.stderr_tail.popleft())

    def log_tail(self) -> str:
        with self.lock:
            text = b"".join(self.stderr_tail)[-2000:].decode("utf-8", "replace")
        return text

    def _kill(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for stream in (process.stdin, process.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        process.wait()

    def fresh(self) -> None:
        self._kill()

    def kill(self) -> None:
        self._kill()

    def _crash(self, what: str) -> TargetCrash:
        process = self.process
        code = process.poll() if process is not None else None
        if process is not None and code is None and not what.startswith("hung"):
            try:   # a dying process: give it a moment, so the finding can name its signal
                code = process.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
        self._kill()
        detail = f" ({signal_text(code)})" if code is not None else ""
        tail = self.log_tail().strip()
        return TargetCrash(what + detail + (f"; stderr tail: {tail[-500:]!r}" if tail else ""))

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                self._request("bye", {}, 1.0)
            except TargetCrash:
                pass
        if self.process is not None:
            try:
                self.process.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
        self._kill()

    # -- one request, one response line
    def _write(self, data: bytes, deadline: float) -> None:
        assert self.process is not None and self.process.stdin is not None
        fd = self.process.stdin.fileno()
        while data:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._crash("hung: did not read its input within the timeout")
            _, ready, _ = select.select([], [fd], [], remaining)
            if not ready:
                continue
            try:
                written = os.write(fd, data)
            except (BrokenPipeError, ConnectionResetError):
                raise self._crash("exited: its input was closed") from None
            data = data[written:]

    def _read_line(self, deadline: float) -> bytes:
        assert self.process is not None and self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while b"\n" not in self.buffer:
            if len(self.buffer) > MAX_LINE_BYTES:
                raise self._crash(f"protocol: a response line longer than {MAX_LINE_BYTES} bytes")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                partial = f" (half a line: {self.buffer[:80]!r})" if self.buffer else ""
                raise self._crash(f"hung: no response within the timeout{partial}")
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                partial = f" after half a line {self.buffer[:80]!r}" if self.buffer else ""
                if self._still_running():
                    raise self._crash(f"closed its stdout while still running{partial}")
                raise self._crash(f"exited early: end of output{partial}")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line

    def _still_running(self, grace: float = 0.2) -> bool:
        """After end of output: has the process exited (it usually follows within moments)?"""
        assert self.process is not None
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            return True
        return False

    def _request(self, method: str, params: dict[str, Any], timeout: float) -> Outcome:
        if self.process is None:
            raise TargetCrash("not running")
        self.next_id += 1
        self.requests += 1
        request_id = self.next_id
        deadline = time.monotonic() + timeout
        self._write((json.dumps({"id": request_id, "method": method, "params": params}) + "\n").encode(), deadline)
        line = self._read_line(deadline)
        try:
            response = json.loads(line)
        except ValueError:
            raise self._crash(f"protocol: garbage instead of a JSON response to {method}: {line[:120]!r}") from None
        if not isinstance(response, dict) or response.get("id") != request_id \
                or ("result" in response) == ("error" in response):
            raise self._crash(f"protocol: malformed response to {method} (id {request_id}): {line[:200]!r}")
        if "error" in response:
            error = response["error"]
            if not isinstance(error, dict):
                raise self._crash(f"protocol: error is not an object: {line[:200]!r}")
            if error.get("kind") == "protocol":
                raise self._crash(f"protocol: the target does not understand {method}: {error.get('message')!r}")
            rule, message = error.get("rule"), error.get("message", "")
            return Outcome(False, error=f"[{rule}] {message}" if rule else str(message))
        return Outcome(True, response["result"])

    def declared_scope(self) -> scopes.Scope:
        if self.process is None:
            self._start()
        return self.scope

    def create(self, cfg: JsonConfig) -> Outcome:
        if self.process is None:
            self._start()
        return self._request("create", {"config": cfg}, self.timeout)

    def call(self, method: str, args: dict[str, Any]) -> Outcome:
        if self.layout not in OP_LAYOUTS:
            return self._request(method, args, self.timeout)
        # the op face: tensors cross as wire tensors (wire.py; PROTOCOL.md, "Op-face targets")
        from . import wire

        outcome = self._request(method, wire.args_to_wire(args), self.timeout)
        if method not in ("update_and_fetch", "state") or not outcome.ok:
            return outcome
        try:
            if method == "state":   # OP-STATE: the state's bytes as base64
                return Outcome(True, wire.state_from_wire(outcome.value, "state()'s answer"))
            return Outcome(True, wire.answer_from_wire(outcome.value))
        except wire.WireError as error:
            raise self._crash(f"protocol: {error}") from None


def parse_target(spec: str, timeout: float = 5.0, isolate: bool = False) -> Target:
    """`reference`, `python:MODULE:FACTORY` or `cmd:COMMAND`.

    isolate: run a Python target in a subprocess (the protocol server), so that a target that hangs
    or kills its interpreter is a crash finding instead of a hung or dead harness.
    """
    if spec in ("", "reference"):
        spec = "python:kvcache:SequenceCache"
    if spec.startswith("python:") and isolate:
        import sys
        return SubprocessTarget(f"cmd:{shlex.quote(sys.executable)} -m kvcache_spec.conformance.serve "
                                f"{shlex.quote(spec)}", timeout=timeout)
    if spec.startswith("python:"):
        return PythonTarget(spec)
    if spec.startswith("cmd:"):
        return SubprocessTarget(spec, timeout=timeout)
    raise TargetError(f"unknown target {spec!r}: use python:MODULE:FACTORY or cmd:COMMAND")
