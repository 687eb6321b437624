"""The free physical blocks of one cache: one allocator for every engine in the package (the
transformers cache, the DSA runner)."""
from __future__ import annotations

from dataclasses import dataclass, field


class CacheFullError(RuntimeError):
    """The plan has no free block left for a growing sequence."""


@dataclass
class BlockPool:
    """Blocks 0 .. num_blocks - 1, handed out lowest first (a free list used as a stack: `free`
    ends with the next block to give; a caller may reorder it, e.g. to shuffle placements)."""

    num_blocks: int
    free: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.num_blocks, bool) or not isinstance(self.num_blocks, int) \
                or self.num_blocks <= 0:
            raise ValueError(f"num_blocks must be a positive int, got {self.num_blocks!r}")
        self.reset()

    def reset(self) -> None:
        """Every block free again."""
        self.free = list(range(self.num_blocks - 1, -1, -1))  # pop() hands out 0, 1, 2, ...

    @property
    def num_free(self) -> int:
        return len(self.free)

    def allocate(self, n: int) -> list[int]:
        """n blocks, or CacheFullError (and no block taken) when fewer are free."""
        if n > len(self.free):
            raise CacheFullError(f"{n} blocks needed, {len(self.free)} of num_blocks = "
                                 f"{self.num_blocks} free")
        return [self.free.pop() for _ in range(n)]

    def release(self, blocks: list[int]) -> None:
        """Give blocks back (the next allocations take them first, last released first)."""
        self.free.extend(reversed(blocks))
