"""The inputs that the tensor and container checkers try, in one place, in
one order: smallest first.

Each checker runs the learner's function and the reference on these cases
and stops at the first case where they differ, so the case a hint shows
is the smallest one that fails: the fewest elements, then the fewest
dimensions, then a contiguous tensor before a view. What is covered, as
issue 34 asks: 0-d, empty, 1-D and 2-D shapes, odd and prime lengths
(5, 7, 13: not divisible by 2, 3 or 4), a length far above any world size
(1000), non-contiguous views (a transposed matrix, whose `reshape(-1)`
is a copy and `view(-1)` an error; every second element of a vector,
whose `reshape(-1)` is that same strided view, still not contiguous), the
dtypes an exercise's contract allows, tuples, lists, dicts and
namedtuples nested in each other, and world sizes 1 to 5.

Why an ordered list and not property-based generation (`hypothesis`):
- the checkers run in the learner's notebook kernel, on Colab as here, so
  hypothesis would become a dependency of the course package itself, not
  only of its tests;
- most of these checkers run the learner's code on worker processes, one
  launch per world size (about a second each): shrinking a failure means
  running it again dozens of times, and the 10 s a check may take would
  not hold; a list ordered small to large gives the smallest failing case
  as the first failure, at no extra run;
- a list is the same on every run and every machine (hypothesis needs
  `derandomize=True` and a pinned database setting for that), and a
  reader can see at a glance what was tried.
The price: no case outside the list is ever tried, so the list covers
each boundary on purpose (empty, one element, fewer elements than ranks,
not divisible, non-contiguous), instead of relying on chance to find it.

The values are small integers that differ per rank and per element,
(3i mod 7 + 1)(rank + 1) + rank, at most 39 on rank 4: a sum over 5 ranks
is at most 115, exact in every float dtype (float16 holds integers up to
2048 exactly), so a reference and an answer that add in another order
still agree exactly.
"""
import collections
from dataclasses import dataclass

import torch

WORLD_SIZES = (1, 2, 3, 4, 5)  # small to large, 3 and 5 not powers of two
# 0-d, empty, one element, fewer elements than most world sizes, odd and
# prime lengths, a matrix, a matrix with an odd number of rows, and a
# length far above any world size
SHAPES = ((), (0,), (1,), (2,), (5,), (7,), (13,), (3, 4), (5, 3), (1000,))
# how a tensor of a given shape is laid out in memory: "transposed" is a
# (columns x rows) matrix transposed, "strided" every second element of a
# vector twice as long; both are views that are not contiguous
LAYOUTS = ("contiguous", "transposed", "strided")
LAYOUT_FITS = {"contiguous": lambda shape: True,
               "transposed": lambda shape: len(shape) == 2,
               "strided": lambda shape: len(shape) == 1 and shape[0] > 1}


@dataclass(frozen=True)
class TensorCase:
    """One input tensor: its shape, dtype (a torch attribute name), layout
    in memory, and whether it requires grad (as a parameter does)."""
    shape: tuple
    dtype: str = "float32"
    layout: str = "contiguous"
    requires_grad: bool = False

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count

    def make(self, rank: int = 0) -> torch.Tensor:
        """The case's tensor on `rank`: values that differ per rank and per
        element, in the case's shape and layout (a view when not
        contiguous)."""
        n = self.numel * (2 if self.layout == "strided" else 1)
        values = ((torch.arange(n) * 3 % 7 + 1) * (rank + 1) + rank).to(
            getattr(torch, self.dtype))
        if self.layout == "transposed":
            rows, columns = self.shape
            values = values.reshape(columns, rows).T
        elif self.layout == "strided":
            values = values[::2]
        else:
            values = values.reshape(self.shape)
        return values.requires_grad_() if self.requires_grad else values

    def describe(self) -> str:
        """The case in words, for a verdict."""
        if self.shape == ():
            what = f"a 0-d {self.dtype} tensor (shape ())"
        elif len(self.shape) == 1:
            what = f"a tensor of {self.shape[0]} {self.dtype} values"
        else:
            what = f"a {' x '.join(map(str, self.shape))} {self.dtype} matrix"
        if self.layout == "transposed":
            rows, columns = self.shape
            what = (f"a non-contiguous {rows} x {columns} {self.dtype} view "
                    f"(a {columns} x {rows} matrix transposed)")
        elif self.layout == "strided":
            what = (f"a non-contiguous view of {self.numel} {self.dtype} "
                    f"values (every second element of a longer tensor)")
        return what + (" that requires grad" if self.requires_grad else "")

    def order(self) -> tuple:
        """Where the case goes in a list: fewest elements first, then
        fewest dimensions, then contiguous before views."""
        return (self.numel, len(self.shape), LAYOUTS.index(self.layout))


def tensor_cases(dtypes=("float32",), shapes=SHAPES,
                 layouts=LAYOUTS) -> list[TensorCase]:
    """Every shape in every dtype and every layout that fits it (a
    transposed view needs two dimensions, a strided one a vector of two
    or more), smallest first."""
    cases = [TensorCase(tuple(shape), dtype, layout)
             for shape in shapes for dtype in dtypes for layout in layouts
             if LAYOUT_FITS[layout](tuple(shape))]
    return sorted(cases, key=TensorCase.order)


# ------------------------------------------------------------- containers
# What DataParallel's scatter and gather carry: any nesting of tuples
# (namedtuples too), lists and dicts, with non-tensors passed along.

Batch = collections.namedtuple("Batch", ["inputs", "labels"])


def batch(rows: int, columns: int = 2) -> torch.Tensor:
    """A rows x columns batch whose values say where they sit."""
    return torch.arange(float(rows * columns)).reshape(rows, columns)


@dataclass(frozen=True)
class ContainerCase:
    """Inputs for scatter (a batch split over `devices` devices) or the
    pieces for gather, with what makes the case, for a verdict."""
    label: str
    build: object  # () -> the inputs, built fresh for every call
    devices: int

    def describe(self) -> str:
        return f"{self.label} over {self.devices} device{'s' * (self.devices > 1)}"


def container_cases() -> list[ContainerCase]:
    """Batches and structures for scatter and gather, smallest first: one
    device, more devices than rows, rows not divisible by the devices (7
    and 13 rows: prime), 1-D and non-contiguous batches, then lists,
    tuples and dicts nested, with non-tensors and empty containers along,
    and last namedtuples (built from their fields, type(obj)(*items): a
    trap of its own, shown after the plainer mistakes)."""
    mask = lambda rows: torch.arange(rows) % 2 == 0  # noqa: E731 - a bool tensor
    return [
        ContainerCase("a 1 x 2 batch", lambda: batch(1), 1),
        ContainerCase("a 2 x 2 batch", lambda: batch(2), 3),
        ContainerCase("a batch of 5 values (1-D)", lambda: torch.arange(5.0), 2),
        ContainerCase("a 7 x 2 batch", lambda: batch(7), 3),
        ContainerCase("a non-contiguous 7 x 3 batch (a 3 x 7 matrix "
                      "transposed)", lambda: batch(3, 7).T, 2),
        ContainerCase("a 10 x 2 batch", lambda: batch(10), 4),
        ContainerCase("a 13 x 2 batch", lambda: batch(13), 5),
        ContainerCase("a list [batch, mask]", lambda: [batch(10), mask(10)], 2),
        ContainerCase("a tuple (batch, {'mask': mask, 'scale': 2.0}, 'tag')",
                      lambda: (batch(10), {"mask": mask(10), "scale": 2.0}, "tag"), 3),
        ContainerCase("a tuple ((batch,), {'mask': mask}, [], {})",
                      lambda: ((batch(10),), {"mask": mask(10)}, [], {}), 2),
        ContainerCase("a namedtuple Batch(inputs, labels)",
                      lambda: Batch(batch(7), torch.arange(7)), 3),
        ContainerCase("a dict {'x': Batch(inputs, labels), 'ids': [ids]}",
                      lambda: {"x": Batch(batch(9), torch.arange(9)),
                               "ids": [torch.arange(9) * 10]}, 4),
    ]
