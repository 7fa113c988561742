"""What checking a tool call's arguments costs: the complete JSON Schema validator (jsonschema,
validator built once per schema and kept) against the hand-written subset validator it replaced.

    python bench/bench_schema_validation.py [--rounds 15] [--number 20000]

Arguments and schemas are the workspace plugin's own (``workspace.read_file``,
``workspace.patch_file``), valid and invalid. Each round times every variant once (``timeit``,
``--number`` calls), the order rotated each round so all see the same machine; the medians per
call and their ratio to the baseline are printed. Also shown: what building a validator on every
call (no cache) would cost. For scale: a run's gateway CPU is about 3 ms (docs/performance.md).
"""

from __future__ import annotations

import argparse
import re
import statistics
import timeit
from collections.abc import Callable, Mapping
from typing import Any

from jsonschema import Draft202012Validator

from agent_gateway import ToolError
from agent_gateway.json_schema import format_checker
from agent_gateway.plugins.workspace.tools import Settings, WorkspaceTools
from agent_gateway.tools import validate_schema

# -- the baseline: the subset validator the gateway used before (copied here to stay comparable) --

_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def subset_validate(value: Any, schema: Mapping[str, Any], where: str = "arguments") -> None:
    expected = schema.get("type")
    if expected is not None:
        names = [expected] if isinstance(expected, str) else list(expected)
        if not any(_TYPES[n](value) for n in names):
            raise ToolError("invalid_arguments", f"{where} must be {' or '.join(names)}")
    if "enum" in schema and value not in schema["enum"]:
        raise ToolError("invalid_arguments", f"{where} must be one of ...")
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            raise ToolError("invalid_arguments", f"{where} is longer than {schema['maxLength']} characters")
        if "minLength" in schema and len(value) < schema["minLength"]:
            raise ToolError("invalid_arguments", f"{where} is shorter than {schema['minLength']} characters")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            raise ToolError("invalid_arguments", f"{where} does not match {schema['pattern']}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise ToolError("invalid_arguments", f"{where} must be at least {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise ToolError("invalid_arguments", f"{where} must be at most {schema['maximum']}")
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            raise ToolError("invalid_arguments", f"{where} needs at least {schema['minItems']} item(s)")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise ToolError("invalid_arguments", f"{where} allows at most {schema['maxItems']} item(s)")
        if isinstance(schema.get("items"), Mapping):
            for i, item in enumerate(value):
                subset_validate(item, schema["items"], f"{where}[{i}]")
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        for key in schema.get("required") or ():
            if key not in value:
                raise ToolError("invalid_arguments", f"{where}.{key} is required")
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in properties:
                subset_validate(item, properties[key], f"{where}.{key}")
            elif extra is False:
                raise ToolError("invalid_arguments", f"{where}.{key} is not a known argument")
            elif isinstance(extra, Mapping):
                subset_validate(item, extra, f"{where}.{key}")
    for keyword in ("oneOf", "anyOf"):
        if keyword not in schema:
            continue
        matches = 0
        for option in schema[keyword]:
            try:
                subset_validate(value, option, where)
                matches += 1
            except ToolError:
                pass
        if (keyword == "oneOf" and matches != 1) or (keyword == "anyOf" and matches == 0):
            raise ToolError("invalid_arguments", f"{where}: must match {keyword}")


# -- the cases -------------------------------------------------------------------------------------

SCHEMAS = {t.name: t.input_schema for t in WorkspaceTools(Settings()).tools()}
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "read_file": ("workspace.read_file", {"path": "notes/today.md"}),
    "patch_file": (
        "workspace.patch_file",
        {
            "path": "notes/today.md",
            "expectedHash": "0f" * 32,
            "edits": [{"search": "alpha", "replace": "beta"}, {"search": "gamma", "replace": "delta"}],
        },
    ),
    "patch_file, invalid": ("workspace.patch_file", {"path": "notes/today.md", "edits": [{"replace": "b"}]}),
}


def call(validate: Callable[[Any, Mapping[str, Any]], None], schema: Mapping[str, Any], value: Any) -> None:
    try:
        validate(value, schema)
    except ToolError:
        pass


def uncached(value: Any, schema: Mapping[str, Any]) -> None:
    """What building the validator on every call would cost (not what the gateway does)."""
    error = next(Draft202012Validator(schema, format_checker=format_checker()).iter_errors(value), None)
    if error is not None:
        raise ToolError("invalid_arguments", error.message)


VARIANTS: dict[str, Callable[[Any, Mapping[str, Any]], None]] = {
    "subset (before)": subset_validate,
    "jsonschema, cached": validate_schema,
    "jsonschema, built per call": uncached,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--number", type=int, default=20000)
    args = parser.parse_args()
    for label, (tool, value) in CASES.items():
        schema = SCHEMAS[tool]
        names = list(VARIANTS)
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                fn = VARIANTS[name]
                elapsed = timeit.timeit(
                    lambda fn=fn, schema=schema, value=value: call(fn, schema, value), number=args.number
                )
                times[name].append(elapsed / args.number * 1e6)
        base = statistics.median(times[names[0]])
        print(f"{label} ({tool}):")
        for name in names:
            median = statistics.median(times[name])
            print(f"  {name:28} {median:8.2f} µs/call   x{median / base:5.2f}")


if __name__ == "__main__":
    main()
