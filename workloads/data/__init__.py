"""Traces bundled with the package, named so the command line can replay them from any folder.

`radixkv replay NAME` accepts these names (see `BUNDLED`); the files and their sources are
listed in this folder's README.md.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

# name -> (file in this package, one-line description)
BUNDLED: dict[str, tuple[str, str]] = {
    "mooncake-sample": ("mooncake_sample.jsonl", "its last 300 requests"),
    "mooncake-synthetic": ("mooncake_synthetic_trace.jsonl", "all 3,993 requests"),
}
DEFAULT_TRACE = "mooncake-sample"


def bundled_trace(name: str) -> Path:
    """Path of the bundled trace `name` (a key of `BUNDLED`); KeyError names the known ones."""
    try:
        file, _ = BUNDLED[name]
    except KeyError:
        raise KeyError(f"no bundled trace {name!r}; bundled: {', '.join(BUNDLED)}") from None
    return Path(str(resources.files(__name__).joinpath(file)))
