"""pytest plugin entry point (the conformance issue adds --kvcache-target)."""
