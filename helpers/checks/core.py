"""The machinery every exercise checker shares.

A checker calls the student's function on fixed and seeded random cases, compares each
result with the reference, and either prints one deterministic success line or raises
CheckFailed (an AssertionError) that names the input, the expected and the returned value, with a hint.
An exercise still holding ``raise NotImplementedError()`` gets a NotImplementedError that
says plainly that it is not answered yet.

Every expected value is computed before the student's code first runs, and each returned
value is converted to a plain Python value before the comparison, so neither a function
that patches the references while it runs nor an object whose ``==`` always says True can
pass a check.
"""

from __future__ import annotations

import inspect
import math
import numbers
from typing import Any, Callable, Iterable, Sequence

import numpy as np


class WrongType(Exception):
    """Raised by a converter: the returned value has the wrong type or shape."""


class CheckFailed(AssertionError):
    """A check that failed. In Jupyter it shows as its message alone: the traceback through the
    checker's own code would only hide the message (and name the reference implementation)."""

    def _render_traceback_(self) -> list[str]:  # IPython shows these lines instead of a traceback
        return [f"Check failed: {line}" if i == 0 else line for i, line in enumerate(str(self).splitlines())]


class NotAnswered(NotImplementedError):
    """An exercise still holding ``raise NotImplementedError()``. Shown as its message alone, like CheckFailed."""

    def _render_traceback_(self) -> list[str]:
        return str(self).splitlines()


def as_int(value: Any) -> int:
    """``value`` as a plain int; WrongType explains why it is not a whole number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise WrongType(f"a {type(value).__name__} ({value!r}); expected an int")
    return int(value)


def _int_advice(got: Any, expected: Any) -> str:
    """How to turn ``got`` into ``expected`` when it is the same whole number as a float (or a pair of them)."""
    pairs = zip(got, expected) if isinstance(got, (tuple, list)) and isinstance(expected, tuple) else [(got, expected)]
    for g, e in pairs:
        if not (isinstance(g, numbers.Real) and not isinstance(g, bool) and isinstance(e, int) and float(g) == e):
            return ""
    return " The value is right: return it as an int (use // instead of /, or int(...) around the result)."


def as_int_pair(value: Any) -> tuple[int, int]:
    """``value`` as a pair of plain ints; WrongType explains why it is not one."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise WrongType(f"{value!r} ({type(value).__name__}); expected a pair (a, b) of two ints")
    try:
        return as_int(value[0]), as_int(value[1])
    except WrongType as problem:
        raise WrongType(f"a pair holding {problem}") from None


def as_numbers(count: int, names: str = "numbers"):
    """A converter to a tuple of ``count`` items: plain floats, or float64 arrays for array items."""
    def convert(value: Any) -> tuple:
        if not isinstance(value, (tuple, list)) or len(value) != count:
            raise WrongType(f"{value!r}; expected a tuple of {count} {names}")
        try:
            return tuple(float(v) if np.ndim(v) == 0 else np.asarray(v, dtype=np.float64) for v in value)
        except (TypeError, ValueError):
            raise WrongType(f"{value!r}; expected {names}") from None
    return convert


def as_float(value: Any) -> float:
    """``value`` as a plain float; WrongType when it is not a number."""
    try:
        return float(value)
    except (TypeError, ValueError):
        raise WrongType(f"{value!r}; expected a number") from None


def close(rel_tol: float = 1e-9, abs_tol: float = 1e-12):
    """A comparison: equal within tolerances, item by item for tuples (numbers or arrays)."""
    def compare(expected: Any, got: Any, args: tuple) -> str | None:
        pairs = zip(expected, got) if isinstance(expected, tuple) else [(expected, got)]
        for index, (e, g) in enumerate(pairs):
            if np.shape(e) != np.shape(g):
                return f"returned item {index} of shape {np.shape(g)}, expected shape {np.shape(e)}"
            if not np.allclose(g, e, rtol=rel_tol, atol=abs_tol):
                which = f" (item {index} differs)" if isinstance(expected, tuple) else ""
                return f"returned {_short(got)}, expected {_short(expected)}{which}"
        return None
    return compare


def _innermost_function(error: BaseException) -> str:
    tb = error.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_name


def _short(value: Any) -> str:
    """repr, with arrays and tensors of more than 8 numbers named by shape and dtype instead."""
    if isinstance(value, np.ndarray):
        if value.size > 8:
            return f"<array of shape {value.shape}, dtype {value.dtype}>"
        return f"np.array({' '.join(np.array2string(value, separator=', ').split())}, dtype={value.dtype})"
    if type(value).__name__ == "Tensor" and math.prod(value.shape) > 8:  # torch, without importing it here
        return f"<tensor of shape {tuple(value.shape)}, dtype {value.dtype}>"
    if isinstance(value, tuple):
        return "(" + ", ".join(_short(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def _call_text(name: str, params: Sequence[str], args: Sequence[Any]) -> str:
    return f"{name}(" + ", ".join(f"{p}={_short(a)}" for p, a in zip(params, args)) + ")"


def exact(expected: Any, got: Any, args: tuple) -> str | None:
    """The default comparison: equal, or a sentence saying what came back instead."""
    return None if got == expected else f"returned {got!r}, expected {expected!r}"


def check_function(
    student: Any,
    reference: Callable[..., Any],
    cases: Iterable[tuple],
    *,
    name: str,
    params: Sequence[str],
    hint: str,
    convert: Callable[[Any], Any] = as_int,
    compare: Callable[[Any, Any, tuple], str | None] = exact,
    diagnose: Callable[[tuple, Any, Any], str | None] | None = None,
    then: Callable[[], None] | None = None,
) -> None:
    """Check ``student`` against ``reference`` on ``cases`` (tuples of positional arguments).

    ``convert(value)`` turns a returned value into the reference's type or raises WrongType;
    ``compare(expected, got, args)`` says what is wrong, or None; ``diagnose(args, expected, got)``
    may name a common mistake; ``then()`` runs further checks once every case passed (raising
    AssertionError to fail). Prints one success line.
    """
    cases = list(cases)
    expected_values = [reference(*args) for args in cases]
    if not callable(student):
        raise CheckFailed(
            f"{name} should be a function, but it is {type(student).__name__} ({student!r}). "
            f"Run the cell that defines {name}() and keep its name and signature."
        )
    try:
        inspect.signature(student).bind(*cases[0])
    except TypeError as error:
        raise CheckFailed(f"{name} must accept ({', '.join(params)}): {error}") from None
    except ValueError:
        pass  # builtins without a signature: let the call decide
    for args, expected in zip(cases, expected_values):
        call = _call_text(name, params, args)
        try:
            returned = student(*args)
        except NotImplementedError as error:
            raise NotAnswered(
                f"{name} is not answered yet: `raise NotImplementedError()` is still in "
                f"{_innermost_function(error)}(). Replace it with your code, run that cell, "
                "then run this check again."
            ) from None
        except Exception as error:  # the student's code failed: say where, not a deep traceback
            raise CheckFailed(f"{call} raised {type(error).__name__}: {error}\nHint: {hint}") from None
        try:
            got = convert(returned)
        except WrongType as problem:
            raise CheckFailed(f"{call} returned {problem}.{_int_advice(returned, expected)}\n"
                              f"Expected: {_short(expected)}\nHint: {hint}") from None
        mismatch = compare(expected, got, args)
        if mismatch:
            note = diagnose(args, expected, got) if diagnose else None
            raise CheckFailed(
                f"{call} {mismatch}.\n"
                + (f"Likely cause: {note}\n" if note else "")
                + f"Hint: {hint}"
            )
    if then is not None:
        then()
    print(f"{name}: all {len(cases)} cases correct.")
