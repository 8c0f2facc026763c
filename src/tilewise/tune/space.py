"""Search spaces (`Config`, `Param`, `Rule`, `Space`) live with the kernels that declare them: `tilewise.kernels.space`.

This name stays importable because users write `from tilewise.tune.space import Rule, Space` in their templates.
"""

from tilewise.kernels.space import Config, Param, Rule, RuleOrderError, Space, divides, named_space

__all__ = ["Config", "Param", "Rule", "RuleOrderError", "Space", "divides", "named_space"]
