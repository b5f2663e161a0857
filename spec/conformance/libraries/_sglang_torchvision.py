"""A stand-in for torchvision, put in place only where torchvision cannot be imported, and never called.

SGLang 0.5.23's memory_pool.py reaches, through its model-config imports, multimodal code that imports
`torchvision.transforms` at module level (sglang/srt/multimodal/internvl_utils.py, configs/deepseek_ocr.py) and uses
it only inside image-preprocessing functions. The KV bookkeeping this suite drives never reaches them, and the
registry's torchvision wheel does not load against the CPU torch build (its `torchvision::nms` operator is missing).
Every name the stand-in hands out raises when called or used, so a call that did reach it would fail loudly instead
of computing anything.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from typing import Any, NoReturn

MODULES = ("torchvision", "torchvision.transforms", "torchvision.transforms.functional")


class NeverCalled:
    """What the stand-in gives for any public name: touching it past the import raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> "NeverCalled":
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return NeverCalled(f"{self._name}.{attribute}")

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise RuntimeError(f"{self._name} was called: the torchvision stand-in (kvcache_spec.conformance."
                           f"libraries._sglang_torchvision) serves imports only; install torchvision")


def _module(name: str) -> types.ModuleType:
    module = types.ModuleType(name, "stand-in: imports only, never called")
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__path__ = []

    def public(attribute: str) -> NeverCalled:
        if attribute.startswith("__"):      # introspection (__file__, __version__) finds nothing, as for a stub
            raise AttributeError(attribute)
        return NeverCalled(f"{name}.{attribute}")

    module.__getattr__ = public  # type: ignore[method-assign]
    return module


def install() -> bool:
    """Put the stand-in in sys.modules where torchvision is not importable; True when it did.

    transformers decides once (functools.lru_cache) whether torchvision is available, from find_spec, and then
    imports torchvision.transforms.v2 itself: it is asked first, while the answer is still the true one (no
    torchvision), so that it never reaches for the stand-in."""
    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is not None:
        return False
    from transformers.utils import import_utils
    import_utils.is_torchvision_available()
    modules = {name: _module(name) for name in MODULES}
    setattr(modules["torchvision"], "transforms", modules["torchvision.transforms"])
    setattr(modules["torchvision.transforms"], "functional", modules["torchvision.transforms.functional"])
    sys.modules.update(modules)
    return True
