"""Argument conversion shared by the Python wrappers: integer arguments must be integers (a float
is an error, never truncated), and values are range-checked before they are narrowed to int32."""

from __future__ import annotations

import operator
from typing import Sequence, Union

import torch

IntLike = Union[torch.Tensor, Sequence[int]]

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
_WITHIN_INT32 = (torch.int8, torch.int16, torch.uint8, torch.int32)


def as_int(x, name: str) -> int:
    """``x`` as a Python int: an int, a NumPy integer or a one-element integer tensor. Floats and
    bools raise TypeError naming the argument (int(10.9) would silently make it 10)."""
    if isinstance(x, bool) or (isinstance(x, torch.Tensor) and x.dtype == torch.bool):
        raise TypeError(f"{name} must be an integer, got the bool {x!r}")
    try:
        return operator.index(x)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {x!r} ({type(x).__name__})") from None


def _first_non_integer(x, name: str):
    """'name[i][j] = v' for the first element of nested sequences that is not an integer."""
    for i, v in enumerate(x):
        if isinstance(v, (list, tuple)):
            found = _first_non_integer(v, f"{name}[{i}]")
            if found:
                return found
            continue
        try:
            as_int(v, name)
        except TypeError:
            return f"{name}[{i}] = {v!r}"
    return None


def as_int32(x: IntLike, name: str) -> torch.Tensor:
    """A CPU int32 tensor from (nested) sequences of integers or an integer tensor.

    Floats, bools and values outside int32 raise naming the argument and the element. Tensors on
    other devices are passed on unchanged, for the operator to reject by name."""
    if not isinstance(x, torch.Tensor):
        if isinstance(x, (str, bytes)):
            raise TypeError(
                f"{name} must be a sequence of integers or an integer tensor, got {x!r}"
            )
        try:
            items = list(x)
        except TypeError:
            raise TypeError(
                f"{name} must be a sequence of integers or an integer tensor, "
                f"got {type(x).__name__}"
            ) from None
        bad = _first_non_integer(items, name)
        if bad:
            raise TypeError(f"{name} must hold integers, got {bad}")
        try:
            x = torch.tensor(items, dtype=torch.int64)
        except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
            raise ValueError(
                f"{name} must be a rectangular sequence of int32 values ({exc})"
            ) from None
    elif x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise TypeError(f"{name} must hold integers, got a {x.dtype} tensor")
    if x.device.type != "cpu" or x.dtype == torch.int32:
        return x.contiguous()
    if x.dtype not in _WITHIN_INT32 and x.numel() > 0:
        wide = x.to(torch.int64)
        bad = (wide < INT32_MIN) | (wide > INT32_MAX)
        if bool(bad.any()):
            i = tuple(int(v) for v in bad.nonzero()[0])
            index = "][".join(str(v) for v in i)
            raise ValueError(
                f"{name}[{index}] = {int(wide[i])} is outside int32 [{INT32_MIN}, {INT32_MAX}]"
            )
    return x.to(torch.int32).contiguous()
