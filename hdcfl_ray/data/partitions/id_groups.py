"""Planted groups read off the ids (`partition.group_pattern`): a regular expression whose
first capture group (the whole match when it has none) names each id's group, so that ids
such as `PLAY0_KING` and `PLAY0_DUKE` are one group (their play) and a clustered method's
grouping of natural clients is scored against it (ARI), as the plays source does on its own."""

from __future__ import annotations

import re

from hdcfl_ray.contract.data import SampleIds


def groups_from_pattern(ids: SampleIds, pattern: str, column: str) -> SampleIds:
    """`ids` with `groups` set from `pattern` (ascending group names numbered 0, 1, ...)."""
    compiled = re.compile(pattern)
    group_names: list[str] = []
    for name in ids.names:
        found = compiled.search(name)
        if found is None:
            raise ValueError(
                f"partition.group_pattern {pattern!r} does not match id {name!r} of column {column!r}: every id needs "
                "a group; widen the pattern (its first capture group, or the whole match, names the group) or remove the key"
            )
        group_names.append(found.group(1) if compiled.groups else found.group(0))
    codes = {group: code for code, group in enumerate(sorted(set(group_names)))}
    return SampleIds(train=ids.train, test=ids.test, names=ids.names, groups=tuple(codes[group] for group in group_names))
