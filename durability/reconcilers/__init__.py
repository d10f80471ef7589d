"""Reconcilers: ask the external system whether an effect happened (docs/reconcilers.md).

`base` defines the interface and the registry; importing this package registers the
built-in kinds, `http` and `git`. A project configures one per target system with a
`ReconcilerConfig`; `services` probes effects and settles them on the answers.
"""

from __future__ import annotations

from durability.reconcilers import git_probe, http_probe
from durability.reconcilers.base import (
    REGISTRY,
    Answer,
    Found,
    NotFound,
    ProbeConfig,
    Reconciler,
    Unknown,
    UnknownKind,
    reconciler_for,
    register,
)

__all__ = [
    "REGISTRY",
    "Answer",
    "Found",
    "NotFound",
    "ProbeConfig",
    "Reconciler",
    "Unknown",
    "UnknownKind",
    "git_probe",
    "http_probe",
    "reconciler_for",
    "register",
]
