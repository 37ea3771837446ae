"""shmemvm's calls as ranges in torch.profiler traces.

While a torch profiler records (``with torch.profiler.profile(): ...``), every
call of a heap's routines (SymmetricHeap's methods, a Ctx's, and so the
module functions of api.py, which call them) is a ``record_function`` range
named after the call, with the PE and the bytes where the call has them:

    shmemvm.put(pe=1, bytes=8)
    shmemvm.wait_until(bytes=8)
    shmemvm.all_reduce(bytes=4096)
    shmemvm.malloc(bytes=1048576)

so puts, waits and collectives show in the trace viewer beside the kernels
and torch operators around them. (The name carries them: torch's trace
export drops a record_function's args string.)

The hook is one class decorator, traced(), applied where the routines are
bound to their classes (heap.py, openshmem/contexts.py). Each routine is
wrapped once, at import, by a function of the routine's own signature (no
*args packing) that first reads torch's flag of a running profiler (FLAG); with
none, it calls the routine and nothing else.
benchmarks/bench_trace.py measures what that costs an 8 B put.

Beside profile.py, not instead of it: SHMEMVM_PROFILE times the internal
steps of a heap's allocation path (agreement, exchange, mapping) and sums
them, with no profiler; these ranges show the public calls, one by one, in a
torch profiler's timeline.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.autograd.profiler as autograd_profiler
from torch.autograd.profiler import record_function


class _AskTorch:
    """Where torch has no Python-level flag (older versions): the flag of
    torch's C++ profiler, which record_function checks, asked at each call."""

    @property
    def _is_profiler_enabled(self) -> bool:
        return bool(torch._C._autograd._profiler_enabled())


#: what holds `_is_profiler_enabled`, the flag the wrappers read at each call: torch's
#: autograd profiler module, which every Python-level start sets and every stop clears
#: (torch.profiler.profile, its schedule's active steps, autograd.profiler.profile,
#: emit_nvtx, emit_itt): a module attribute, read in a few ns, where the C++ flag
#: is a call several times as long. A profiler started from C++ alone is not seen.
FLAG = autograd_profiler if hasattr(autograd_profiler, "_is_profiler_enabled") else _AskTorch()


def profiling() -> bool:
    """Whether a torch profiler records now (the wrappers' test)."""
    return bool(FLAG._is_profiler_enabled)

#: the arguments a range's name shows, by parameter name, when the call has them
SHOWN = ("pe", "root", "value", "cmp")

Class = TypeVar("Class", bound=type)
Function = TypeVar("Function", bound=Callable)


def describe(label: str, arguments: dict[str, Any]) -> str:
    """A range's name: `label` with the call's PE-like arguments and its bytes
    (`nbytes`, else the first tensor argument's, else none)."""
    parts = [f"{name}={arguments[name]}" for name in SHOWN
             if isinstance(arguments.get(name), (int, str))
             and not isinstance(arguments.get(name), bool)]
    nbytes = arguments.get("nbytes")
    shape: Any = arguments.get("shape")
    dtype = arguments.get("dtype")
    if not isinstance(nbytes, int) and isinstance(dtype, torch.dtype):    # empty, zeros, calloc
        try:
            nbytes = torch.Size([shape] if isinstance(shape, int) else shape).numel() \
                * dtype.itemsize
        except (TypeError, ValueError):
            nbytes = None     # a bad shape: the routine itself says what is wrong
    if not isinstance(nbytes, int):
        nbytes = next((value.numel() * value.element_size() for value in arguments.values()
                       if isinstance(value, torch.Tensor)), None)
    if nbytes is not None:
        parts.append(f"bytes={nbytes}")
    return f"{label}({', '.join(parts)})"


def call_range(label: str, arguments: dict[str, Any]) -> record_function:
    """The range of one call (made only while a profiler records)."""
    return record_function(describe(label, arguments))


#: wrapper factories by the parameter list they take: compiled once each, many at a time
_factories: dict[str, Callable] = {}


def _shape(function: Callable) -> str:
    """The source of a factory making `function`'s wrapper: a function with
    `function`'s parameters (names, kinds, which have defaults) that asks the
    flag, then calls it. Read from its code object (inspect.signature costs
    several times more, for all the routines at every import)."""
    code = function.__code__
    n_positional, n_keyword = code.co_argcount, code.co_kwonlyargcount
    names = code.co_varnames[:n_positional + n_keyword]
    n_defaults = len(function.__defaults__ or ())
    keyword_defaults = function.__kwdefaults__ or {}
    defined, passed = [], []
    for i, name in enumerate(names[:n_positional]):
        default = i >= n_positional - n_defaults
        defined.append(f"{name}=_defaults[{name!r}]" if default else name)
        passed.append(name)
        if i + 1 == code.co_posonlyargcount:
            defined.append("/")
    extra = n_positional + n_keyword
    if code.co_flags & inspect.CO_VARARGS:
        defined.append(f"*{code.co_varnames[extra]}")
        passed.append(f"*{code.co_varnames[extra]}")
        extra += 1
    elif n_keyword:
        defined.append("*")
    for name in names[n_positional:]:
        defined.append(f"{name}=_defaults[{name!r}]" if name in keyword_defaults else name)
        passed.append(f"{name}={name}")
    if code.co_flags & inspect.CO_VARKEYWORDS:
        defined.append(f"**{code.co_varnames[extra]}")
        passed.append(f"**{code.co_varnames[extra]}")
    arguments = ", ".join(f"{name!r}: {name}" for name in names)
    call = f"_call({', '.join(passed)})"
    return (f"    def wrapper({', '.join(defined)}):\n"
            f"        if _flag._is_profiler_enabled:\n"
            f"            with _range(_label, {{{arguments}}}):\n"
            f"                return {call}\n"
            f"        return {call}\n"
            f"    return wrapper\n")


def _compile(shapes: set[str]) -> None:
    """Make the factories of `shapes` not made yet, in one compile."""
    missing = sorted(shape for shape in shapes if shape not in _factories)
    if not missing:
        return
    source = "".join(f"def factory_{i}(_call, _label, _defaults, _flag, _range):\n{shape}"
                     for i, shape in enumerate(missing))
    namespace: dict[str, Any] = {}
    exec(compile(source, "<shmemvm.core.trace>", "exec"), namespace)  # noqa: S102
    for i, shape in enumerate(missing):
        _factories[shape] = namespace[f"factory_{i}"]


def _wrap(function: Function, label: str, shape: str) -> Function:
    defaults = dict(zip(function.__code__.co_varnames[function.__code__.co_argcount
                                                      - len(function.__defaults__ or ()):],
                        function.__defaults__ or ()))
    defaults.update(function.__kwdefaults__ or {})
    wrapper = _factories[shape](function, label, defaults, FLAG, call_range)
    functools.update_wrapper(wrapper, function)
    wrapper.__shmemvm_traced__ = label    # type: ignore[attr-defined]
    return wrapper    # type: ignore[no-any-return]


def ranged(function: Function, label: str) -> Function:
    """`function` with a range named `label` per call while a profiler records,
    and with its own signature, docstring and attributes (inspect, help and
    typing see the original, through __wrapped__)."""
    shape = _shape(function)
    _compile({shape})
    return _wrap(function, label, shape)


def named(label: str) -> Callable[[Function], Function]:
    """Function decorator: ranged(function, label) (for a call that is no
    routine of a class, like api.init)."""
    return lambda function: ranged(function, label)


def traced(cls: Class | None = None, *, skip: tuple[str, ...] = ()) -> Any:
    """Class decorator (``@traced`` or ``@traced(skip=(...))``): every public
    function defined in `cls` itself (the routines bound there by name), but
    those named in `skip` (helpers the routines call, not calls of a user), is
    ranged() as "shmemvm.<name>". Inherited ones are their own class's
    business; properties, static and class methods are left alone."""
    if cls is None:
        return functools.partial(traced, skip=skip)
    routines = {name: value for name, value in vars(cls).items()
                if not name.startswith("_") and name not in skip and inspect.isfunction(value)
                and not hasattr(value, "__shmemvm_traced__")}
    shapes = {name: _shape(function) for name, function in routines.items()}
    _compile(set(shapes.values()))
    for name, function in routines.items():
        setattr(cls, name, _wrap(function, f"shmemvm.{name}", shapes[name]))
    return cls
