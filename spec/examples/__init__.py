"""Runnable examples: driving a cache (pasted into docs/using-the-reference.md) and a 40-line op-face cache
(the README's skeleton); tests/test_examples.py and tests/test_readme.py run them."""
