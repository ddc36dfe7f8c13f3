"""Element types and statically shaped tensor types."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from ..errors import Error

# Bounds that keep every shape representable in 64-bit index arithmetic.
MAX_RANK = 32
MAX_ELEMENTS = 2**48


class DType(enum.Enum):
    """An element type: its IR name and numpy equivalent."""

    f32 = "f32"
    f64 = "f64"
    i32 = "i32"
    i64 = "i64"
    bool = "bool"

    @property
    def np(self) -> np.dtype:
        return _NUMPY[self]

    @property
    def is_float(self) -> bool:
        return self in (DType.f32, DType.f64)

    @property
    def is_int(self) -> bool:
        return self in (DType.i32, DType.i64)

    @property
    def is_numeric(self) -> bool:
        return self is not DType.bool

    @property
    def itemsize(self) -> int:
        return _NUMPY[self].itemsize

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return self.value

    def __getitem__(self, shape: int | tuple[int, ...]) -> TensorType:
        """`f32[128, 784]` in Python builds a TensorType, as in the text format."""
        if isinstance(shape, tuple) and shape == ():
            return TensorType(self, ())
        dims = shape if isinstance(shape, tuple) else (shape,)
        for d in dims:
            # numpy's integers too; not bools, floats or anything else int() would accept
            if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
                raise Error(f"{self.value}[...] takes integer dimensions, got {d!r} "
                            f"({type(d).__name__})")
        ints = tuple(int(d) for d in dims)
        if huge := [d for d in ints if d.bit_length() > 63]:  # str() of 5000 digits raises
            raise Error(f"{self.value}[...]: a dimension of {huge[0].bit_length()} bits is out "
                        f"of range")
        problem = shape_problem(ints)
        if problem:
            raise Error(f"{self.value}{list(ints)}: {problem}")
        return TensorType(self, ints)

    def __call__(self, *args: object, **kwargs: object) -> None:
        raise Error(f"{self.value} is a dtype, not a function: write {self.value}[3, 4] for a "
                    f"3x4 tensor type, {self.value}[()] for a scalar")

    @staticmethod
    def of(dtype: np.dtype | type) -> DType:
        """The IR dtype of a numpy dtype; raises KeyError for unsupported ones."""
        return _FROM_NUMPY[np.dtype(dtype)]


_NUMPY = {
    DType.f32: np.dtype(np.float32),
    DType.f64: np.dtype(np.float64),
    DType.i32: np.dtype(np.int32),
    DType.i64: np.dtype(np.int64),
    DType.bool: np.dtype(np.bool_),
}
_FROM_NUMPY = {v: k for k, v in _NUMPY.items()}

DTYPES: dict[str, DType] = {d.value: d for d in DType}


@dataclass(frozen=True, slots=True)
class TensorType:
    """A dtype and a static shape; `f32[]` is a scalar."""

    dtype: DType
    shape: tuple[int, ...]

    def __getitem__(self, more: object) -> TensorType:
        raise Error(f"{self} cannot be indexed: a shape is written in one subscript, "
                    f"{self.dtype}[{', '.join(map(str, self.shape + (more,)))}], not "
                    f"{self.dtype}{list(self.shape)}[{more}]")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def with_shape(self, shape: tuple[int, ...]) -> TensorType:
        return TensorType(self.dtype, tuple(shape))

    def with_dtype(self, dtype: DType) -> TensorType:
        return TensorType(dtype, self.shape)

    def __str__(self) -> str:
        return f"{self.dtype.value}[{','.join(map(str, self.shape))}]"

    def __repr__(self) -> str:
        return str(self)


def shape_problem(shape: tuple[int, ...]) -> str | None:
    """Why a shape cannot be used (negative or absurd dimensions), or None if it can."""
    if len(shape) > MAX_RANK:
        return f"rank {len(shape)} exceeds the limit of {MAX_RANK}"
    for d in shape:
        if d < 0:
            return f"dimension {d} is negative"
    if math.prod(shape) > MAX_ELEMENTS:
        return f"shape [{','.join(map(str, shape))}] has more than 2^48 elements"
    return None
