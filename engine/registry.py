"""Small named-variant registries (kernels, patches, backends)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

V = TypeVar("V")


class UnknownVariantError(KeyError):
    """Raised for a variant name a registry does not hold; the message lists the valid ones."""

    def __str__(self) -> str:
        return str(self.args[0])


class Registry(Generic[V]):
    """Maps variant names to values; lookups of unknown names raise ``UnknownVariantError``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, V] = {}

    def register(self, name: str, value: V) -> V:
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} registered twice")
        self._items[name] = value
        return value

    def get(self, name: str) -> V:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownVariantError(
                f"unknown {self.kind} {name!r}; valid: {', '.join(sorted(self._items))}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
