"""Docstring parts that several routines share, written once: decorators that
append a shared section, or fill named placeholders, and keep the function's
type (so type checkers still see its real signature)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

Function = TypeVar("Function", bound=Callable)


def appended(section: str) -> Callable[[Function], Function]:
    """Append `section` (e.g. a Raises: block) to the function's docstring."""
    def add(function: Function) -> Function:
        if function.__doc__:  # None under python -OO
            function.__doc__ = function.__doc__.rstrip() + "\n" + section
        return function
    return add


def filled(**parts: str) -> Callable[[Function], Function]:
    """Replace each {name} in the function's docstring by parts[name]."""
    def fill(function: Function) -> Function:
        if function.__doc__:
            doc = function.__doc__
            for name, text in parts.items():
                doc = doc.replace("{" + name + "}", text)
            function.__doc__ = doc
        return function
    return fill
