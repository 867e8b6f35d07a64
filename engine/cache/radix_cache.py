"""Radix prefix cache at page granularity: each edge is one full page of token ids.

Invariant: the tree holds one allocator reference on every page it stores; a page is evictable
when it is a leaf and the tree's reference is the only one left.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from engine.cache.kv_pool import PageAllocator


@dataclass(eq=False)
class _Node:
    page: int | None  # device page; None while the page lives only in the host tier
    parent: _Node | None
    key: tuple[int, ...]
    children: dict[tuple[int, ...], _Node] = field(default_factory=dict)
    last_access: int = 0
    host_page: int | None = None
    job: object | None = None  # HiCache LoadJob that is filling ``page``


@dataclass(frozen=True)
class PrefixMatch:
    """Pages holding the longest cached prefix; ``num_tokens == len(pages) * page_size``."""

    pages: tuple[int, ...]
    num_tokens: int
    jobs: tuple = ()  # HiCache load jobs the caller must wait on per layer before reading


class RadixCache:
    """``partial_page_min`` (the ``radix_partial_page_rounded_up`` variant; None when correct):
    a page whose cached key shares at least that fraction of its leading tokens with the
    prompt's page is matched as if whole."""

    def __init__(self, allocator: PageAllocator, page_size: int,
                 partial_page_min: float | None = None) -> None:
        self.alloc = allocator
        self.page_size = page_size
        self.partial_page_min = partial_page_min
        self.root = _Node(page=-1, parent=None, key=())
        self._clock = itertools.count(1)
        self.num_pages = 0

    def _chunks(self, tokens: list[int]):
        S = self.page_size
        for i in range(len(tokens) // S):
            yield tuple(tokens[i * S:(i + 1) * S])

    def match(self, tokens: list[int], max_tokens: int | None = None) -> PrefixMatch:
        """Longest cached full-page prefix of ``tokens``, at most ``max_tokens`` long.

        Takes one allocator reference per returned page on behalf of the caller.
        """
        pages = [n.page for n in self._walk(tokens, max_tokens)]
        self.alloc.share(pages)
        return PrefixMatch(tuple(pages), len(pages) * self.page_size)

    def _walk(self, tokens: list[int], max_tokens: int | None) -> list[_Node]:
        """The nodes of the longest cached full-page prefix (at most ``max_tokens``), touched."""
        node, path, now = self.root, [], next(self._clock)
        limit = len(tokens) if max_tokens is None else min(len(tokens), max_tokens)
        for key in self._chunks(tokens[:limit]):
            child = node.children.get(key)
            near = self._near(node, key) if child is None else None
            node = child or near
            if node is None:
                break
            node.last_access = now
            path.append(node)
            if near is not None:  # the rest of the prompt no longer follows the tree
                break
        return path

    def _near(self, node: _Node, key: tuple[int, ...]) -> _Node | None:
        """A child whose key starts with enough of ``key`` (never, unless the variant is on)."""
        if self.partial_page_min is None:
            return None
        need = max(1, int(self.page_size * self.partial_page_min))
        return next((c for k, c in node.children.items() if k[:need] == key[:need]), None)

    def insert(self, tokens: list[int], pages: list[int]) -> int:
        """Stores the full pages of ``tokens`` (``pages[i]`` holds page i); returns pages added.

        Pages already present keep the tree's copy; the caller keeps its own references either way.
        """
        node, added, now = self.root, 0, next(self._clock)
        for key, page in zip(self._chunks(tokens), pages, strict=False):
            child = node.children.get(key)
            if child is None:
                child = _Node(page=None, parent=node, key=key)
                node.children[key] = child
            if child.page is None:
                child.page = page
                self.alloc.share([page])
                added += 1
            child.last_access = now
            node = child
        self.num_pages += added
        return added

    def evict(self, num_pages: int) -> int:
        """Frees up to ``num_pages`` least-recently-used evictable leaves; returns pages freed."""
        freed = 0
        while freed < num_pages:
            leaves = [n for n in self._nodes()
                      if not n.children and self.alloc.refcount[n.page] == 1]
            if not leaves:
                break
            for leaf in sorted(leaves, key=lambda n: n.last_access)[: num_pages - freed]:
                del leaf.parent.children[leaf.key]
                self.alloc.free([leaf.page])
                freed += 1
        self.num_pages -= freed
        return freed

    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            yield node
