"""Where the installed C++ driver lives: `kvcache cpp --include` (or `python -m kvcache_spec.cpp --includes`).

The header-only driver `kvcache_conformance.hpp` and a CMake package config ship inside this package,
so a C++ project can build against the installed copy instead of a source checkout:

    g++ -std=c++17 $(python -m kvcache_spec.cpp --includes) -o my_target my_target.cpp
    cmake -Dkvcache_conformance_DIR="$(kvcache cpp --cmakedir)" ...   # find_package(kvcache_conformance)

Exit 0 with the answer on stdout; 2 on a usage error or when the header is not installed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

HEADER = "kvcache_conformance.hpp"
CMAKE_CONFIG = "kvcache_conformanceConfig.cmake"


def folder() -> Path:
    """The folder holding the installed driver header (and the CMake config): this package's own."""
    return Path(__file__).resolve().parent


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="kvcache cpp", description="Print where the installed C++ driver is.")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--include", action="store_true", help=f"the folder holding {HEADER} (for -I)")
    what.add_argument("--includes", action="store_true", help="the compiler flag: -I<that folder> (as pybind11)")
    what.add_argument("--cmakedir", action="store_true",
                      help=f"the folder holding {CMAKE_CONFIG} (kvcache_conformance_DIR, for find_package)")
    what.add_argument("--header", action="store_true", help=f"the path of {HEADER}")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return 0 if exit_.code == 0 else 2
    here = folder()
    needed = here / (CMAKE_CONFIG if args.cmakedir else HEADER)
    if not needed.is_file():
        print(f"kvcache cpp: {needed} is not installed", file=sys.stderr)
        return 2
    if args.includes:
        print(f"-I{here}")
    elif args.header:
        print(needed)
    else:
        print(here)
    return 0
