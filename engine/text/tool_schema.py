"""Tool parameter schemas narrowed to what the tool-call parsers read: ``Schema``.

A client's JSON schema (already validated by ``engine.serving.protocol``) becomes a tree of
``Schema`` nodes holding each node's possible JSON types and its own ``properties`` and
``items``. The type rule is vLLM 0.32's ``extract_types_from_schema`` (``type`` as a name or a
list, the types of ``enum`` values, the members of ``anyOf``/``oneOf``/``allOf``; ``string`` when
nothing says), and nesting is read the way its ``_coerce_value`` reads it: a node's own
``properties`` and ``items`` only. ``$ref`` is not followed -- vLLM does not follow it, so a
parameter that is only a ``$ref`` counts as a string there, and here (``tests/
test_parser_fidelity.py`` measures that against the real parser).
"""

from __future__ import annotations

from dataclasses import dataclass

# vLLM's coercion priority; also the order ``Schema.types`` keeps
JSON_TYPES = ("null", "integer", "number", "boolean", "object", "array", "string")
SHORT = {"string": "str", "integer": "int", "number": "num", "boolean": "bool", "array": "arr",
         "object": "obj", "null": "null"}
_LONG = {short: long for long, short in SHORT.items()}
_COMBINATORS = ("anyOf", "oneOf", "allOf")


@dataclass(frozen=True)
class Schema:
    """One schema node. Invariants: ``types`` is non-empty, distinct, in ``JSON_TYPES`` order;
    ``properties`` (ordered ``(key, Schema)`` pairs) and ``items`` are the node's own, None when
    it declares none (an ``items`` list, tuple validation, counts as none)."""

    types: tuple[str, ...] = ("string",)
    properties: tuple[tuple[str, Schema], ...] | None = None
    items: Schema | None = None

    @classmethod
    def of(cls, short: str) -> Schema:
        """A flat node of one type given by its short name (``str``, ``int``, ...)."""
        return cls((_LONG[short],))

    @classmethod
    def from_json(cls, node: dict) -> Schema:
        """The node of a JSON schema object (unknown type names are kept out of ``types``)."""
        props = node.get("properties")
        items = node.get("items")
        return cls(types=_ordered(_types(node)) or ("string",),
                   properties=tuple((k, cls.from_json(v)) for k, v in props.items())
                   if isinstance(props, dict) else None,
                   items=cls.from_json(items) if isinstance(items, dict) else None)

    @property
    def short(self) -> str:
        """The type shown in the prompt's tool signature: the first non-null type."""
        return SHORT[next((t for t in self.types if t != "null"), self.types[0])]

    def only_string(self) -> bool:
        """Whether every value this node admits is a string (vLLM streams such values open)."""
        return self.types == ("string",)

    def to_json(self) -> dict:
        """A JSON schema giving this node back (``type`` a name, or a list when several)."""
        out: dict = {"type": self.types[0] if len(self.types) == 1 else list(self.types)}
        if self.properties is not None:
            out["properties"] = {k: v.to_json() for k, v in self.properties}
        if self.items is not None:
            out["items"] = self.items.to_json()
        return out


def _types(node: object) -> set[str]:
    if not isinstance(node, dict):
        return set()
    declared = node.get("type")
    declared = [declared] if isinstance(declared, str) else declared
    out = {t for t in declared if isinstance(t, str)} if isinstance(declared, list) else set()
    enum = node.get("enum")
    out |= {_value_type(v) for v in enum} if isinstance(enum, list) else set()
    for key in _COMBINATORS:
        members = node.get(key)
        for member in members if isinstance(members, list) else ():
            out |= _types(member) or {"string"}  # a member saying nothing (a $ref) is a string
    return out


def _value_type(value: object) -> str:
    """The JSON type of an ``enum`` value (bool before int: ``True`` is an int in Python)."""
    if value is None:
        return "null"
    for kind, py in (("boolean", bool), ("integer", int), ("number", float), ("string", str),
                     ("array", list)):
        if isinstance(value, py):
            return kind
    return "object"


def _ordered(types: set[str]) -> tuple[str, ...]:
    return tuple(t for t in JSON_TYPES if t in types)
