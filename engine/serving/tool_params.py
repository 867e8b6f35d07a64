"""Tool parameter schemas as clients send them, validated (pydantic v2): ``ParametersSchema``.

Accepted: what pydantic and the ``openai`` SDK generate and what SGLang and vLLM take -- ``type``
as a name or a list (``["string", "null"]``), ``"null"``, ``enum``, ``anyOf``/``oneOf``/``allOf``
with or without a ``type``, untyped nodes (``{}``: any value), nested ``properties`` and
``items``, ``additionalProperties``, ``$defs``/``definitions`` with local ``$ref``s. Refused,
naming the field: keywords of the wrong JSON type, unknown or repeated type names, empty
``type``/``enum``/combinator lists, ``required`` naming an undeclared property, a ``$ref`` that
does not resolve inside the parameters schema. Other keywords (``title``, ``default``,
``format``, bounds, ...) are kept unchecked.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from engine.text.dsml import PARAM_NAME_PATTERN

JSON_TYPE_NAMES = ("string", "integer", "number", "boolean", "array", "object", "null")


class _Schema(BaseModel):
    """JSON-schema fragments: known keywords are checked, other keywords are kept."""
    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)


def _check_type_names(v: Any) -> Any:
    names = [v] if isinstance(v, str) else v
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError("must be a JSON type name or a non-empty list of them")
    unknown = [n for n in names if n not in JSON_TYPE_NAMES]
    if unknown:
        raise ValueError(f"unknown type {unknown[0]!r}; valid: {', '.join(JSON_TYPE_NAMES)}")
    if len(set(names)) != len(names):
        raise ValueError("type names must be distinct")
    return v


def _required_known(required: list[str] | None, properties: dict | None) -> None:
    missing = [r for r in required or [] if r not in (properties or {})]
    if missing:
        raise ValueError(f"required names unknown property {missing[0]!r}")


Nodes = Annotated[list["PropertySchema"], Field(min_length=1)]


def _branch(v: Any) -> str:
    if isinstance(v, bool):
        return "one[bool]"
    return "one[list]" if isinstance(v, list) else "one[node]"


# Unions picked by the value's JSON type: only that branch is checked, so an error names the
# field and not a branch. Tags carry brackets, so error paths drop them as they drop pydantic's
# own union labels (``engine.http.errors``).
Node = Annotated["PropertySchema", Tag("one[node]")]
Items = Annotated[Node | Annotated[Nodes, Tag("one[list]")], Discriminator(_branch)]
Extra = Annotated[Annotated[bool, Tag("one[bool]")] | Node, Discriminator(_branch)]


class PropertySchema(_Schema):
    """One schema node of a parameter. Invariants after validation: ``type`` is a known JSON
    type name or a non-empty list of distinct ones; ``enum`` and the combinators are non-empty;
    ``required`` names only ``properties`` when the node declares them."""

    type: str | list[str] | None = None
    description: str | None = None
    enum: Annotated[list[Any], Field(min_length=1)] | None = None
    properties: dict[str, PropertySchema] | None = None
    required: list[str] | None = None
    items: Items | None = None
    additionalProperties: Extra | None = None
    anyOf: Nodes | None = None
    oneOf: Nodes | None = None
    allOf: Nodes | None = None
    ref: str | None = Field(default=None, alias="$ref")

    _type_names = field_validator("type", mode="before")(_check_type_names)

    @model_validator(mode="after")
    def _required(self) -> PropertySchema:
        if self.properties is not None:
            _required_known(self.required, self.properties)
        return self

    def children(self) -> Iterator[tuple[str, PropertySchema]]:
        """``(relative path, node)`` of every node directly inside this one."""
        for key, node in (self.properties or {}).items():
            yield f"properties.{key}", node
        yield from _listed("items", self.items)
        if isinstance(self.additionalProperties, PropertySchema):
            yield "additionalProperties", self.additionalProperties
        for key in ("anyOf", "oneOf", "allOf"):
            yield from _listed(key, getattr(self, key))


def _listed(key: str, value: PropertySchema | list[PropertySchema] | None):
    if isinstance(value, PropertySchema):
        yield key, value
    for i, node in enumerate(value if isinstance(value, list) else ()):
        yield f"{key}[{i}]", node


class ParametersSchema(_Schema):
    """A function's parameters: an object schema. Invariants after validation: top-level
    property names match the DSML parameter-name pattern; ``required`` names only declared
    properties; every ``$ref`` is ``#`` or ``#/$defs/<name>`` / ``#/definitions/<name>`` of a
    definition declared here."""

    type: Literal["object"] = "object"
    properties: dict[Annotated[str, Field(pattern=f"^{PARAM_NAME_PATTERN}$")], PropertySchema] = (
        Field(default_factory=dict))
    required: list[str] | None = None
    additionalProperties: Extra | None = None
    defs: dict[str, PropertySchema] | None = Field(default=None, alias="$defs")
    definitions: dict[str, PropertySchema] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ParametersSchema:
        _required_known(self.required, self.properties)
        for path, node in self.nodes():
            if node.ref is not None and not self._resolves(node.ref):
                raise ValueError(f"{path}.$ref: {node.ref!r} does not resolve here (local "
                                 "references #/$defs/<name> or #/definitions/<name> only)")
        return self

    def nodes(self) -> Iterator[tuple[str, PropertySchema]]:
        """``(path, node)`` of every schema node, depth first (definitions included)."""
        roots = [(f"properties.{k}", v) for k, v in self.properties.items()]
        roots += [(f"$defs.{k}", v) for k, v in (self.defs or {}).items()]
        roots += [(f"definitions.{k}", v) for k, v in (self.definitions or {}).items()]
        if isinstance(self.additionalProperties, PropertySchema):
            roots.append(("additionalProperties", self.additionalProperties))
        stack = roots[::-1]
        while stack:
            path, node = stack.pop()
            yield path, node
            stack += [(f"{path}.{rel}", child) for rel, child in node.children()][::-1]

    def _resolves(self, ref: str) -> bool:
        if ref == "#":
            return True
        for prefix, table in (("#/$defs/", self.defs), ("#/definitions/", self.definitions)):
            name = ref[len(prefix):].replace("~1", "/").replace("~0", "~")  # JSON pointer escapes
            if ref.startswith(prefix) and name in (table or {}):
                return True
        return False
