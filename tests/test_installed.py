"""The package as a user installs it: the C++ driver found through the installed package (`kvcache cpp`,
`python -m kvcache_spec.cpp --includes`, the CMake config), and - in CI's second run, against the built
wheel (`.ci/run` sets KVCACHE_TEST_INSTALLED=1) - proof that the tests import the installed packages,
not the checkout's folders."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import kvcache
import kvcache_proofs
import kvcache_spec
from kvcache_spec import cpp
from kvcache_spec.conformance import vectors

GXX = shutil.which("g++")
CMAKE = shutil.which("cmake")
VECTORS = str(vectors.VECTORS_DIR / vectors.VECTORS_FILE)


def _printed(*args: str) -> str:
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _example(tmp_path: Path) -> Path:
    """The installed worked example, copied out of the package so that nothing but the include path can
    find the driver header (its own relative `#include "../kvcache_conformance.hpp"` becomes <...>)."""
    source = cpp.folder() / "example"
    for name in ("serve_reference_port.cpp", "reference_port.h", "cache.h"):
        shutil.copy(source / name, tmp_path / name)
    main = tmp_path / "serve_reference_port.cpp"
    text = main.read_text()
    assert text.count('#include "../kvcache_conformance.hpp"') == 1
    main.write_text(text.replace('#include "../kvcache_conformance.hpp"', "#include <kvcache_conformance.hpp>"))
    return main


def test_the_commands_print_the_installed_header_folder() -> None:
    folder = _printed("-m", "kvcache_spec.cli", "cpp", "--include")
    assert Path(folder) == cpp.folder() and (Path(folder) / cpp.HEADER).is_file()
    assert _printed("-m", "kvcache_spec.cpp", "--includes") == f"-I{folder}"
    assert Path(_printed("-m", "kvcache_spec.cpp", "--cmakedir"), cpp.CMAKE_CONFIG).is_file()
    assert cpp.main([]) == 2 and cpp.main(["--bogus"]) == 2


@pytest.mark.slow
@pytest.mark.skipif(GXX is None, reason="no g++ on PATH: compiling the C++ example needs a C++17 compiler")
def test_the_example_compiles_with_the_printed_include_path_and_replays_the_vectors(tmp_path: Path) -> None:
    main = _example(tmp_path)
    flags = _printed("-m", "kvcache_spec.cpp", "--includes").split()
    assert GXX is not None
    built = subprocess.run([GXX, "-std=c++17", "-O1", *flags, "-o", str(tmp_path / "port"), str(main)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    # and without the include path it does not compile: the flag is what finds the header
    bare = subprocess.run([GXX, "-std=c++17", "-fsyntax-only", str(main)], capture_output=True, text=True, timeout=300)
    assert bare.returncode != 0 and "kvcache_conformance.hpp" in bare.stderr
    replay = subprocess.run([str(tmp_path / "port"), "--vectors", VECTORS], capture_output=True, text=True, timeout=120)
    assert replay.returncode == 0, replay.stderr[-2000:]


CMAKELISTS = """cmake_minimum_required(VERSION 3.14)
project(kvcache_conformance_user CXX)
find_package(kvcache_conformance CONFIG REQUIRED)
add_executable(port serve_reference_port.cpp)
target_link_libraries(port PRIVATE kvcache_conformance::kvcache_conformance)
"""


@pytest.mark.slow
@pytest.mark.skipif(GXX is None or CMAKE is None, reason="needs cmake and g++ (find_package of the installed config)")
def test_cmake_find_package_uses_the_installed_config(tmp_path: Path) -> None:
    _example(tmp_path)
    (tmp_path / "CMakeLists.txt").write_text(CMAKELISTS)
    assert CMAKE is not None
    cmakedir = _printed("-m", "kvcache_spec.cpp", "--cmakedir")
    build = tmp_path / "build"
    configure = subprocess.run([CMAKE, "-S", str(tmp_path), "-B", str(build), f"-Dkvcache_conformance_DIR={cmakedir}",
                                "-DCMAKE_BUILD_TYPE=Release"], capture_output=True, text=True, timeout=300)
    assert configure.returncode == 0, configure.stdout[-2000:] + configure.stderr[-2000:]
    compiled = subprocess.run([CMAKE, "--build", str(build)], capture_output=True, text=True, timeout=300)
    assert compiled.returncode == 0, compiled.stdout[-3000:] + compiled.stderr[-2000:]
    replay = subprocess.run([str(build / "port"), "--vectors", VECTORS], capture_output=True, text=True, timeout=120)
    assert replay.returncode == 0, replay.stderr[-2000:]


@pytest.mark.skipif(os.environ.get("KVCACHE_TEST_INSTALLED") != "1",
                    reason="only in CI's run against the installed wheel (.ci/run sets KVCACHE_TEST_INSTALLED=1)")
def test_the_installed_run_imports_the_installed_packages() -> None:
    purelib = Path(sysconfig.get_paths()["purelib"]).resolve()
    for package in (kvcache, kvcache_spec, kvcache_proofs):
        where = Path(package.__file__ or "").resolve()
        assert where.is_relative_to(purelib) and "site-packages" in where.parts, (package.__name__, where)
    assert not list(purelib.glob("__editable__*kvcache_spec*"))  # not an editable install
