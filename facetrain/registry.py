"""Name-to-factory registries (backbones, margins, data sources) instead of if/elif chains."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from facetrain.errors import FacetrainError

T = TypeVar("T")


class Registry(Generic[T]):
    """A mapping from names to factories, filled with the `register` decorator."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Callable[..., T]] = {}

    def register(self, *names: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        def add(factory: Callable[..., T]) -> Callable[..., T]:
            for name in names or (factory.__name__,):
                if name in self._entries:
                    raise ValueError(f"{self.kind} {name!r} is registered twice")
                self._entries[name] = factory
            return factory

        return add

    def get(self, name: str) -> Callable[..., T]:
        try:
            return self._entries[name]
        except KeyError:
            raise FacetrainError(
                f"unknown {self.kind} {name!r}; choose one of: {', '.join(sorted(self._entries))}"
            ) from None

    def build(self, name: str, *args, **kwargs) -> T:
        return self.get(name)(*args, **kwargs)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
