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
*args packing) that first asks torch whether a profiler runs, the flag
record_function asks itself; with none, it calls the routine and nothing else.
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
from torch.autograd.profiler import record_function

#: whether a torch profiler records now: the flag torch's record_function checks
profiling: Callable[[], bool] = torch._C._autograd._profiler_enabled

#: the arguments a range's name shows, by parameter name, when the call has them
SHOWN = ("pe", "root", "value", "cmp")

Class = TypeVar("Class", bound=type)
Function = TypeVar("Function", bound=Callable)


def describe(label: str, arguments: dict[str, Any]) -> str:
    """A range's name: `label` with the call's PE-like arguments and its bytes
    (`nbytes`, else the first tensor argument's, else none)."""
    parts = [f"{name}={arguments[name]}" for name in SHOWN
             if isinstance(arguments.get(name), (int, str)) and not isinstance(arguments.get(name), bool)]
    nbytes = arguments.get("nbytes")
    shape, dtype = arguments.get("shape"), arguments.get("dtype")
    if not isinstance(nbytes, int) and isinstance(dtype, torch.dtype):    # empty, zeros, calloc
        try:
            nbytes = torch.Size([shape] if isinstance(shape, int) else shape).numel() * dtype.itemsize
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


def ranged(function: Function, label: str) -> Function:
    """`function` with a range named `label` per call while a profiler records,
    and with its own signature, docstring and attributes (inspect, help and
    typing see the original, through __wrapped__)."""
    signature = inspect.signature(function)
    namespace: dict[str, Any] = {"_call": function, "_profiling": profiling,
                                 "_range": call_range, "_label": label}
    defined, passed, named = [], [], []
    keyword_only = positional_only = False
    for parameter in signature.parameters.values():
        name = parameter.name
        if parameter.kind is parameter.VAR_POSITIONAL:
            defined.append(f"*{name}")
            passed.append(f"*{name}")
            keyword_only = True
            continue
        if parameter.kind is parameter.VAR_KEYWORD:
            defined.append(f"**{name}")
            passed.append(f"**{name}")
            continue
        if positional_only and parameter.kind is not parameter.POSITIONAL_ONLY:
            defined.append("/")
            positional_only = False
        if parameter.kind is parameter.POSITIONAL_ONLY:
            positional_only = True
        if parameter.kind is parameter.KEYWORD_ONLY and not keyword_only:
            defined.append("*")
            keyword_only = True
        text = name
        if parameter.default is not parameter.empty:
            namespace[f"_default_{name}"] = parameter.default
            text += f"=_default_{name}"
        defined.append(text)
        passed.append(f"{name}={name}" if parameter.kind is parameter.KEYWORD_ONLY else name)
        named.append(f"{name!r}: {name}")
    if positional_only:
        defined.append("/")
    call = f"_call({', '.join(passed)})"
    source = (f"def {function.__name__}({', '.join(defined)}):\n"
              f"    if _profiling():\n"
              f"        with _range(_label, {{{', '.join(named)}}}):\n"
              f"            return {call}\n"
              f"    return {call}\n")
    exec(compile(source, f"<shmemvm.core.trace: {label}>", "exec"), namespace)  # noqa: S102
    wrapper = functools.update_wrapper(namespace[function.__name__], function)
    wrapper.__shmemvm_traced__ = label    # type: ignore[attr-defined]
    return wrapper    # type: ignore[return-value]


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
    for name, value in list(vars(cls).items()):
        if not name.startswith("_") and name not in skip and inspect.isfunction(value) \
                and not hasattr(value, "__shmemvm_traced__"):
            setattr(cls, name, ranged(value, f"shmemvm.{name}"))
    return cls
