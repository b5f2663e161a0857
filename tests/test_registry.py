"""REG-KEYS, REG-SESSION, THREADS: the registries under concurrency."""

from __future__ import annotations

import threading

from kvcache import CacheBuilderRegistry, CacheRegistry, CacheSession, make_unique_key
from kvcache.et import Error

from .conftest import cache


def test_builder_keys_are_pairs() -> None:
    """REG-KEYS: ("a:b", "c") and ("a", "b:c") never collide, as a joined string would."""
    CacheBuilderRegistry.register("a:b", "c", lambda: cache(3))
    CacheBuilderRegistry.register("a", "b:c", lambda: cache(5))
    try:
        assert CacheBuilderRegistry.build("a:b", "c").get().as_control().capacity() == 3
        assert CacheBuilderRegistry.build("a", "b:c").get().as_control().capacity() == 5
        assert CacheBuilderRegistry.build("a:b:c", "").error() is Error.NotFound
    finally:
        CacheBuilderRegistry.unregister("a:b", "c")
        CacheBuilderRegistry.unregister("a", "b:c")


def test_unique_keys_across_threads() -> None:
    """REG-KEYS, THREADS: 8 threads x 2000 keys, all distinct."""
    keys: list[list[str]] = [[] for _ in range(8)]
    barrier = threading.Barrier(8)

    def take(out: list[str]) -> None:
        barrier.wait()
        out.extend(make_unique_key() for _ in range(2000))

    threads = [threading.Thread(target=take, args=(out,)) for out in keys]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [key for out in keys for key in out]
    assert len(set(every)) == len(every) == 16000


def test_registry_under_concurrent_sessions() -> None:
    """REG-SESSION, THREADS: concurrent sessions install and erase their own keys, and nothing leaks."""
    errors: list[str] = []
    barrier = threading.Barrier(6)

    def worker() -> None:
        barrier.wait()
        for _ in range(300):
            key = make_unique_key()
            with CacheSession(key, cache(4)) as session:
                if CacheRegistry.get(key) is not session.cache:
                    errors.append(key)
            if CacheRegistry.get(key) is not None:
                errors.append(key)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert not [key for key in CacheRegistry._caches if key.startswith("cache-")]


def test_build_calls_the_builder_outside_the_lock() -> None:
    """THREADS: a builder may itself use the registry without deadlocking."""
    def builder() -> object:
        CacheBuilderRegistry.build("nested", "missing")
        return cache(2)

    CacheBuilderRegistry.register("nested", "outer", builder)  # type: ignore[arg-type]
    try:
        assert CacheBuilderRegistry.build("nested", "outer").ok()
    finally:
        CacheBuilderRegistry.unregister("nested", "outer")
