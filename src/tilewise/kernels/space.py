"""Search spaces as data: parameters with values, plus named rules that say which combinations are legal.

A kernel template states its parameters as `dict[str, list]` and every assumption its body makes as a
`Rule` (seed 003's `cfg_valid`, one guard per assumption). Legality runs before anything compiles and
says *which* assumption a config breaks, with the numbers:

    threads: threads = (BM/TM)*(BN/TN) = 2048 > max_invocations_per_workgroup 1024

Rules are evaluated in order. A rule may divide by values that earlier rules guarantee non-zero; when
an earlier rule has already failed, later rules that cannot even be evaluated (ZeroDivisionError,
ValueError) are skipped. A rule that raises although every earlier rule passed is a template bug and
raises `RuleOrderError`.
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tilewise.devices.base import Limits
from tilewise.errors import ConfigError

Check = Callable[["Config", "Limits | None"], bool]
Explain = Callable[["Config", "Limits | None"], str]


class RuleOrderError(RuntimeError):
    """A rule raised although every earlier rule passed: the rules are in the wrong order."""


def _plain_name(key: Any) -> bool:
    """A parameter name attribute syntax may reach directly: not private and not one of Config's own names."""
    return isinstance(key, str) and not key.startswith("_") and not hasattr(Config, key)


@functools.cache
def _plain_names(keys: tuple[Any, ...]) -> bool:
    return all(_plain_name(k) for k in keys)


class Config(Mapping[str, Any]):
    """An immutable, hashable assignment of parameter values, in the space's parameter order.

    Attribute access works (`cfg.BM`); equality and hash ignore the display format.
    """

    # `__dict__` holds the parameters that attribute syntax can reach without `__getattr__`: rules read them
    # millions of times in a legal enumeration, and a failed slot lookup plus `__getattr__` costs 20x a dict hit
    __slots__ = ("__dict__", "_d", "_fmt", "_hash", "_items")

    def __init__(self, items: Iterable[tuple[str, Any]] | Mapping[str, Any],
                 fmt: Callable[[Config], str] | None = None) -> None:
        pairs = tuple(items.items() if isinstance(items, Mapping) else items)
        d = dict(pairs)
        object.__setattr__(self, "_items", pairs)
        object.__setattr__(self, "_d", d)
        object.__setattr__(self, "_fmt", fmt)
        object.__setattr__(self, "_hash", hash(pairs))
        if _plain_names(tuple(d)):  # the usual case: one dict serves both
            object.__setattr__(self, "__dict__", d)
        else:  # a parameter named like a method (`get`) or private stays behind `__getattr__`, as before
            self.__dict__.update((k, v) for k, v in pairs if _plain_name(k))

    def __getitem__(self, key: str) -> Any:
        return self._d[key]

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):  # a slot not set yet (e.g. while unpickling): no lookup through _d
            raise AttributeError(key)
        try:
            return self._d[key]
        except KeyError:
            raise AttributeError(key) from None

    def __reduce__(self) -> tuple[Any, ...]:
        # rebuilt from its items, so the hash is this process's (string hashes differ between processes)
        return (Config, (self._items, self._fmt))

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError("Config is immutable; use .replace(**changes)")

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Config):
            return self._items == other._items
        if isinstance(other, Mapping):
            return dict(self._items) == dict(other)
        return NotImplemented

    def replace(self, **changes: Any) -> Config:
        unknown = set(changes) - set(self)
        if unknown:
            raise KeyError(f"unknown parameters {sorted(unknown)}")
        return Config(((k, changes.get(k, v)) for k, v in self._items), self._fmt)

    def key(self) -> str:
        """Canonical text form used as the store key (`BM=128,BN=64,...`)."""
        return ",".join(f"{k}={v}" for k, v in self._items)

    def __str__(self) -> str:
        return self._fmt(self) if self._fmt else " ".join(f"{k}={v}" for k, v in self._items)

    def __repr__(self) -> str:
        return f"Config({self.key()})"


@dataclass(frozen=True)
class Param:
    """One tunable parameter and the values the space takes it through."""

    name: str
    values: tuple[Any, ...]
    doc: str = ""


@dataclass(frozen=True)
class Rule:
    """A named assumption of the kernel body (or a device limit).

    Args:
        name: short name shown to users (`whole_warps`, `workgroup_storage`).
        check: returns True when the config satisfies the assumption.
        explain: renders the failing numbers, e.g. `threads = 2048 > max_invocations_per_workgroup 1024`.
        needs_limits: the rule reads device limits and is skipped when none are given.
    """

    name: str
    check: Check
    explain: Explain
    needs_limits: bool = False
    doc: str = ""


@dataclass
class Space:
    """Parameters (a grid) plus ordered rules. Iterating yields every config of the grid, legal or not."""

    name: str
    params: dict[str, list[Any]]
    rules: list[Rule] = field(default_factory=list)
    fmt: Callable[[Config], str] | None = None
    #: a hand-picked space (seed 003's 16 points): iteration yields these instead of the grid
    points: list[Mapping[str, Any]] | None = None

    def __post_init__(self) -> None:
        if not self.params:
            raise ValueError(f"space {self.name} has no parameters")
        for k, vals in self.params.items():
            if not vals:
                raise ValueError(f"parameter {k} of space {self.name} has no values")
        names = [r.name for r in self.rules]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"duplicate rule names in {self.name}: {sorted(dup)}")

    @property
    def size(self) -> int:
        if self.points is not None:
            return len(self.points)
        n = 1
        for vals in self.params.values():
            n *= len(vals)
        return n

    def config(self, values: Mapping[str, Any] | None = None, **kw: Any) -> Config:
        """A config from values for every parameter, in parameter order; refuses unknown or missing names."""
        given = {**(values or {}), **kw}
        unknown = set(given) - set(self.params)
        missing = set(self.params) - set(given)
        if unknown or missing:
            raise ConfigError(f"config for {self.name}: unknown {sorted(unknown)}, missing {sorted(missing)}",
                              f"give exactly these parameters: {', '.join(self.params)}")
        return Config(((k, given[k]) for k in self.params), self.fmt)

    def __iter__(self) -> Iterator[Config]:
        if self.points is not None:
            yield from (self.config(p) for p in self.points)
            return
        keys = list(self.params)
        for combo in itertools.product(*(self.params[k] for k in keys)):
            yield Config(zip(keys, combo), self.fmt)

    def why_illegal(self, config: Config, limits: Limits | None = None) -> list[str]:
        """Every broken assumption as `rule: numbers`; empty when the config is legal.

        Rules run in order; once one fails, later rules that cannot be evaluated are skipped.
        """
        reasons: list[str] = []
        for rule in self.rules:
            if rule.needs_limits and limits is None:
                continue
            try:
                ok = bool(rule.check(config, limits))
            except (ZeroDivisionError, ValueError, OverflowError) as exc:
                if reasons:
                    continue
                raise RuleOrderError(f"{self.name}: rule {rule.name} raised {exc!r} on {config!r} although every "
                                     "earlier rule passed; move the rule that guarantees its divisor earlier") from exc
            if not ok:
                reasons.append(f"{rule.name}: {rule.explain(config, limits)}")
        return reasons

    def is_legal(self, config: Config, limits: Limits | None = None) -> bool:
        """True when every rule passes (stops at the first failure, so it is cheaper than `why_illegal`)."""
        for rule in self.rules:
            if rule.needs_limits and limits is None:
                continue
            try:
                if not rule.check(config, limits):
                    return False
            except (ZeroDivisionError, ValueError, OverflowError):
                return not self.why_illegal(config, limits)  # raises RuleOrderError when the order is wrong
        return True

    def legal(self, limits: Limits | None = None, configs: Iterable[Config] | None = None) -> list[Config]:
        """The legal configs of `configs` (default: the whole grid) under `limits`."""
        return [c for c in (self if configs is None else configs) if self.is_legal(c, limits)]

    def split(self, limits: Limits | None = None, configs: Iterable[Config] | None = None,
              ) -> tuple[list[Config], list[tuple[Config, list[str]]]]:
        """(legal configs, [(illegal config, reasons)]) over `configs` (default: the grid)."""
        ok: list[Config] = []
        bad: list[tuple[Config, list[str]]] = []
        for c in self if configs is None else configs:
            why = self.why_illegal(c, limits)
            (bad.append((c, why)) if why else ok.append(c))
        return ok, bad

    def sample(self, n: int, seed: int = 0, limits: Limits | None = None, max_tries: int | None = None,
               ) -> list[Config]:
        """Up to `n` distinct legal configs drawn uniformly from the grid (rejection sampling)."""
        rng = random.Random(seed)
        if self.points is not None:
            legal = self.legal(limits)
            return rng.sample(legal, min(n, len(legal)))
        keys = list(self.params)
        seen: set[Config] = set()
        out: list[Config] = []
        tries = max_tries if max_tries is not None else max(1000, 50 * n)
        for _ in range(tries):
            if len(out) >= n:
                break
            c = Config(((k, rng.choice(self.params[k])) for k in keys), self.fmt)
            if c in seen:
                continue
            seen.add(c)
            if self.is_legal(c, limits):
                out.append(c)
        return out

    def parse(self, text: str) -> Config:
        """Parse `BM=128,BN=64,...` (the store key form) back into a config of this space.

        Every value must be one the space takes: a value off the grid, of the wrong type or named twice is refused,
        so a typo never turns silently into a different config.
        """
        values: dict[str, Any] = {}
        for k, v in split_pairs(text).items():
            if k not in self.params:
                raise ConfigError(f"unknown parameter {k!r} for {self.name}", f"parameters: {', '.join(self.params)}")
            allowed = self.params[k]
            match = [a for a in allowed if str(a) == v or (isinstance(a, bool) and v.lower() == str(a).lower())]
            if not match:
                raise ConfigError(f"{k}={v} is not a value of parameter {k} (space {self.name!r})",
                                  f"use one of: {', '.join(map(str, allowed))}")
            values[k] = match[0]
        return self.config(values)


def split_pairs(text: str) -> dict[str, str]:
    """`NAME=V,NAME=V` as {name: value text}, refusing a part without `=` and a name given twice."""
    pairs: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        if "=" not in part:
            raise ConfigError(f"cannot parse {part!r} in config {text!r}", "write NAME=VALUE pairs, comma separated")
        k, v = (x.strip() for x in part.split("=", 1))
        if k in pairs:
            raise ConfigError(f"parameter {k} is given twice in config {text!r}", "name each parameter once")
        pairs[k] = v
    return pairs


def divides(a: int, b: int) -> bool:
    """True when a divides b exactly (a > 0)."""
    return a > 0 and b % a == 0


def named_space(which: str, params: Mapping[str, Sequence[Any]], rules: Sequence[Rule],
                fmt: Callable[[Config], str] | None, small: Mapping[str, Sequence[Any]],
                seed_points: Sequence[Mapping[str, Any]], label: str) -> Space:
    """The three spaces a template names: "full" (the grid of `params`), "small" (the quick grid `small`) and
    "seed" (the hand-picked `seed_points`, checked against the full grid); all under the same `rules`.

    Raises:
        ConfigError: `which` is another name (the message names the template, `label`).
    """
    if which == "full":
        return Space("full", {k: list(v) for k, v in params.items()}, list(rules), fmt)
    if which == "small":
        return Space("small", {k: list(v) for k, v in small.items()}, list(rules), fmt)
    if which == "seed":
        return Space("seed", {k: list(v) for k, v in params.items()}, list(rules), fmt, points=list(seed_points))
    raise ConfigError(f"unknown space {which!r} for {label}", "use --space seed, full or small")
