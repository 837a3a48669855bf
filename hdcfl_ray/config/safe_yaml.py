"""YAML for user input (scenario files, sweep files, `--set` values) that cannot
explode: PyYAML's SafeLoader, which builds only plain data, with limits on what a
short text can make it do.

* Aliases: a handful of anchors that refer to each other can stand for billions of
  nodes (nine levels of ten aliases: 10^9), which every later step (copying,
  environment expansion, validation) would walk. The document's size with every
  alias expanded must stay within `MAX_EXPANDED_NODES`, and its aliases within
  `MAX_ALIASES`.
* Self-reference: an alias inside the node it names (`a: &x [*x]`) makes a
  structure that contains itself; it is refused.
* Nesting deeper than `MAX_DEPTH` levels (no scenario needs more than five) is
  refused before Python's recursion limit is reached.
* Duplicate keys in one mapping: YAML keeps the last one silently, so a second
  `protocol:` section would replace the first one wholesale. Refused, naming the key
  and both lines (`<<:` merge keys still let a mapping override what it merges).
* Scalars longer than `MAX_SCALAR_CHARS` are refused (no key needs more).
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.events import AliasEvent, CollectionStartEvent, ScalarEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_DEPTH = 64
MAX_ALIASES = 1_000
MAX_EXPANDED_NODES = 100_000
MAX_SCALAR_CHARS = 1_000_000
_MERGE_TAG = "tag:yaml.org,2002:merge"


class YAMLLimitError(yaml.YAMLError):
    """A YAML text that is well-formed but refused: too large once expanded, self-
    referencing, too deep, or with a duplicate key. The message names the line."""


def clip(text: str, limit: int = 120) -> str:
    """`text` cut to about `limit` characters, saying how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def shorten(value: Any, limit: int = 80) -> str:
    """`repr(value)` clipped, for echoing user input in a message."""
    if isinstance(value, (list, dict)) and len(value) > limit:  # never render a huge structure whole
        return f"<a {type(value).__name__} of {len(value)} items>"
    return clip(repr(value), limit)


def _line(node_or_event: Any) -> int:
    mark = getattr(node_or_event, "start_mark", None)
    return mark.line + 1 if mark is not None else 0


class GuardedSafeLoader(yaml.SafeLoader):
    """SafeLoader with the limits of this module."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0
        self._open_anchors: set[str] = set()

    def compose_node(self, parent: Node | None, index: Any) -> Node:  # type: ignore[override]
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise YAMLLimitError(f"line {_line(event)}: more than {MAX_ALIASES} aliases (*name); write the values out")
            if event.anchor in self._open_anchors:
                raise YAMLLimitError(
                    f"line {_line(event)}: the alias *{event.anchor} refers to the node that contains it, "
                    "so the value would contain itself; write the value out"
                )
            return super().compose_node(parent, index)
        if isinstance(event, ScalarEvent) and len(event.value) > MAX_SCALAR_CHARS:
            raise YAMLLimitError(
                f"line {_line(event)}: a value of {len(event.value)} characters (at most {MAX_SCALAR_CHARS} are read)"
            )
        self._depth += 1
        anchor = event.anchor if isinstance(event, CollectionStartEvent) else None
        if self._depth > MAX_DEPTH:
            raise YAMLLimitError(f"line {_line(event)}: nested more than {MAX_DEPTH} levels deep")
        if anchor is not None:
            self._open_anchors.add(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1
            if anchor is not None:
                self._open_anchors.discard(anchor)

    def get_single_data(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        size, depth = _expanded_measure(node)
        if size > MAX_EXPANDED_NODES:
            raise YAMLLimitError(
                f"with its aliases (*name) expanded, this text holds more than {MAX_EXPANDED_NODES} values "
                "(a scenario needs a few hundred); write the values out instead of nesting aliases"
            )
        if depth > MAX_DEPTH:
            raise YAMLLimitError(f"with its aliases (*name) expanded, this text is nested more than {MAX_DEPTH} levels deep")
        return self.construct_document(node)

    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Any, Any]:  # type: ignore[override]
        if isinstance(node, MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG or not isinstance(key_node, ScalarNode):
                    continue
                key = self.construct_object(key_node)
                try:
                    seen = key in first_line
                except TypeError:  # an unhashable key: SafeLoader names it itself
                    continue
                if seen:
                    raise YAMLLimitError(
                        f"line {_line(key_node)}: duplicate key {shorten(key)} (first at line {first_line[key]}); "
                        "YAML would keep only the last one and silently drop the first. Merge them into one"
                    )
                first_line[key] = _line(key_node)
        return super().construct_mapping(node, deep=deep)


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _expanded_measure(root: Node) -> tuple[int, int]:
    """(nodes, depth) of the document with every alias written out (a node reached
    twice counts twice), memoised per node and without recursion, so a bomb is
    measured without being expanded. Sizes are capped just past the budget. The
    composer has refused cycles, so the node graph is acyclic."""
    sizes: dict[int, int] = {}
    depths: dict[int, int] = {}
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        children = _children(node)
        if children_done:
            sizes[key] = min(1 + sum(sizes[id(child)] for child in children), MAX_EXPANDED_NODES + 1)
            depths[key] = 1 + max((depths[id(child)] for child in children), default=0)
        else:
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in sizes)
    return sizes[id(root)], depths[id(root)]


def load_yaml(text: str) -> Any:
    """`yaml.safe_load(text)` with this module's limits (YAMLLimitError)."""
    loader = GuardedSafeLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
