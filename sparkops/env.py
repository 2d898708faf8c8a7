"""Strict readers for configuration from the environment.

Every setting SparkOps takes from the environment goes through these helpers, so a typo such as
``SPARKOPS_COLLECT_INTERVAL=5s`` stops the process at start-up with a message naming the variable,
instead of silently running on a default.
"""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def env_str(name: str, default: str) -> str:
    value = _raw(name)
    return default if value is None else value


def env_optional(name: str) -> str | None:
    return _raw(name)


def env_bool(name: str, default: bool) -> bool:
    value = _raw(name)
    if value is None:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={value!r}: expected one of 1/0, true/false, yes/no, on/off")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    value = _raw(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r}: expected a whole number") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number}: must be at least {minimum}")
    return number


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    value = _raw(name)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r}: expected a number") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise ImproperlyConfigured(f"{name}={value!r}: expected a finite number")
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number}: must be at least {minimum}")
    return number


def env_list(name: str, default: list[str]) -> list[str]:
    value = _raw(name)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def env_path_below(name: str, root: str, example: str) -> str:
    """An absolute path strictly below ``root``, normalised ("" when unset). A relative path,
    one with ``..`` or one outside ``root`` stops start-up naming the variable."""
    value = _raw(name)
    if value is None:
        return ""
    path = os.path.normpath(value)
    below = path.startswith(root.rstrip("/") + "/")
    if not os.path.isabs(value) or ".." in value.split("/") or not below:
        raise ImproperlyConfigured(f"{name}={value!r}: expected an absolute path below {root}, "
                                   f"e.g. {example}")
    return path
