"""Backends by name. Each module is imported only when asked for, because the
GPU ones need packages (cuda-bindings, hip-python) that a host-only
installation does not have."""

from __future__ import annotations

import importlib

from .. import config
from .base import VMMBackend

_REGISTRY = {
    "host": ("shmemvm.backends.host", "HostBackend"),
    "cuda": ("shmemvm.backends.cuda", "CudaBackend"),
    "hip": ("shmemvm.backends.hip", "HipBackend"),
}


def _load(name: str):
    module, cls = _REGISTRY[name]
    return getattr(importlib.import_module(module), cls)


def available(name: str) -> bool:
    """Whether backend `name` can run here (package importable and a device present)."""
    try:
        return _load(name).is_available()
    except ImportError:
        return False


def create_backend(name: str | VMMBackend | None = None, **options) -> VMMBackend:
    if isinstance(name, VMMBackend):
        return name
    name = config.setting("SHMEMVM_BACKEND", name).strip().lower()
    if name == "auto":
        name = next((n for n in ("cuda", "hip") if available(n)), "host")
    if name not in _REGISTRY:
        raise ValueError(f"unknown backend {name!r}; choose one of "
                         f"{sorted(_REGISTRY)} or 'auto' (SHMEMVM_BACKEND)")
    return _load(name)(**options)


__all__ = ["VMMBackend", "create_backend", "available"]
