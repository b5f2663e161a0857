"""Tensor backends that execute a cache's plans. Optional: each needs its extra (`kvcache-spec[numpy]`).

Import a backend module directly (`from kvcache.backends.numpy_backend import NumpyBackend`); this
package imports nothing, so `import kvcache` never needs numpy.
"""
