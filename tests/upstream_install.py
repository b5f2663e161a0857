"""The upstream extra (torch, and executorch installed with --no-deps) as the tests that need it ask for it."""

from __future__ import annotations

import importlib
import os

import pytest

INSTALL = "pip install torch==2.13.0 ruamel.yaml flatbuffers tabulate && pip install --no-deps executorch==1.5.1"


def import_or_skip(*modules: str) -> None:
    """Import torch and `modules`, or skip the calling test module with the reason - except where
    KVCACHE_REQUIRE_UPSTREAM=1 (CI's upstream stage, which installs them): there a missing install fails."""
    try:
        for name in ("torch", *modules):
            importlib.import_module(name)
    except ImportError as missing:
        if os.environ.get("KVCACHE_REQUIRE_UPSTREAM") == "1":
            raise   # the upstream stage installed them: a missing module is a failure, never a skip
        pytest.skip(f"the upstream extra is not installed ({missing}): {INSTALL}", allow_module_level=True)
