"""Structured JSON logs. Each record carries the run, session and agent it belongs to, taken from
context variables the run manager sets while it runs a turn (so every log line of a runtime or
tool call is attributable without passing ids around)."""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from typing import Any

run_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("run_id", default=None)
session_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("session_id", default=None)
agent_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("agent_id", default=None)
# The run's trace id when a tracing plugin (the `trace_run` hook) follows it.
trace_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("trace_id", default=None)


class ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.host_run_id = run_id_var.get()
        record.session_id = session_id_var.get()
        record.agent_id = agent_id_var.get()
        record.trace_id = trace_id_var.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, field in (
            ("hostRunId", "host_run_id"),
            ("sessionId", "session_id"),
            ("agentId", "agent_id"),
            ("traceId", "trace_id"),
        ):
            value = getattr(record, field, None)
            if value:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        run = getattr(record, "host_run_id", None)
        return f"{line} [{run}]" if run else line


def configure(log_format: str = "auto", level: str = "info") -> None:
    """Install one stderr handler: JSON lines (`json`, or `auto` when stderr is not a terminal)
    or readable text."""
    use_json = log_format == "json" or (log_format == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ContextFilter())
    handler.setFormatter(
        JsonFormatter() if use_json else TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # peewee logs SQL parameters at DEBUG: preference values (secrets) among them.
    logging.getLogger("peewee").setLevel(max(logging.INFO, root.level))
