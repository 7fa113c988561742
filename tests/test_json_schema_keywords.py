"""The checks of declared JSON Schemas that skip jsonschema (gateway/json_schema.py) decide as the
full check does: its keyword tables are Draft 2020-12's meta-schemas', a schema it passes the full
check passes too, and a schema it is unsure of still meets the full check (refused, in its words).
They are why a gateway starts without importing jsonschema at all."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from jsonschema_specifications import REGISTRY

from agent_gateway import json_schema
from agent_gateway.json_schema import (
    DRAFT_2020_12_KEYWORDS,
    SUBSCHEMA_KEYWORDS,
    SUBSCHEMA_LIST_KEYWORDS,
    SUBSCHEMA_MAP_KEYWORDS,
    compile_schema,
)

DRAFT = "https://json-schema.org/draft/2020-12/"
VOCABULARIES = ("core", "applicator", "unevaluated", "validation", "meta-data", "format-annotation", "content")
META = {"$dynamicRef": "#meta"}


def _properties() -> dict[str, Any]:
    """Every keyword the draft's meta-schema describes, with its schema there."""
    found: dict[str, Any] = dict(REGISTRY.contents(DRAFT + "schema")["properties"])
    for vocabulary in VOCABULARIES:
        found.update(REGISTRY.contents(f"{DRAFT}meta/{vocabulary}")["properties"])
    return found


def test_the_keyword_tables_are_the_meta_schemas() -> None:
    properties = _properties()
    assert set(properties) == DRAFT_2020_12_KEYWORDS
    one = {k for k, v in properties.items() if v == META}
    schemas = {k: v for k, v in properties.items() if isinstance(v, dict)}  # ("const": true)
    listed = {k for k, v in schemas.items() if v.get("$ref") == "#/$defs/schemaArray"}
    by_name = {k for k, v in schemas.items() if v.get("additionalProperties") == META}
    assert REGISTRY.contents(DRAFT + "meta/applicator")["$defs"]["schemaArray"]["items"] == META
    assert (one, listed, by_name) == (SUBSCHEMA_KEYWORDS, SUBSCHEMA_LIST_KEYWORDS, SUBSCHEMA_MAP_KEYWORDS)
    # the one left: "dependencies", a subschema or a list of names
    rest = {k for k, v in properties.items() if "#meta" in json.dumps(v)} - one - listed - by_name
    assert rest == {"dependencies"}


def _full_check(schema: Any) -> list[str]:
    """What jsonschema alone says of ``schema``: the meta-schema's errors, then the strict ones."""
    validator = Draft202012Validator(
        Draft202012Validator.META_SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER
    )
    errors = [e.message for e in validator.iter_errors(schema)]
    return errors or [e.message for e in json_schema._strict_validator().iter_errors(schema)]


KEYWORDS = sorted(DRAFT_2020_12_KEYWORDS | {"minLenght", "x-hint", "bogus"})
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 5),
    st.sampled_from([0.5, 3.0, -1.5]),
    st.sampled_from(["string", "object", "integer", "objekt", "a", "(", "[a-z]+", "", "x-y", "#a"]),
)


def _schemas(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    values = st.one_of(
        children,
        SCALARS,
        st.lists(st.one_of(children, SCALARS), max_size=3),
        st.dictionaries(st.sampled_from(["a", "b", "(", "x-y"]), children, max_size=3),
    )
    return st.dictionaries(st.sampled_from(KEYWORDS), values, max_size=4)


SCHEMAS = st.recursive(st.one_of(st.booleans(), st.just({})), _schemas, max_leaves=12)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SCHEMAS)
def test_what_the_fast_checks_pass_the_full_check_passes(schema: Any) -> None:
    if json_schema._surely_valid(schema):
        assert _full_check(schema) == []
    meta_valid = not list(Draft202012Validator(Draft202012Validator.META_SCHEMA).iter_errors(schema))
    if meta_valid and not json_schema._may_have_unknown(schema):
        assert not list(json_schema._strict_validator().iter_errors(schema))


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "string", "minLength": 1, "pattern": "^[a-z]+$"}}},
        {"type": ["string", "null"], "maxLength": 10, "description": "d", "x-hint": {"any": "thing"}},
        {"anyOf": [{"required": ["a"]}, {"required": ["b"]}], "additionalProperties": False},
        {"type": "array", "items": {"enum": ["a", 1, None]}, "minItems": 0, "uniqueItems": True},
        {"type": "integer", "minimum": 0, "maximum": 2.5, "multipleOf": 0.5, "default": 1},
    ],
)
def test_common_schemas_are_checked_without_jsonschema(schema: dict[str, Any]) -> None:
    assert json_schema._surely_valid(schema)
    assert _full_check(schema) == []


@pytest.mark.parametrize(
    ("schema", "fragment"),
    [
        ({"type": "string", "pattern": "("}, "at /pattern: '(' is not a 'regex'"),
        ({"type": "object", "patternProperties": {"(": {}}}, "at /patternProperties: '(' is not a 'regex'"),
        ({"type": "string", "minLength": -1}, "at /minLength: -1 is less than the minimum of 0"),
        ({"required": ["a", "a"]}, "at /required: ['a', 'a'] has non-unique elements"),
        ({"type": []}, "at /type: [] is not valid"),
        ({"anyOf": []}, "at /anyOf: [] should be non-empty"),
        ({"multipleOf": 0}, "at /multipleOf: 0 is less than or equal to the minimum of 0"),
        ({"properties": {"a": {"maxItems": True}}}, "at /properties/a/maxItems: True is not of type 'integer'"),
        ({"properties": {"a": {"minLenght": 1}}}, "'minLenght' was unexpected"),
        ({"type": "string", "format": "date-time"}, "format 'date-time' cannot be checked here"),
    ],
)
def test_a_schema_the_fast_check_declines_is_still_refused(schema: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError, match="tool 't': input_schema is not a valid JSON Schema") as info:
        compile_schema(schema, "tool 't': input_schema")
    assert fragment in str(info.value)


def test_values_are_checked_by_jsonschema_once_a_value_comes() -> None:
    validator = compile_schema({"type": "object", "properties": {"n": {"type": "integer", "maximum": 3}}})
    assert json_schema.first_error(validator, {"n": 2}) is None
    error = json_schema.first_error(validator, {"n": 4})
    assert error is not None and json_schema.error_message(error, "arguments") == "arguments.n must be at most 3"


def test_a_gateway_starts_without_importing_jsonschema(tmp_path: Any) -> None:
    """Its built-in tools' and settings' schemas are all in the subset checked without it (about
    a tenth of a start-up's CPU at 218991a's size): it is imported on the first tool call."""
    script = (
        "import sys\n"
        "from agent_gateway.app import create_app\n"
        "from agent_gateway.config import Config, section_specs_from_hook\n"
        "from agent_gateway.plugin_host import PluginHost\n"
        "plugins = PluginHost.load()\n"
        "specs = section_specs_from_hook(plugins.config_sections())\n"
        f"config = Config.load(None, specs, overrides={{'gateway': {{'data_dir': {str(tmp_path)!r}}}}})\n"
        "create_app(config, plugins)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jsonschema', 'referencing')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"
