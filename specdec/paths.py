"""Where specdec keeps its files: models, converted checkpoints, kernel builds."""

from __future__ import annotations

import os
from pathlib import Path


def specdec_home() -> Path:
    """Cache root: ``$SPECDEC_HOME`` or ``~/.cache/specdec``."""
    env = os.environ.get("SPECDEC_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specdec"
