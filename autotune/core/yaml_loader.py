"""The YAML loader of user files: PyYAML's safe loader, but a key given twice in one mapping is an error.

PyYAML keeps the last of two equal keys, so a space listing max_num_seqs twice silently tuned only the
second range; YAML itself requires a mapping's keys to be unique.
"""

from __future__ import annotations

from typing import Any

import yaml

from autotune.core.values import shown

MERGE_TAG = "tag:yaml.org,2002:merge"


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that raises ConstructorError (naming the key and its lines) on a key given twice."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """The mapping, once its own keys are known to be distinct (merged `<<` keys may be overridden)."""
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                continue  # a list or mapping as a key is refused later as no name
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if key in lines:
                where = f"line {line}" if lines[key] == line else f"lines {lines[key]} and {line}"
                raise yaml.constructor.ConstructorError(
                    problem=f"key {shown(key)} given twice ({where}): keep one"
                )
            lines[key] = line
        return super().construct_mapping(node, deep)
