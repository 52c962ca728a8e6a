"""Shared machinery of the spec classes: frozen pydantic models whose
validation errors become one :class:`~learnedperf.errors.SpecError` naming the field."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import SpecError

T = TypeVar("T", bound="Spec")


def _loc_to_field(prefix: str, loc: tuple) -> str:
    parts = [prefix] if prefix else []
    for item in loc:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
        else:
            parts.append(key_text(item))
    return ".".join(parts)


def key_text(key: object) -> str:
    """A user's key as it may appear in a one-line message (control characters escaped)."""
    text = str(key)
    return text if text.isprintable() else repr(text)


class FieldValueError(ValueError):
    """A cross-field check's failure inside a spec validator, naming the field it blames.

    Pydantic reports errors of ``model_validator`` functions at the model itself; raising this
    (a ``ValueError``, so pydantic still wraps it) lets :func:`spec_error_from` name the field.
    """

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def spec_error_from(exc: ValidationError, prefix: str) -> SpecError:
    """Turn a pydantic ``ValidationError`` into one SpecError naming the first field."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = tuple(first.get("loc", ()))
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, FieldValueError):
        loc = loc + (cause.field,)
    field = _loc_to_field(prefix, loc)
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        msg = "unknown field"
    elif kind == "missing":
        msg = "required field is missing"
    else:
        msg = first.get("msg", "invalid value")
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if "input" in first and kind not in ("model_type", "dict_type") and not isinstance(first["input"], dict):
            msg = f"{msg} (got {first['input']!r})"
    if len(errors) > 1:
        msg += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return SpecError(field, msg)


class Spec(BaseModel):
    """Base of every spec: frozen, strict about unknown keys, JSON round-trippable."""

    # strict: a count given as "2", 2.0 or true is a wrong field, not a 2 (or a 1) — input is JSON, whose
    # numbers and booleans need no coercion; an int is still accepted where a float is expected
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, strict=True)

    @classmethod
    def parse(cls: type[T], data: Any, prefix: str = "") -> T:
        """Validate ``data`` (a dict) into this spec; raise SpecError naming the field."""
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise SpecError(prefix, f"expected a JSON object, got {type(data).__name__}")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise spec_error_from(exc, prefix) from None

    def to_dict(self) -> dict:
        """JSON-compatible dict; ``parse(to_dict())`` gives an equal spec. Keys at their
        :meth:`omitted_defaults` are left out."""
        out = self.model_dump(mode="json", exclude_none=True)
        for key, default in self.omitted_defaults().items():
            if out.get(key) == default:
                del out[key]
        return out

    def omitted_defaults(self) -> dict:
        """Optional keys that :meth:`to_dict` writes only where they differ from these defaults, so that a
        spec written before they existed serialises (and hashes) as it did; none here."""
        return {}
