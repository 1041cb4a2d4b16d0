"""Turn pydantic validation errors into one line per problem, in manifest (camelCase) paths."""

from __future__ import annotations

from pydantic import ValidationError


def describe_validation_error(exc: ValidationError, prefix: str = "") -> list[str]:
    lines = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"] if p not in ("function-after",))
        message = err["msg"].removeprefix("Value error, ")
        where = f"{prefix}{path}" if path else prefix.rstrip(".") or "(top level)"
        if err["type"] == "extra_forbidden":
            message = "unknown field (check the spelling; fields are camelCase)"
        lines.append(f"{where}: {message}")
    return lines


def describe(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(describe_validation_error(exc))
    return str(exc)
