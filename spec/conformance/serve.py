"""Serve a Python cache over the conformance protocol (spec/PROTOCOL.md) on stdin/stdout.

    python -m kvcache_spec.conformance.serve [python:MODULE:FACTORY]      (default: the reference)

It is the protocol's reference server: the suite's own subprocess tests run it, and it runs a
Python target out of process (so a target that hangs cannot hang the harness). The target's own
stdout goes to the log (stderr): only the server writes the protocol channel.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any, Optional, TextIO

from ..rules import BY_ID
from . import scope as scopes
from . import wire
from .configs import config, layer
from .targets import (FACE_METHODS, OP_LAYOUTS, OPTIONAL_METHODS, OPTIONAL_PARAMS, PROTOCOL_NAME, PROTOCOL_VERSION,
                      SIDE_VERBS, PythonTarget, TargetCrash, TargetError)


# the smallest paged config (PROTOCOL.md, "Paged targets"): built once to see which optional methods it has
PAGED_PROBE = {"block_size": 1, "num_blocks": 1, "max_model_len": 1, "groups": [{"kind": "full"}],
               "prefix_caching": False}
BRACKETED = re.compile(r"\[([^\[\]]*)\]")


class Server:
    def __init__(self, spec: str) -> None:
        self.target = PythonTarget(spec)
        self.created = False
        self.op = self.target.layout in OP_LAYOUTS   # tensors cross as wire tensors (wire.py)
        self.face_methods = FACE_METHODS[self.target.layout]   # the factory's kvcache_layout
        self.methods: list[str] = []
        if self.op:   # the op face has no optional methods to probe for
            return
        inside = layer("flat") if "flat" in self.target.scope.features else layer("ring", 1)   # its own scope
        cell = {"max_seqs": self.target.scope.max_seqs or 1} if self.target.layout == "cell" else {}   # in scope
        probe = self.target.create(PAGED_PROBE if self.target.layout == "paged" else {**config(1, [inside]), **cell})
        self.methods = sorted(self.target.optional) if probe.ok else []
        self.target.cache = None

    def handle(self, request: Any) -> Optional[dict[str, Any]]:
        """One request object -> one response object (None after bye)."""
        if not isinstance(request, dict) or not isinstance(request.get("method"), str):
            return {"id": request.get("id") if isinstance(request, dict) else None,
                    "error": {"kind": "protocol", "message": "a request is {id, method, params}"}}
        rid, method, params = request.get("id"), request["method"], request.get("params") or {}

        def error(kind: str, message: str, rule: Optional[str] = None) -> dict[str, Any]:
            return {"id": rid, "error": {"kind": kind, "rule": rule, "message": message}}

        if method == "hello":
            if PROTOCOL_VERSION not in params.get("versions", []):
                return error("protocol", f"this server speaks version {PROTOCOL_VERSION} only")
            hello = {"protocol": PROTOCOL_NAME, "version": PROTOCOL_VERSION,
                     "implementation": self.target.name, "methods": self.methods}
            if self.target.layout != "sequence":   # said only when not the default: older harnesses read as before
                hello["layout"] = self.target.layout
            scope = self.target.scope   # the factory's kvcache_scope (scope.py): said unless it is the default
            if not scope.full_for(self.target.layout) or scope.version != scopes.UNDECLARED_VERSION:
                hello["scope"] = scope.announced()
            return {"id": rid, "result": hello}
        if method == "bye":
            return {"id": rid, "result": None}
        if method == "create":
            created = self.target.create(params.get("config") or {})
            self.created = created.ok
            return {"id": rid, "result": None} if created.ok else error("rejected", created.error, _rule(created.error))
        if method == "reset" and not self.op:   # the op face's reset is a face method: it empties the cache
            self.target.cache, self.created = None, False
            return {"id": rid, "result": None}
        if method not in self.face_methods:
            return error("protocol", f"unknown method {method!r}")
        if method in OPTIONAL_METHODS and method not in self.methods:
            return error("unsupported", f"{method} is not implemented")
        side = self.op and method in SIDE_VERBS   # the side cache's verbs: aside and swap need no live cache
        if not self.created and not (side and method in ("aside", "swap")):
            return error("protocol", "no cache: send create first")
        names = self.face_methods[method]
        if any(name not in params and name not in OPTIONAL_PARAMS for name in names):
            return error("protocol", f"{method} takes {names}")
        args = {name: params.get(name) for name in names}
        if self.op:
            try:
                args = {name: wire.from_wire(value, name) if name in wire.TENSOR_PARAMS else
                        wire.state_from_wire(value, name) if method == "load_state" else value
                        for name, value in args.items()}
            except wire.WireError as wrong:
                return error("protocol", str(wrong))
        outcome = self.target.call(method, args)
        if side:
            self.created = self.target.cache is not None
        if not outcome.ok:
            return error("rejected", outcome.error, _rule(outcome.error))
        if self.op and method == "state" and isinstance(outcome.value, (bytes, bytearray)):   # OP-STATE: base64
            return {"id": rid, "result": wire.state_to_wire(outcome.value)}
        if self.op and method == "update_and_fetch":
            try:
                return {"id": rid, "result": wire.answer_to_wire(outcome.value)}
            except (wire.WireError, TypeError, ValueError) as unencodable:
                why = f"{type(outcome.value).__name__}: {unencodable}"
                return {"id": rid, "result": {"unreadable": why}}
        return {"id": rid, "result": outcome.value}


def _rule(message: str) -> Optional[str]:
    """The first rule id of the spec in brackets in an error message ('... [LAYER-RANGE] ...'), or None:
    a bracketed shape ('[2, 3]') is no rule."""
    return next((word for word in BRACKETED.findall(message) if word in BY_ID), None)


def serve(spec: str, stdin: TextIO, stdout: TextIO) -> int:
    try:
        server = Server(spec)
        for line in stdin:
            try:
                request = json.loads(line)
            except ValueError:
                request = None
            response = server.handle(request)
            stdout.write(json.dumps(response) + "\n")
            stdout.flush()
            if isinstance(request, dict) and request.get("method") == "bye":
                break
    except TargetCrash as crash:   # the target exited or raised a BaseException: die as it would have
        print(f"kvcache serve: {crash}", file=sys.stderr)
        return 70
    return 0


def protocol_channel() -> TextIO:
    """Own the protocol channel: a duplicate of the real stdout carries the protocol, while fd 1 and
    sys.stdout go to stderr (the log). A target's print() - or a C extension writing to fd 1 - then
    lands in the log instead of corrupting a response."""
    sys.stdout.flush()
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return channel


USAGE = "usage: python -m kvcache_spec.conformance.serve [python:MODULE:FACTORY]   (default: the reference)"


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if len(args) > 1 or (args and not args[0].startswith("python:")):
        print(f"kvcache serve: {USAGE}", file=sys.stderr)
        return 2
    try:
        return serve(args[0] if args else "python:kvcache:SequenceCache", sys.stdin, protocol_channel())
    except TargetError as error:   # the target cannot be loaded: before any protocol line
        print(f"kvcache serve: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
