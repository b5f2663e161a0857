"""Misbehaving subprocess targets: the harness must turn each into a clear crash finding, fast.

    python -m kvcache_spec.conformance.zoo.cmd MODE

MODE: crash-on-create, crash-mid-run, hang, half-line, garbage, wrong-version, wrong-id, exit-early,
deaf (never reads its input), flood-stderr (logs megabytes but otherwise conforms), huge-line,
hang-ignoring-sigterm [PIDFILE] (ignores SIGTERM and hangs on the first plan; writes its pid first),
version-true (answers the handshake with "version": true), refuse-create (rejects every config),
close-stdout (closes its stdout on the first commit and keeps running).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any, Optional

from ..serve import Server

MODES = ("crash-on-create", "crash-mid-run", "hang", "half-line", "garbage", "wrong-version", "wrong-id",
         "exit-early", "deaf", "flood-stderr", "huge-line", "hang-ignoring-sigterm", "version-true", "refuse-create",
         "close-stdout")


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    mode = args[0] if args else ""
    if mode not in MODES:
        print(f"usage: zoo_cmd {{{','.join(MODES)}}}", file=sys.stderr)
        return 2
    if mode == "deaf":
        time.sleep(3600)
        return 0
    if mode == "hang-ignoring-sigterm":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if len(args) > 1:
            with open(args[1], "w", encoding="utf-8") as pidfile:
                pidfile.write(str(os.getpid()))
    server = Server("python:kvcache:SequenceCache")
    count = 0
    for line in sys.stdin:
        request: Any = json.loads(line)
        method, count = request.get("method"), count + 1
        if mode == "flood-stderr":
            sys.stderr.write("log line of a chatty target\n" * 2000)
        if mode == "crash-on-create" and method == "create":
            os._exit(3)
        if mode == "crash-mid-run" and count == 40:
            os.abort()
        if mode in ("hang", "hang-ignoring-sigterm") and method == "plan":
            while True:
                time.sleep(3600)
        if mode == "refuse-create" and method == "create":
            _write(json.dumps({"id": request.get("id"), "error": {"kind": "rejected", "rule": None,
                                                                  "message": "not implemented"}}) + "\n")
            continue
        if mode == "close-stdout" and method == "commit":
            sys.stdout.close()
            os.close(1)
            time.sleep(3600)
        if mode == "half-line" and method == "plan":
            _write('{"id": ' + str(request.get("id")) + ', "res')
            time.sleep(3600)
        if mode == "garbage" and method == "rewind":
            _write("Segmentation fault (core dumped)\n")
            continue
        if mode == "exit-early" and method == "commit":
            return 0
        if mode == "huge-line" and method == "can_extend":
            _write("[" + "0," * (1 << 20))
            time.sleep(3600)
        response = server.handle(request)
        assert response is not None
        if mode == "wrong-version" and method == "hello":
            response["result"]["version"] = 99
        if mode == "version-true" and method == "hello":
            response["result"]["version"] = True
        if mode == "wrong-id" and method == "depth":
            response["id"] = -1
        _write(json.dumps(response) + "\n")
        if method == "bye":
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
