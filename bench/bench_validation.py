"""What validating a ``POST /v1/runs`` body costs: today's hand-written validator against the same
rules as a pydantic v2 model and as a msgspec Struct, and what importing each library costs.

    python bench/bench_validation.py [--rounds 15] [--number 20000] [--import-rounds 9]

Each round times every variant once (``timeit``, ``--number`` calls), the order rotated each
round so all see the same machine; the medians per call and their ratio to the baseline
(``validate_run_request``, the validator the gateway used before its routes were declared) are
printed. Import cost: a fresh interpreter that imports the library and defines the model, against
one that imports nothing, interleaved the same way (median wall time of each, then the
difference). msgspec is optional (``pip install msgspec``): without it, its rows are skipped.
Figures are relative to a run's cost (docs/performance.md: about 3 ms of gateway CPU per run).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import statistics
import subprocess
import sys
import time
import timeit
from collections.abc import Callable
from typing import Annotated, Any, Literal

# A typical body: what the console and the SDK examples send.
BODY: dict[str, Any] = {
    "requestId": "req-0f3a9c",
    "agentId": "chat-only",
    "sessionId": "sess-42",
    "message": "Summarise the open issues in notes/issues.md and propose the next step.",
    "context": {"allowedRoots": ["notes/"], "target": {"kind": "file", "path": "notes/issues.md"}},
    "options": {"model": "gpt-4o-mini"},
}
RUN_COST_US = 3000.0  # a run's gateway CPU, for scale
VISIBLE = r"[^\s\u001c-\u001f\u0085\ufeff]"


def baseline() -> Callable[[Any], Any]:
    """The validator before declarations, kept here verbatim in behaviour (the gateway's own is now
    the declared model's)."""
    visible = re.compile(VISIBLE)

    def require_id(body: dict[str, Any], key: str, default: str | None = None) -> str:
        value = body.get(key, default)
        if not isinstance(value, str) or not visible.search(value):
            raise ValueError(f"{key} must be a non-empty string")
        if len(value) > 200:
            raise ValueError(f"{key} must be at most 200 characters")
        return value

    def validate_run_request(body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        request = {
            "requestId": require_id(body, "requestId"),
            "agentId": require_id(body, "agentId"),
            "sessionId": require_id(body, "sessionId"),
            "workspaceId": require_id(body, "workspaceId", "default"),
        }
        message = body.get("message")
        if not isinstance(message, str) or not visible.search(message):
            raise ValueError("message must be a non-empty string")
        request["message"] = message
        for key in ("context", "options"):
            value = body.get(key, {})
            if value is None:
                value = {}
            if not isinstance(value, dict):
                raise ValueError(f"{key} must be an object")
            request[key] = value
        roots = request["context"].get("allowedRoots", [])
        if not isinstance(roots, list) or not all(isinstance(r, str) for r in roots):
            raise ValueError("context.allowedRoots must be a list of strings")
        parent = body.get("parentRunId")
        if parent is not None and not isinstance(parent, str):
            raise ValueError("parentRunId must be a string")
        request["parentRunId"] = parent
        if body.get("webhook") is not None:
            request["webhook"] = body["webhook"]
        if "multitaskStrategy" in body:
            request["multitaskStrategy"] = body["multitaskStrategy"]
        unknown = set(body) - set(request) - {"webhook"}
        if unknown:
            raise ValueError(f"unknown field(s): {', '.join(sorted(unknown))}")
        return request

    return validate_run_request


PYDANTIC_MODEL = """
from typing import Annotated, Any, Literal
from pydantic import BaseModel, ConfigDict, Field

Id = Annotated[str, Field(min_length=1, max_length=200, pattern=VISIBLE)]


class RunContext(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    allowedRoots: list[str] = []


class RunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    requestId: Id
    agentId: Id | None = None
    sessionId: Id
    workspaceId: Id = "default"
    message: Annotated[str, Field(min_length=1, pattern=VISIBLE)]
    context: RunContext | None = None
    options: dict[str, Any] | None = None
    parentRunId: str | None = None
    webhook: Annotated[str, Field(max_length=2048)] | None = None
    multitaskStrategy: Literal["enqueue", "reject", "interrupt", "rollback"] = "enqueue"
"""

MSGSPEC_MODEL = """
from typing import Annotated, Any, Literal
import msgspec

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=VISIBLE)]


class RunRequest(msgspec.Struct, forbid_unknown_fields=True):
    requestId: Id
    sessionId: Id
    message: Annotated[str, msgspec.Meta(min_length=1, pattern=VISIBLE)]
    agentId: Id | None = None
    workspaceId: Id = "default"
    # msgspec has no "extra allowed" Struct: the context stays a mapping, its allowedRoots
    # checked by hand afterwards (as the baseline does)
    context: dict[str, Any] | None = None
    options: dict[str, Any] | None = None
    parentRunId: str | None = None
    webhook: Annotated[str, msgspec.Meta(max_length=2048)] | None = None
    multitaskStrategy: Literal["enqueue", "reject", "interrupt", "rollback"] = "enqueue"
"""


def variants() -> dict[str, Callable[[], Any]]:
    validate = baseline()
    out: dict[str, Callable[[], Any]] = {"baseline validate_run_request": lambda: validate(BODY)}
    scope: dict[str, Any] = {"VISIBLE": VISIBLE, "Annotated": Annotated, "Any": Any, "Literal": Literal}
    # (compiled without this module's `from __future__ import annotations`: the models' types are read)
    exec(compile(PYDANTIC_MODEL, "<pydantic model>", "exec", dont_inherit=True), scope)
    model = scope["RunRequest"]
    out["pydantic v2 model_validate"] = lambda: model.model_validate(BODY)
    # what the handler needs: the model and the plain request dict it hashes
    out["pydantic v2 validate + dump"] = lambda: model.model_validate(BODY).model_dump(exclude_unset=True)
    if importlib.util.find_spec("msgspec") is not None:
        import msgspec

        scope = {"VISIBLE": VISIBLE}
        exec(compile(MSGSPEC_MODEL, "<msgspec struct>", "exec", dont_inherit=True), scope)
        struct = scope["RunRequest"]
        out["msgspec convert"] = lambda: msgspec.convert(BODY, struct)
        out["msgspec convert + to_builtins"] = lambda: msgspec.to_builtins(msgspec.convert(BODY, struct))
    return out


def import_cost(rounds: int) -> dict[str, float]:
    """Median wall time (ms) of a fresh interpreter per library, minus one that imports nothing."""
    scripts = {"nothing": "pass", "pydantic v2": f"VISIBLE={VISIBLE!r}\n" + PYDANTIC_MODEL}
    if importlib.util.find_spec("msgspec") is not None:
        scripts["msgspec"] = f"VISIBLE={VISIBLE!r}\n" + MSGSPEC_MODEL
    times: dict[str, list[float]] = {name: [] for name in scripts}
    for round_no in range(rounds):
        names = list(scripts)
        names = names[round_no % len(names) :] + names[: round_no % len(names)]
        for name in names:
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", scripts[name]], check=True)
            times[name].append((time.perf_counter() - start) * 1000)
    base = statistics.median(times["nothing"])
    return {name: statistics.median(t) - base for name, t in times.items() if name != "nothing"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--import-rounds", type=int, default=9)
    args = parser.parse_args()
    cases = variants()
    for call in cases.values():
        call()  # warm up; and every variant accepts the body
    per_call: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for round_no in range(args.rounds):
        order = names[round_no % len(names) :] + names[: round_no % len(names)]
        for name in order:
            per_call[name].append(timeit.timeit(cases[name], number=args.number) / args.number * 1e6)
    base = statistics.median(per_call[names[0]])
    result: dict[str, Any] = {}
    for name in names:
        median = statistics.median(per_call[name])
        result[name] = {
            "us_per_call": round(median, 2),
            "ratio": round(median / base, 2),
            "share_of_run": f"{median / RUN_COST_US:.2%}",
        }
    result["import_ms_over_bare_python"] = {k: round(v, 1) for k, v in import_cost(args.import_rounds).items()}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
