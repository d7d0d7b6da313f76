"""Reading the small files a user writes by hand (run configs, validation suites): YAML or JSON, strictly.

One reader for both, so that every such file is refused the same way, with one line naming it:

- not UTF-8, larger than :data:`~vtrain.limits.MAX_CONFIG_BYTES`, or nested deeper than
  :data:`~vtrain.limits.MAX_CONFIG_DEPTH`;
- a key given twice in one mapping (YAML and JSON would silently keep the last one);
- YAML aliases (``*name``): a run config needs none, and expanding them is how a "billion laughs" file of a few
  hundred bytes becomes gigabytes;
- YAML tags other than the standard ones (``!!python/object`` and the like are never constructed, let alone run);
- JSON's non-standard ``NaN`` and ``Infinity``;
- values that cannot be built (a date such as ``2024-13-45``, an integer beyond Python's 4,300 digits);
- numbers that YAML 1.1 (PyYAML) and YAML 1.2 read differently: base 60 (``layers: 1:0`` is 60 in YAML 1.1, text
  in 1.2), a leading 0 (``017``: 15, octal, in 1.1; 17 in 1.2), binary (``0b101``) and underscores (``1_000``),
  which YAML 1.2 reads as text. YAML 1.2's own forms are numbers: ``0x1F`` (as in 1.1) and ``0o17`` (text in
  1.1).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode

from vtrain.errors import InputError
from vtrain.limits import MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH


class _Refused(Exception):
    """A problem found while parsing (turned into an InputError naming the file)."""


def read_config_file(path: str | Path, what: str) -> Any:
    """The parsed content of the YAML or JSON file ``path`` (JSON when its suffix is ``.json``); ``what`` names
    the kind of file in messages ("run config", "suite file")."""
    path = Path(path)
    text = _read_text(path, what)
    try:
        return _parse_json(text) if path.suffix == ".json" else _parse_yaml(text)
    except _Refused as exc:
        raise InputError(f"{what} refused: {exc}", path) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{what} is not valid JSON: {_first_line(exc)}", path) from None
    except yaml.YAMLError as exc:
        raise InputError(f"{what} is not valid YAML: {_yaml_problem(exc)}", path) from None
    except RecursionError:
        raise InputError(f"{what} refused: nested more than {MAX_CONFIG_DEPTH} levels deep", path) from None
    except ValueError as exc:  # a value the parser cannot build: 2024-13-45, an integer of 5,000 digits
        raise InputError(f"{what} has a value that cannot be read: {_first_line(exc).split(';')[0]}",
                         path) from None


def _read_text(path: Path, what: str) -> str:
    try:
        if path.is_dir():
            raise InputError(f"{what} is a folder, not a file", path)
        if path.exists() and not path.is_file():
            raise InputError(f"{what} is not a regular file (a device or a pipe?)", path)
        with path.open("rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise InputError(f"no such {what}", path) from None
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror}", path) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise InputError(f"{what} is larger than {MAX_CONFIG_BYTES:,} bytes (real ones are a few KB)", path)
    try:
        return data.decode("utf-8-sig")  # a byte-order mark (Windows editors write one) is dropped
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} is not UTF-8 text (byte {exc.start})", path) from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's problem and where it is (its first line alone had said "while scanning for the next token" of a
    tab, without the line: an audit), and that YAML indents with spaces where a tab is the problem."""
    problem, mark = getattr(exc, "problem", None), getattr(exc, "problem_mark", None)
    if not problem or mark is None:
        return _first_line(exc)
    tab = "; YAML indents with spaces, not tabs" if "'\\t'" in problem else ""
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1}){tab}"


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _parse_json(text: str) -> Any:
    def no_constant(name: str) -> Any:
        raise _Refused(f"{name} is not a JSON number")

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        return _unique_mapping(pairs)

    value = json.loads(text, object_pairs_hook=unique, parse_constant=no_constant)
    _check_depth(value, 0)
    return value


def _check_depth(value: Any, depth: int) -> None:
    if depth > MAX_CONFIG_DEPTH:
        raise _Refused(f"nested more than {MAX_CONFIG_DEPTH} levels deep")
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for child in children:
        _check_depth(child, depth + 1)


def _unique_mapping(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    mapping: dict[Any, Any] = {}
    for key, value in pairs:
        if key in mapping:
            raise _Refused(f"key {key!r} is given twice")
        mapping[key] = value
    return mapping


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases, duplicate keys or deep nesting."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _Refused(f"line {event.start_mark.line + 1}: YAML aliases (*{event.anchor}) are not allowed")
        self._depth += 1
        if self._depth > MAX_CONFIG_DEPTH:
            raise _Refused(f"nested more than {MAX_CONFIG_DEPTH} levels deep")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: construct_mapping below says so
                continue
            if duplicate:
                raise _Refused(f"line {key_node.start_mark.line + 1}: key {key!r} is given twice")
            problem = _version_dependent(value_node)
            if problem:
                raise _Refused(f"line {value_node.start_mark.line + 1}: {key}: {problem}")
        return super().construct_mapping(node, deep=deep)

    def construct_number(self, node: ScalarNode) -> int | float:
        """An integer or float that YAML 1.1 and 1.2 read alike (a list's item; a mapping's value is refused
        naming its key first)."""
        problem = _version_dependent(node)
        if problem:
            raise _Refused(f"line {node.start_mark.line + 1}: {problem}")
        return super().construct_yaml_int(node) if node.tag == _INT else super().construct_yaml_float(node)


_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_StrictLoader.add_constructor(_INT, _StrictLoader.construct_number)
_StrictLoader.add_constructor(_FLOAT, _StrictLoader.construct_number)
_StrictLoader.add_implicit_resolver(_INT, re.compile(r"^0o[0-7]+$"), list("0"))  # YAML 1.2's octal (text in 1.1)


def _version_dependent(node: Node) -> str | None:
    """Why the number ``node`` holds depends on the YAML version (None when it does not, or it is no number)."""
    if not isinstance(node, ScalarNode) or node.tag not in (_INT, _FLOAT):
        return None
    text = node.value
    if ":" in text:
        return (f"{text} is a base-60 number in YAML 1.1 ({yaml.safe_load(text)}) and text in YAML 1.2: write it "
                "in decimal")
    if "_" in text:
        return f"{text} is a number in YAML 1.1 only (text in YAML 1.2): write it without underscores"
    if text.lstrip("+-").startswith("0b"):
        return f"{text} is a binary number in YAML 1.1 only (text in YAML 1.2): write it in decimal"
    if node.tag == _INT and re.fullmatch(r"[-+]?0[0-7]+", text) and int(text, 8) != int(text, 10):
        return (f"{text} is octal ({int(text, 8)}) in YAML 1.1 and {int(text, 10)} in YAML 1.2: write it without "
                "the leading 0, or with 0o for an octal number")
    return None


def _parse_yaml(text: str) -> Any:
    loader = _StrictLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
