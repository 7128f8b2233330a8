"""YAML as people read it: no anchors, multi-line strings as `|` blocks, keys in the order given."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml


class _ReadableDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_ReadableDumper.add_representer(str, _represent_str)


def dump_documents(documents: Iterable[dict[str, Any]]) -> str:
    """`documents` as one multi-document YAML text."""
    return yaml.dump_all(list(documents), Dumper=_ReadableDumper, sort_keys=False, width=120, allow_unicode=True)
