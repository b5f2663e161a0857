"""Process-global registries of caches and cache builders (thread-safe), and a scoped session.

REG-KEYS: builders are keyed by the pair (backend_id, kind), never by a joined string, so
("a:b", "c") and ("a", "b:c") are different keys; `make_unique_key` is unique across threads.
"""

from __future__ import annotations

import itertools
import threading
from types import TracebackType
from typing import Callable, Optional

import icontract

from ._errors import ArgumentTypeError
from ._faces import CacheBase, SequenceControl
from .et import Error, Result

CacheBuilder = Callable[[], CacheBase]


def _check_str(argument: str, value: object) -> None:
    if not isinstance(value, str):
        raise ArgumentTypeError("ARG-TYPE", argument, "must be a str", value=value, type=type(value).__name__)


class CacheRegistry:
    """Key -> cache, guarded by a lock. `install` overwrites; `get` returns None when missing."""

    _lock = threading.Lock()
    _caches: dict[str, CacheBase] = {}

    @classmethod
    def install(cls, key: str, cache: CacheBase) -> None:
        _check_str("key", key)
        if not isinstance(cache, CacheBase):
            raise ArgumentTypeError("ARG-TYPE", "cache", "must be a CacheBase", value=cache)
        with cls._lock:
            cls._caches[key] = cache

    @classmethod
    def get(cls, key: str) -> Optional[CacheBase]:
        _check_str("key", key)
        with cls._lock:
            return cls._caches.get(key)

    @classmethod
    def erase(cls, key: str) -> None:
        _check_str("key", key)
        with cls._lock:
            cls._caches.pop(key, None)


class CacheBuilderRegistry:
    """(backend_id, kind) -> builder. `build` calls the builder outside the lock."""

    _lock = threading.Lock()
    _builders: dict[tuple[str, str], CacheBuilder] = {}

    @classmethod
    def register(cls, backend_id: str, kind: str, builder: CacheBuilder) -> None:
        _check_str("backend_id", backend_id)
        _check_str("kind", kind)
        if not callable(builder):
            raise ArgumentTypeError("ARG-TYPE", "builder", "must be callable", value=builder)
        with cls._lock:
            cls._builders[(backend_id, kind)] = builder

    @classmethod
    def unregister(cls, backend_id: str, kind: str) -> None:
        with cls._lock:
            cls._builders.pop((backend_id, kind), None)

    @classmethod
    def build(cls, backend_id: str, kind: str) -> Result[CacheBase]:
        """The built cache, or NotFound when no builder is registered for the pair."""
        _check_str("backend_id", backend_id)
        _check_str("kind", kind)
        with cls._lock:
            builder = cls._builders.get((backend_id, kind))
        if builder is None:
            return Result(_error=Error.NotFound)
        return Result(builder())


_key_counter = itertools.count()
_key_lock = threading.Lock()


def make_unique_key() -> str:
    """A key "cache-<n>" no other call in this process returns."""
    with _key_lock:
        return f"cache-{next(_key_counter)}"


class CacheSession:
    """Installs `cache` under `key` for the duration of a `with` block; erases it on exit."""

    @icontract.ensure(lambda self: CacheRegistry.get(self.key) is self.cache,
                      "REG-SESSION: the cache is installed under its key")
    def __init__(self, key: str, cache: CacheBase) -> None:
        _check_str("key", key)
        self.key = key
        self.cache = cache
        CacheRegistry.install(key, cache)

    def control(self) -> SequenceControl:
        """The sequence runner's face of the session's cache (a cell cache has none: use its
        `as_batch_control()`)."""
        control = self.cache.as_control()
        if control is None:
            raise ArgumentTypeError("ARG-TYPE", "cache", "has no sequence runner face (as_control() is None)",
                                    type=type(self.cache).__name__)
        return control

    @icontract.ensure(lambda self: CacheRegistry.get(self.key) is not self.cache,
                      "REG-SESSION: the cache is erased on exit")
    def close(self) -> None:
        CacheRegistry.erase(self.key)

    def __enter__(self) -> CacheSession:
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                 traceback: Optional[TracebackType]) -> None:
        self.close()

    def __copy__(self) -> CacheSession:
        raise TypeError("CacheSession is not copyable: it owns its registry entry")

    def __deepcopy__(self, memo: object) -> CacheSession:
        raise TypeError("CacheSession is not copyable: it owns its registry entry")
