"""Runnable examples of driving a cache (pasted into the README; tests/test_examples.py runs them)."""
