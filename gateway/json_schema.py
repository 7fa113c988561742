"""JSON Schema checks for what plugins and agents declare: tool arguments and settings values.

Every schema is checked once, when it is declared (a tool registered, a settings field loaded):
against its dialect's meta-schema (Draft 2020-12 unless its ``$schema`` names another) and, for
Draft 2020-12, with no keyword the draft does not define (``x-`` extensions aside) and no
``format`` this validator cannot assert. A typo such as ``minLenght`` is refused there, not
silently ignored at every call. The common subset of the draft the built-in tools and settings
use is recognised without jsonschema (a gateway starts without importing it); any other schema
gets jsonschema's full check. The validator is built on the first value, kept and reused.

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
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

import orjson

if TYPE_CHECKING:  # jsonschema itself is imported when a schema or a value first needs it
    from jsonschema import FormatChecker
    from jsonschema.exceptions import ValidationError
    from jsonschema.protocols import Validator

__all__ = ["SchemaValidator", "cached_validator", "compile_schema", "error_message", "first_error", "type_name"]

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
# Formats asserted (the spec lets an implementation assert them): those jsonschema checks with the
# standard library alone, so the same schema means the same thing on every install (its default
# checker also asserts date-time, uri, ... only where optional packages happen to be installed).
# Any other format is refused at declaration rather than ignored.
ASSERTED_FORMATS = ("date", "email", "idn-email", "ipv4", "ipv6", "regex", "uuid")

# -- the keywords of Draft 2020-12 (tests/test_json_schema_keywords.py compares these tables with
# the meta-schemas jsonschema ships) ---------------------------------------------------------------

# Every keyword its meta-schema evaluates: the seven vocabularies' and the top level's (earlier
# drafts' names it still describes).
DRAFT_2020_12_KEYWORDS = frozenset(
    {
        # core
        "$anchor", "$comment", "$defs", "$dynamicAnchor", "$dynamicRef", "$id", "$ref", "$schema", "$vocabulary",
        # applicator
        "additionalProperties", "allOf", "anyOf", "contains", "dependentSchemas", "else", "if", "items", "not",
        "oneOf", "patternProperties", "prefixItems", "properties", "propertyNames", "then",
        # unevaluated
        "unevaluatedItems", "unevaluatedProperties",
        # validation
        "const", "dependentRequired", "enum", "exclusiveMaximum", "exclusiveMinimum", "maxContains", "maxItems",
        "maxLength", "maxProperties", "maximum", "minContains", "minItems", "minLength", "minProperties",
        "minimum", "multipleOf", "pattern", "required", "type", "uniqueItems",
        # meta-data, format-annotation, content
        "default", "deprecated", "description", "examples", "readOnly", "title", "writeOnly", "format",
        "contentEncoding", "contentMediaType", "contentSchema",
        # the top level: earlier drafts' names
        "definitions", "dependencies", "$recursiveAnchor", "$recursiveRef",
    }
)  # fmt: skip
# Where the meta-schema applies itself again ("$dynamicRef": "#meta"), so the strict check too:
# the keyword's value is one subschema, a non-empty list of them, or an object of them by name.
SUBSCHEMA_KEYWORDS = frozenset(
    {
        "items", "contains", "additionalProperties", "propertyNames", "if", "then", "else", "not",
        "unevaluatedItems", "unevaluatedProperties", "contentSchema",
    }
)  # fmt: skip
SUBSCHEMA_LIST_KEYWORDS = frozenset({"prefixItems", "allOf", "anyOf", "oneOf"})
SUBSCHEMA_MAP_KEYWORDS = frozenset({"properties", "patternProperties", "dependentSchemas", "$defs", "definitions"})
# ("dependencies": each value a subschema or a list of names)

# What the meta-schema asks of the other keywords the fast check below knows (the rest: the full check)
_SIMPLE_TYPES = frozenset({"array", "boolean", "integer", "null", "number", "object", "string"})
_COUNTS = frozenset(
    {"maxLength", "minLength", "maxItems", "minItems", "maxProperties", "minProperties", "maxContains", "minContains"}
)
_NUMBERS = frozenset({"maximum", "minimum", "exclusiveMaximum", "exclusiveMinimum"})
_TEXTS = frozenset({"title", "description", "$comment", "format"})
_FLAGS = frozenset({"uniqueItems", "deprecated", "readOnly", "writeOnly"})
_ANY_VALUE = frozenset({"const", "default"})
_MAX_WALKED = 100_000  # subschemas the walks below look at before leaving the decision to the full check


def _is_regex(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        re.compile(value)  # what jsonschema's "regex" format asserts
    except Exception:  # any failure: the full check decides, and words it
        return False
    return True


def _names(value: Any) -> bool:
    """A list of distinct strings (the meta-schema's stringArray)."""
    return isinstance(value, list) and all(isinstance(v, str) for v in value) and len(set(value)) == len(value)


def _keyword_ok(key: str, value: Any, stack: list[Any]) -> bool:
    """Whether ``key: value`` certainly satisfies Draft 2020-12's meta-schema (its subschemas
    pushed on ``stack`` to be looked at in turn); False: unknown here, not necessarily wrong."""
    if key in SUBSCHEMA_KEYWORDS:
        stack.append(value)
        return True
    if key in SUBSCHEMA_LIST_KEYWORDS:
        if not isinstance(value, list) or not value:
            return False
        stack.extend(value)
        return True
    if key in ("properties", "dependentSchemas", "$defs"):
        if not isinstance(value, dict):
            return False
        stack.extend(value.values())
        return True
    if key == "patternProperties":
        if not isinstance(value, dict) or not all(_is_regex(k) for k in value):
            return False
        stack.extend(value.values())
        return True
    if key == "type":
        if isinstance(value, str):
            return value in _SIMPLE_TYPES
        return bool(value) and _names(value) and all(v in _SIMPLE_TYPES for v in value)
    if key in _COUNTS:  # non-negative integers (jsonschema also counts 3.0; that one: the full check)
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    if key in _NUMBERS:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if key == "multipleOf":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    if key in _TEXTS:
        return isinstance(value, str)
    if key in _FLAGS:
        return isinstance(value, bool)
    if key in ("enum", "examples"):
        return isinstance(value, list)
    if key == "required":
        return _names(value)
    if key == "dependentRequired":
        return isinstance(value, dict) and all(_names(v) for v in value.values())
    if key == "pattern":
        return _is_regex(value)
    if key in _ANY_VALUE or key.startswith("x-"):  # x-: no vocabulary's, left alone by both checks
        return True
    return False  # $ref, $id, $schema, content*, earlier drafts' keywords, unknown ones, ...


def _surely_valid(schema: Any) -> bool:
    """True when ``schema`` certainly passes the full check (Draft 2020-12's meta-schema, no
    undefined keyword) for a common subset of the draft, without jsonschema: the built-in tools'
    and settings' schemas, checked at every start. False: the full check decides (and words the
    error). Conservative: a keyword or value it is unsure of answers False."""
    if not isinstance(schema, dict):  # (a Mapping that is not a dict: the full check refuses it)
        return False
    stack: list[Any] = [schema]
    for _ in range(_MAX_WALKED):
        if not stack:
            return True
        node = stack.pop()
        if isinstance(node, bool):
            continue
        if not isinstance(node, dict):
            return False
        for key, value in node.items():
            if not isinstance(key, str) or not _keyword_ok(key, value, stack):
                return False
    return False


def _may_have_unknown(schema: Any) -> bool:
    """False when no subschema of ``schema`` (valid against the draft's meta-schema) holds a
    keyword outside DRAFT_2020_12_KEYWORDS (``x-`` aside): then the strict meta-schema finds no
    error and is skipped (it evaluates ``unevaluatedProperties`` at every subschema, the costliest
    part of checking a schema). True when one might: the strict check decides, and words its error."""
    stack: list[Any] = [schema]
    for _ in range(_MAX_WALKED):
        if not stack:
            return False
        node = stack.pop()
        if isinstance(node, bool):
            continue
        if not isinstance(node, dict):
            return True
        for key, value in node.items():
            if key in SUBSCHEMA_KEYWORDS:
                stack.append(value)
            elif key in SUBSCHEMA_LIST_KEYWORDS:
                if not isinstance(value, list):
                    return True
                stack.extend(value)
            elif key in SUBSCHEMA_MAP_KEYWORDS:
                if not isinstance(value, dict):
                    return True
                stack.extend(value.values())
            elif key == "dependencies":
                if not isinstance(value, dict):
                    return True
                stack.extend(v for v in value.values() if not isinstance(v, list))
            elif key not in DRAFT_2020_12_KEYWORDS and not (isinstance(key, str) and key.startswith("x-")):
                return True
    return True


# -- jsonschema, imported on first need -------------------------------------------------------------

_strict: Validator | None = None
_format_checker: FormatChecker | None = None


def format_checker() -> FormatChecker:
    """The checker of ASSERTED_FORMATS every validator uses."""
    global _format_checker
    if _format_checker is None:
        from jsonschema import FormatChecker

        _format_checker = FormatChecker(formats=ASSERTED_FORMATS)
    return _format_checker


def _strict_validator() -> Validator:
    global _strict
    if _strict is None:
        from jsonschema import Draft202012Validator

        _strict = Draft202012Validator(_STRICT_META)
    return _strict


class SchemaValidator:
    """A checked schema's validator, built on its first value (a tool's first call), so that
    checking the built-in schemas at start-up needs no jsonschema. ``iter_errors`` is jsonschema's."""

    __slots__ = ("_built", "_dialect", "schema")

    def __init__(self, schema: Mapping[str, Any], dialect: type[Validator] | None = None) -> None:
        self.schema = schema
        self._dialect = dialect  # None: Draft 2020-12
        self._built: Validator | None = None

    def _build(self) -> Validator:
        dialect = self._dialect
        if dialect is None:
            from jsonschema import Draft202012Validator

            dialect = Draft202012Validator
        self._built = dialect(self.schema, format_checker=format_checker())
        return self._built

    def iter_errors(self, value: Any) -> Iterator[ValidationError]:
        return (self._built or self._build()).iter_errors(value)


# Validators by the schema's canonical JSON (the same schema declared by every gateway of a
# process, e.g. in tests, is checked once) and by identity (the per-call fast path).
_MAX_CACHED = 1024
_by_text: dict[bytes, SchemaValidator] = {}
_by_id: dict[int, tuple[Mapping[str, Any], SchemaValidator]] = {}
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


def _check_meta(schema: Mapping[str, Any], owner: str) -> type[Validator] | None:
    """The full check with jsonschema: the dialect's meta-schema, then (Draft 2020-12) no keyword
    it does not define. Returns the dialect's validator class, None for Draft 2020-12."""
    from jsonschema import Draft202012Validator, validators
    from jsonschema.exceptions import SchemaError

    cls = validators.validator_for(schema, default=Draft202012Validator)
    dialect = cls.META_SCHEMA.get("$id", cls.__name__)
    try:
        cls.check_schema(dict(schema))
    except SchemaError as exc:
        where = _pointer(exc.absolute_path)
        raise ValueError(f"{owner} is not a valid JSON Schema ({dialect}) at {where}: {exc.message}") from None
    if cls is not Draft202012Validator:
        return cls
    if _may_have_unknown(schema):
        # The deepest error names the keyword itself; the ones above it only repeat it.
        errors = sorted(_strict_validator().iter_errors(schema), key=lambda e: -len(e.absolute_path))
        if errors:
            error = errors[0]
            raise ValueError(
                f"{owner} is not a valid JSON Schema at {_pointer(error.absolute_path)}: {error.message} "
                "(keywords Draft 2020-12 does not define are refused, not ignored; extensions start with x-)"
            )
    return None


def _check(schema: Mapping[str, Any], owner: str) -> SchemaValidator:
    if not isinstance(schema, Mapping):
        raise ValueError(f"{owner} must be a JSON Schema object, got {type_name(schema)}")
    # The common subset is recognised without jsonschema; anything else gets the full check.
    dialect = None if _surely_valid(schema) else _check_meta(schema, owner)
    if dialect is None:
        for path, name in _formats(schema):
            if name not in ASSERTED_FORMATS:
                known = ", ".join(sorted(ASSERTED_FORMATS))
                raise ValueError(
                    f"{owner} is not a valid JSON Schema at {_pointer(path)}: format {name!r} cannot be "
                    f"checked here (checked: {known}); use pattern instead"
                )
    return SchemaValidator(schema, dialect)


def _bounded(cache: dict[Any, Any]) -> None:
    if len(cache) >= _MAX_CACHED:
        cache.pop(next(iter(cache)), None)  # the oldest: bounded however many schemas come


def compile_schema(schema: Mapping[str, Any], owner: str = "schema") -> SchemaValidator:
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


def cached_validator(schema: Mapping[str, Any], owner: str = "schema") -> SchemaValidator:
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


def first_error(validator: SchemaValidator, value: Any) -> ValidationError | None:
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
