"""Tensor backends that execute a cache's plans (examples beside the reference, not part of it).

Import a backend module directly (`from kvcache.backends.numpy_backend import NumpyBackend`); this
package imports nothing, so `import kvcache` never imports numpy.
"""
