"""The names the dispatcher gives wrapped objects written with `metadata.generateName` and
no name: fixed by the AppWrapper's uid and the item's index, so that after a crash between
create and record, adoption finds the object made before, and no second one is made."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

GENERATE_NAME_PREFIX_MAX: Final = 58
"""The longest `generateName` prefix kept, as the API server's: a name of 63 with the suffix."""
_SUFFIX_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"
"""The API server's alphabet for generated names (no vowels: no words by chance)."""


def generated_name(generate_name: str, seed: str, index: int) -> str:
    """The name a wrapped object written with `metadata.generateName` and no name gets:
    the prefix (cut to 58 characters, as the API server cuts it) and 5 characters of a hash
    of `seed` (the AppWrapper's uid) and the item's index. Deterministic, unlike the API
    server's own: after a crash between create and record, adoption finds the object made
    before, and no second one is made."""
    digest = hashlib.sha256(f"{seed}/{index}".encode()).digest()
    suffix = "".join(_SUFFIX_ALPHABET[b % len(_SUFFIX_ALPHABET)] for b in digest[:5])
    return generate_name[:GENERATE_NAME_PREFIX_MAX] + suffix


def generated_for(metadata: Mapping[str, Any], seed: str, index: int) -> str | None:
    """The name to give the object of item `index` whose template has this `metadata`: None
    when it names itself, or has no usable `generateName` either."""
    if metadata.get("name"):
        return None
    prefix = metadata.get("generateName")
    if isinstance(prefix, str) and prefix:
        return generated_name(prefix, seed, index)
    return None
