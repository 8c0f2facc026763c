"""Errors that reach the user: each names the problem and the fix."""

from __future__ import annotations


class TilewiseError(Exception):
    """An error the CLI prints as one clear message (no traceback unless --debug).

    Args:
        problem: what went wrong, with the numbers or names involved.
        fix: what the user can do about it.
    """

    def __init__(self, problem: str, fix: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.problem}\n  fix: {self.fix}" if self.fix else self.problem


class DeviceUnavailable(TilewiseError):
    """A backend's library, driver or adapter is missing."""


class ShaderCompileError(TilewiseError):
    """WGSL or CUDA source failed to compile; the message carries the offending line."""


class LaunchError(TilewiseError):
    """A compiled program failed to launch or run (resources, device loss)."""


class DeviceLost(LaunchError):
    """The device went away mid-work; the next request can rebuild it."""


class ConfigError(TilewiseError):
    """Bad user input: shapes, names, options, files."""
