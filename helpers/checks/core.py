"""The machinery every exercise checker shares.

A checker calls the student's function on fixed and seeded random cases, compares each
result with the reference, and either prints one deterministic success line or raises an
AssertionError that names the input, the expected and the returned value, with a hint.
An exercise still holding ``raise NotImplementedError()`` gets a NotImplementedError that
says plainly that it is not answered yet.
"""

from __future__ import annotations

import inspect
import numbers
from typing import Any, Callable, Iterable, Sequence


def int_problem(value: Any) -> str | None:
    """Why ``value`` is not a whole number of bytes/tokens, or None when it is one."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, numbers.Real) and float(value).is_integer():
            return (f"a {type(value).__name__} ({value!r}); return an int: "
                    "use // instead of /, or int(...) around the result")
        return f"a {type(value).__name__} ({value!r}); expected an int"
    return None


def int_pair_problem(value: Any) -> str | None:
    """Why ``value`` is not a pair (tuple or list) of two ints, or None when it is one."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        return f"{value!r} ({type(value).__name__}); expected a pair (a, b) of two ints"
    for part in value:
        problem = int_problem(part)
        if problem:
            return f"a pair holding {problem}"
    return None


def _innermost_function(error: BaseException) -> str:
    tb = error.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_name


def _call_text(name: str, params: Sequence[str], args: Sequence[Any]) -> str:
    return f"{name}(" + ", ".join(f"{p}={a!r}" for p, a in zip(params, args)) + ")"


def check_function(
    student: Any,
    reference: Callable[..., Any],
    cases: Iterable[tuple],
    *,
    name: str,
    params: Sequence[str],
    hint: str,
    problem: Callable[[Any], str | None] = int_problem,
    diagnose: Callable[[tuple, Any, Any], str | None] | None = None,
) -> None:
    """Check ``student`` against ``reference`` on ``cases`` (tuples of positional arguments).

    ``problem(value)`` explains a wrongly typed return value; ``diagnose(args, expected, got)``
    may name a common mistake. Prints one success line.
    """
    cases = list(cases)
    if not callable(student):
        raise AssertionError(
            f"{name} should be a function, but it is {type(student).__name__} ({student!r}). "
            f"Run the cell that defines {name}() and keep its name and signature."
        )
    try:
        inspect.signature(student).bind(*cases[0])
    except TypeError as error:
        raise AssertionError(f"{name} must accept ({', '.join(params)}): {error}") from None
    except ValueError:
        pass  # builtins without a signature: let the call decide
    for args in cases:
        call = _call_text(name, params, args)
        expected = reference(*args)
        try:
            got = student(*args)
        except NotImplementedError as error:
            raise NotImplementedError(
                f"{name} is not answered yet: `raise NotImplementedError()` is still in "
                f"{_innermost_function(error)}(). Replace it with your code, run that cell, "
                "then run this check again."
            ) from None
        except Exception as error:  # the student's code failed: say where, not a deep traceback
            raise AssertionError(f"{call} raised {type(error).__name__}: {error}\nHint: {hint}") from None
        wrong_type = problem(got)
        if wrong_type:
            raise AssertionError(f"{call} returned {wrong_type}.\nExpected: {expected!r}\nHint: {hint}")
        same = tuple(got) == expected if isinstance(expected, tuple) else got == expected
        if not same:
            note = diagnose(args, expected, got) if diagnose else None
            raise AssertionError(
                f"{call} returned {got!r}, expected {expected!r}.\n"
                + (f"Likely cause: {note}\n" if note else "")
                + f"Hint: {hint}"
            )
    print(f"{name}: all {len(cases)} cases correct.")
