"""Deep merge of a server table with a patch: what `upstream_servers patch` means.

Scalars replace, maps merge key by key (at any depth), arrays replace entirely, and an explicit
`None` (JSON `null`) removes the key. Neither input is changed; the result shares no containers
with them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def deep_merge(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """Return `base` with `patch` applied (see the module docstring for the rules)."""
    merged = copy.deepcopy(dict(base))
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping):
            current = merged.get(key)
            merged[key] = deep_merge(current if isinstance(current, Mapping) else {}, value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged
