"""JSON values in and out of the database: validation, encoding and handler codecs.

Inputs and outputs are JSON values. Before anything is
written, :func:`encode_json` proves a value is JSON that PostgreSQL's ``jsonb`` accepts:
no NaN or infinity, no string holding NUL (``\\u0000``), string keys only. A handler
whose input parameter or return value is annotated with a dataclass or a pydantic model
gets it decoded and encoded by a :class:`Codec`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from cyclone.errors import ValidationError

__all__ = [
    "MAX_JSON_BYTES",
    "Codec",
    "check_decodes",
    "clean_text",
    "codec_for",
    "encode_json",
    "find_nul",
]

_encoder = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def find_nul(value: Any, path: str = "$") -> str | None:
    """The JSON path of the first string (value or key) in ``value`` holding NUL."""
    if isinstance(value, str):
        return path if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and "\x00" in key:
                return f"{path}.{key!r}"
            found = find_nul(item, f"{path}.{key}")
            if found:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = find_nul(item, f"{path}[{index}]")
            if found:
                return found
    return None


MAX_JSON_BYTES = 255 * 1024 * 1024
"""Largest JSON text accepted: PostgreSQL refuses jsonb values from 256 MiB on."""


def encode_json(value: Any, what: str) -> str:
    """Encode ``value`` as JSON text for a ``jsonb`` column.

    Args:
        value: any JSON value (dict, list, str, int, float, bool, None); tuples are
            encoded as lists and non-string keys as strings, as ``json.dumps`` does.
        what: what the value is, for the error message ("input of kind 'charge'").

    Raises:
        ValidationError: the value is not JSON (a set, an arbitrary object, NaN or
            infinity), is nested too deeply, holds NUL or a lone surrogate in a
            string, or is over 255 MiB encoded.
    """
    try:
        text = _encoder.encode(value)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"{what} is not a JSON value ({exc}): {_short(value)}") from exc
    except RecursionError:
        raise ValidationError(f"{what} is nested too deeply to encode as JSON") from None
    if "\\u0000" in text:
        try:
            path = find_nul(value)
        except RecursionError:
            path = "$"
        if path is not None:  # not an escaped backslash followed by "u0000"
            raise ValidationError(f"{what} holds a NUL character at {path}; jsonb cannot store it")
    size = len(text)
    if not text.isascii():
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            bad = text[exc.start : exc.end]
            raise ValidationError(f"{what} holds a lone surrogate ({bad!a}), not UTF-8") from None
    if size > MAX_JSON_BYTES:
        raise ValidationError(f"{what} is {size} bytes of JSON, over the 255 MiB limit")
    return text


def clean_text(text: str) -> str:
    """``text`` made storable in a ``text`` column: NUL shown as ``\\0``, lone
    surrogates replaced. For error messages and tracebacks, which come from anywhere."""
    if "\x00" in text:
        text = text.replace("\x00", "\\0")
    if not text.isascii():
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # a repr that fails (an int too long to print, a broken __repr__)
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 200 else text[:197] + "..."


@dataclasses.dataclass(frozen=True, slots=True)
class Codec:
    """How one handler's input is decoded and its output encoded.

    ``decode`` turns the stored JSON value into what the handler's parameter expects;
    ``encode`` turns the handler's return value into a JSON value. ``model`` is the
    dataclass or pydantic model ``decode`` builds, or ``None`` when it passes the JSON
    value through (then there is no shape to check before writing).
    """

    decode: Callable[[Any], Any]
    encode: Callable[[Any], Any]
    model: type | None = None


def _identity(value: Any) -> Any:
    return value


def _encode_any(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    dump = getattr(value, "model_dump", None)
    if callable(dump):  # by alias: what the model validates back (model_validate)
        return dump(mode="json", by_alias=True)
    return value


PLAIN = Codec(decode=_identity, encode=_encode_any)
"""The codec for unannotated or plain JSON annotations."""


def codec_for(annotation: Any) -> Codec:
    """The codec for a handler whose input parameter is annotated with ``annotation``.

    A dataclass is built from the stored object with ``cls(**value)``; a pydantic model
    with ``cls.model_validate(value)``. Any other annotation passes the JSON value
    through. Return values that are dataclasses or pydantic models are always encoded.
    """
    if isinstance(annotation, type):
        if dataclasses.is_dataclass(annotation):
            cls = annotation

            def decode_dataclass(value: Any) -> Any:
                return value if isinstance(value, cls) else cls(**value)

            return Codec(decode=decode_dataclass, encode=_encode_any, model=cls)
        validate = getattr(annotation, "model_validate", None)
        if callable(validate):
            return Codec(decode=validate, encode=_encode_any, model=annotation)
    return PLAIN


def check_decodes(codec: Codec, text: str, what: str) -> None:
    """Decode ``text`` (JSON text from :func:`encode_json`) as a worker will for a
    handler with ``codec``: parsed, then given to the dataclass or pydantic model, so
    that a value of the wrong shape is refused before anything is written. Nothing is
    checked for a codec without a model.

    Raises:
        ValidationError: the value does not fit the model, naming ``what``, the model
            and the problem (a missing or unexpected field, a wrong type, ...).
    """
    model = codec.model
    if model is None:
        return
    try:
        codec.decode(json.loads(text))
    except Exception as exc:  # whatever the model's constructor or validator raises
        problem = " ".join(str(exc).split()) or type(exc).__name__
        name = getattr(model, "__qualname__", repr(model))
        raise ValidationError(f"{what} does not fit {name}: {problem}") from exc
