"""Validating Spark Declarative Pipelines specs before they are written: the validator lives with the
runner (``broker_sim``), so it is imported lazily by name and may be absent."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from controller.admin.common import AdminError
from controller.protocol.tasks.spec import DeclarativePipeline

DECLARATIVE_VALIDATOR = "broker_sim.runners.declarative.validate_declarative"


def load_declarative_validator() -> Callable[..., Any] | None:
    """``broker_sim.runners.declarative.validate_declarative`` if it exists (imported lazily), else None."""
    module_name, func = DECLARATIVE_VALIDATOR.rsplit(".", 1)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name in (module_name, "broker_sim.runners", "broker_sim"):
            return None
        raise AdminError(f"cannot load the declarative pipeline validator: {exc}") from None
    fn = getattr(module, func, None)
    return fn if callable(fn) else None


def run_validator(fn: Callable[..., Any], pipeline: DeclarativePipeline) -> str | None:
    """Call the validator with the pipeline (or its project directory, if that is what it takes);
    return the problem it reports, or None. It may raise, or return False / a message / a list of them."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    wants_path = bool(params) and params[0] in ("project", "path", "project_dir", "project_path", "directory", "root")
    try:
        out = fn(pipeline.project if wants_path else pipeline)
    except Exception as exc:  # the validator's verdict, whatever type it uses
        text = str(exc).strip() or type(exc).__name__
        return text if isinstance(exc, (ValueError, OSError)) else f"{type(exc).__name__}: {text}"
    if out is None or out is True:
        return None
    if out is False:
        return "refused by the declarative pipeline validator"
    if isinstance(out, str):
        return out or None
    if isinstance(out, (list, tuple)):
        return "; ".join(str(p) for p in out) or None
    return None
