"""Name-to-factory registries (backbones, margins, data sources) instead of if/elif chains.

A prefix entry (`timm:`) stands for a whole family of names another library owns, which cannot be
listed up front: its factory takes the rest of the name first, and its check says what is wrong
with a name (that library missing, the name unknown to it) in one line.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from facetrain.errors import FacetrainError

T = TypeVar("T")


class Registry(Generic[T]):
    """A mapping from names to factories, filled with the `register` decorator."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Callable[..., T]] = {}
        self._prefixes: dict[str, tuple[Callable[..., T], Callable[[str], str | None]]] = {}

    def register(self, *names: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        def add(factory: Callable[..., T]) -> Callable[..., T]:
            for name in names or (factory.__name__,):
                if name in self._entries:
                    raise ValueError(f"{self.kind} {name!r} is registered twice")
                self._entries[name] = factory
            return factory

        return add

    def register_prefix(
        self, prefix: str, check: Callable[[str], str | None]
    ) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """`prefix<rest>` names `factory(rest, ...)`; `check(rest)` is None for a rest that builds."""

        def add(factory: Callable[..., T]) -> Callable[..., T]:
            if prefix in self._prefixes:
                raise ValueError(f"{self.kind} prefix {prefix!r} is registered twice")
            self._prefixes[prefix] = (factory, check)
            return factory

        return add

    def problem(self, name: str) -> str | None:
        """What `name` must be, or None when it is registered (a prefixed name: when its check passes)."""
        if name in self._entries:
            return None
        prefix = self._prefix_of(name)
        if prefix is not None:
            return self._prefixes[prefix][1](name[len(prefix) :])
        patterns = [f"{prefix}<name>" for prefix in sorted(self._prefixes)]
        return f"must be one of: {', '.join([*sorted(self._entries), *patterns])}"

    def get(self, name: str) -> Callable[..., T]:
        if name in self._entries:
            return self._entries[name]
        prefix = self._prefix_of(name)
        if prefix is None:
            choices = [*sorted(self._entries), *(f"{prefix}<name>" for prefix in sorted(self._prefixes))]
            raise FacetrainError(f"unknown {self.kind} {name!r}; choose one of: {', '.join(choices)}")
        problem = self._prefixes[prefix][1](name[len(prefix) :])
        if problem is not None:
            raise FacetrainError(f"{self.kind} {name!r}: {problem}")
        return functools.partial(self._prefixes[prefix][0], name[len(prefix) :])

    def _prefix_of(self, name: str) -> str | None:
        return next((prefix for prefix in self._prefixes if name.startswith(prefix)), None)

    def build(self, name: str, *args, **kwargs) -> T:
        return self.get(name)(*args, **kwargs)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def canonical_names(self) -> list[str]:
        """One name per factory, the first it was registered under (aliases such as am_softmax for
        cosface left out), sorted: what tests run over to cover each entry once."""
        first: dict[Callable[..., T], str] = {}
        for name, factory in self._entries.items():
            first.setdefault(factory, name)
        return sorted(first.values())

    def __contains__(self, name: str) -> bool:
        return name in self._entries or (self._prefix_of(name) is not None and self.problem(name) is None)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
