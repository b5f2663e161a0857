"""kvcache_spec: the normative spec of kvcache - rules as data (`rules`), an executable model (`model`)."""

from .rules import BY_ID, RULES, Rule

__all__ = ["BY_ID", "RULES", "Rule"]
