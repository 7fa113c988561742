"""JSON Schema checks for what plugins and agents declare: tool arguments and settings values.

Every schema is checked once, when it is declared (a tool registered, a settings field loaded):
against its dialect's meta-schema (Draft 2020-12 unless its ``$schema`` names another) and, for
Draft 2020-12, with no keyword the draft does not define (``x-`` extensions aside) and no
``format`` this validator cannot assert. A typo such as ``minLenght`` is refused there, not
silently ignored at every call. The validator built then is kept and reused for every value.

Values are validated by `jsonschema <https://python-jsonschema.readthedocs.io/>`_ (the reference
implementation, complete: ``$ref``/``$defs``, ``allOf``, ``not``, ``const``, ``if``/``then``/``else``,
``patternProperties``, ``uniqueItems``, ``dependentRequired``, ``format``, ...). The first error, in
a stable order, becomes one short message naming the offending place (``arguments.edits[0].search
is required``), in the wording the gateway has always used.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import orjson
from jsonschema import Draft202012Validator, FormatChecker, validators
from jsonschema.exceptions import SchemaError, ValidationError
from jsonschema.protocols import Validator

__all__ = ["cached_validator", "compile_schema", "error_message", "first_error", "type_name"]

_DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"
# Draft 2020-12 extended so that a keyword no vocabulary defines is an error: the draft's own
# meta-schema via $ref, and this one's $dynamicAnchor so that every subschema (properties, items,
# $defs, ...) is checked by it too (the draft's subschemas use $dynamicRef "#meta").
_STRICT_META: dict[str, Any] = {
    "$schema": _DRAFT_2020_12,
    "$id": "urn:agent-gateway:json-schema-2020-12-strict",
    "$dynamicAnchor": "meta",
    "$ref": _DRAFT_2020_12,
    "patternProperties": {"^x-": True},
    "unevaluatedProperties": False,
}
_STRICT = Draft202012Validator(_STRICT_META)
# Formats asserted (the spec lets an implementation assert them): those jsonschema checks with the
# standard library alone, so the same schema means the same thing on every install (its default
# checker also asserts date-time, uri, ... only where optional packages happen to be installed).
# Any other format is refused at declaration rather than ignored.
ASSERTED_FORMATS = ("date", "email", "idn-email", "ipv4", "ipv6", "regex", "uuid")
FORMAT_CHECKER = FormatChecker(formats=ASSERTED_FORMATS)

# Validators by the schema's canonical JSON (the same schema declared by every gateway of a
# process, e.g. in tests, is checked once) and by identity (the per-call fast path).
_MAX_CACHED = 1024
_by_text: dict[bytes, Validator] = {}
_by_id: dict[int, tuple[Mapping[str, Any], Validator]] = {}
_lock = threading.Lock()


def _pointer(path: Iterable[Any]) -> str:
    return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in path)


def _formats(schema: Any) -> Iterable[tuple[list[Any], str]]:
    """Every ``format`` value in a schema, with where it is (walks JSON, bounded by its size)."""
    stack: list[tuple[list[Any], Any]] = [([], schema)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("format"), str):
                yield path, node["format"]
            for key, child in node.items():
                # const, enum, default and examples hold values, not schemas
                if key not in ("const", "enum", "default", "examples"):
                    stack.append(([*path, key], child))
        elif isinstance(node, list):
            stack.extend(([*path, i], child) for i, child in enumerate(node))


def _check(schema: Mapping[str, Any], owner: str) -> Validator:
    if not isinstance(schema, Mapping):
        raise ValueError(f"{owner} must be a JSON Schema object, got {type_name(schema)}")
    cls = validators.validator_for(schema, default=Draft202012Validator)
    dialect = cls.META_SCHEMA.get("$id", cls.__name__)
    try:
        cls.check_schema(dict(schema))
    except SchemaError as exc:
        where = _pointer(exc.absolute_path)
        raise ValueError(f"{owner} is not a valid JSON Schema ({dialect}) at {where}: {exc.message}") from None
    if cls is Draft202012Validator:
        # The deepest error names the keyword itself; the ones above it only repeat it.
        errors = sorted(_STRICT.iter_errors(schema), key=lambda e: -len(e.absolute_path))
        if errors:
            error = errors[0]
            raise ValueError(
                f"{owner} is not a valid JSON Schema at {_pointer(error.absolute_path)}: {error.message} "
                "(keywords Draft 2020-12 does not define are refused, not ignored; extensions start with x-)"
            )
        for path, name in _formats(schema):
            if name not in FORMAT_CHECKER.checkers:
                known = ", ".join(sorted(FORMAT_CHECKER.checkers))
                raise ValueError(
                    f"{owner} is not a valid JSON Schema at {_pointer(path)}: format {name!r} cannot be "
                    f"checked here (checked: {known}); use pattern instead"
                )
    return cls(schema, format_checker=FORMAT_CHECKER)


def _bounded(cache: dict[Any, Any]) -> None:
    if len(cache) >= _MAX_CACHED:
        cache.pop(next(iter(cache)), None)  # the oldest: bounded however many schemas come


def compile_schema(schema: Mapping[str, Any], owner: str = "schema") -> Validator:
    """The validator of ``schema``, checked and built once per distinct schema and then reused.
    Raises ValueError naming ``owner`` (e.g. ``"tool 'x': input_schema"``) and the place when the
    schema is invalid. Keep the validator for as long as the schema is used."""
    try:
        text = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
    except TypeError as exc:
        raise ValueError(f"{owner} is not JSON: {exc}") from None
    validator = _by_text.get(text)
    if validator is None:
        validator = _check(schema, owner)
        with _lock:
            _bounded(_by_text)
            _by_text[text] = validator
    return validator


def cached_validator(schema: Mapping[str, Any], owner: str = "schema") -> Validator:
    """:func:`compile_schema` for callers that keep the schema, not the validator: found again
    by the schema object's identity, without serialising it."""
    found = _by_id.get(id(schema))
    if found is not None and found[0] is schema:
        return found[1]
    validator = compile_schema(schema, owner)
    with _lock:
        _bounded(_by_id)
        # The schema itself is held, so its id cannot be reused by another object while cached.
        _by_id[id(schema)] = (schema, validator)
    return validator


# -- messages ------------------------------------------------------------------------------------

_TYPES: dict[str, Callable[[Any], bool]] = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}
# Which error is told when several are found: what the value is before what it holds, the
# shallowest place first, and oneOf/anyOf last (their hint is the least precise).
_RANK = {"type": 0, "required": 1, "dependentRequired": 1, "additionalProperties": 2, "enum": 3, "const": 3}
_COMBINATORS = ("oneOf", "anyOf")


def type_name(value: Any) -> str:
    """The JSON type of a Python value (``integer`` for 3, ``boolean`` for True)."""
    for name, test in _TYPES.items():
        if test(value):
            return name
    return type(value).__name__


def _rank(error: ValidationError) -> tuple[bool, int, int]:
    return (error.validator in _COMBINATORS, len(error.absolute_path), _RANK.get(str(error.validator), 4))


def first_error(validator: Validator, value: Any) -> ValidationError | None:
    """The error to report for ``value`` (None: valid), the same one every time."""
    errors = sorted(validator.iter_errors(value), key=_rank)  # stable: ties keep the schema's order
    return errors[0] if errors else None


def _place(where: str, path: Iterable[Any]) -> str:
    return where + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def _short(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _hint(keyword: str, options: Any) -> str:
    groups = [" + ".join(o["required"]) for o in options if isinstance(o, Mapping) and o.get("required")]
    if not groups:
        return f"must match {keyword}"
    return f"give {'exactly' if keyword == 'oneOf' else 'at least'} one of: {'; '.join(groups)}"


def error_message(error: ValidationError, where: str) -> str:
    """``error`` as one sentence naming its place below ``where`` (``arguments.path is required``)."""
    place = _place(where, error.absolute_path)
    # jsonschema types these as possibly unset; an error from iter_errors always has them.
    keyword, expected, value, schema = error.validator, cast(Any, error.validator_value), error.instance, error.schema
    if "propertyNames" in error.relative_schema_path:
        return f"{place}: the key {_short(value, 80)} is not allowed: {error.message[:200]}"
    if keyword == "type":
        names = [expected] if isinstance(expected, str) else list(expected)
        return f"{place} must be {' or '.join(names)}, got {type_name(value)}"
    if keyword == "required" and isinstance(value, dict):
        missing = next((k for k in expected if k not in value), "?")
        return f"{place}.{missing} is required"
    if keyword == "dependentRequired" and isinstance(value, dict):
        for given, needs in expected.items():
            missing = [k for k in needs if k not in value]
            if given in value and missing:
                return f"{place}.{missing[0]} is required when {given} is given"
    if keyword == "additionalProperties" and isinstance(value, dict) and isinstance(schema, Mapping):
        known_names = schema.get("properties") or {}
        patterns = list(schema.get("patternProperties") or {})
        extra = next(
            (k for k in value if k not in known_names and not any(re.search(p, k) for p in patterns)),
            None,
        )
        if extra is not None:
            known = ", ".join(sorted(known_names)) or "none"
            return f"{place}.{extra} is not a known argument (known: {known})"
    if keyword == "enum":
        return f"{place} must be one of {', '.join(repr(c) for c in expected)}"
    if keyword == "const":
        return f"{place} must be {expected!r}"
    if keyword in _COMBINATORS:
        return f"{place}: {_hint(str(keyword), expected)}"
    if keyword == "not":
        return f"{place} must not match {_short(expected)}"
    if keyword is None or schema is False:  # a `false` schema: nothing is allowed there
        return f"{place} is not allowed"
    simple = {
        "maxLength": f"is longer than {expected} characters",
        "minLength": f"is shorter than {expected} characters",
        "pattern": f"does not match {expected}",
        "minimum": f"must be at least {expected}",
        "maximum": f"must be at most {expected}",
        "exclusiveMinimum": f"must be more than {expected}",
        "exclusiveMaximum": f"must be less than {expected}",
        "multipleOf": f"must be a multiple of {expected}",
        "minItems": f"needs at least {expected} item(s)",
        "maxItems": f"allows at most {expected} item(s)",
        "uniqueItems": "must not hold the same item twice",
        "minProperties": f"needs at least {expected} member(s)",
        "maxProperties": f"allows at most {expected} member(s)",
        "format": f"is not a valid {expected}",
    }
    if keyword in simple:
        return f"{place} {simple[str(keyword)]}"
    return f"{place}: {error.message[:200]}"
