"""The `kvcache` command (filled in by the verification and conformance issues)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("usage: kvcache {verify,conformance,vectors} ...", file=sys.stderr)
    return 2
