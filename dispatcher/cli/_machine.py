"""The machine, interpreter and package versions that measured figures come from.

`dispatcher tune --json` and the benchmark suite both record it beside their figures, so that two runs
can be compared knowing what they ran on.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["PACKAGES", "machine_info"]

PACKAGES: tuple[str, ...] = (
    "mcp-dispatcher",
    "anyio",
    "mcp",
    "pydantic",
    "pydantic-core",
    "tenacity",
    "trio",
    "uvicorn",
    "matplotlib",
)
"""The packages whose versions `machine_info` records by default."""


def machine_info(packages: Iterable[str] = PACKAGES) -> dict[str, Any]:
    """The machine, interpreter and package versions, as JSON data.

    Args:
        packages: The distributions whose installed versions to record (None for those not installed).

    Returns:
        CPU count and model, platform, Python version and implementation, package versions, and the
        git commit of the checkout the `dispatcher` package was imported from (None when it is not a
        checkout) with whether `dispatcher/` or `benchmarks/` had uncommitted changes.
    """
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "packages": {name: _version(name) for name in packages},
        "git_commit": _git("rev-parse", "--short", "HEAD") or None,
        "git_dirty": _git_dirty(),
    }


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _git(*args: str) -> str | None:
    """The stripped output of a git command run in the package's folder, or None if it fails."""
    try:
        out = subprocess.run(
            ["git", *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _git_dirty() -> bool | None:
    out = _git("status", "--porcelain", "--untracked-files=no", "--", ":/dispatcher", ":/benchmarks")
    return None if out is None else bool(out)
