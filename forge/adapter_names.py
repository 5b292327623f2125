"""Names of the LoRA adapters that several runs serve on one actor fleet: an actor's ``--adapter NAME=...``, a
gateway's ``--adapter NAME`` and the ``adapter`` of a request and of a pool record all spell them alike."""

from __future__ import annotations

import re

ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_adapter_name(name: str) -> str:
    """``name`` if it is one; ValueError with the rule otherwise."""
    if not ADAPTER_NAME.fullmatch(name):
        raise ValueError(f"adapter name {name!r}: use 1-64 letters, digits, '.', '_' or '-', starting with a letter "
                         "or digit")
    return name
