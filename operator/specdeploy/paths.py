"""Where specdeploy keeps files on this machine: one cache directory, shared by the operator and the dev cluster.

The operator keeps fetched config.json files under it (``hub-configs/``); the dev cluster its Go-built binaries,
vLLM's CPU environment, the stand-in models and their logs. Neither owns it, so it lives here, above both.

Usage::

    cache_dir() / "hub-configs"
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$SPECDEPLOY_CACHE_DIR``, else ``$XDG_CACHE_HOME/specdeploy``, else ``~/.cache/specdeploy``."""
    if env := os.environ.get("SPECDEPLOY_CACHE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specdeploy"
