"""The OpenAPI path items and schemas of the /v1/sessions routes, merged into ``/openapi.json`` by
``agent_gateway.routes.system``."""

from __future__ import annotations

from typing import Any

from agent_gateway.routes.sessions.handlers import CURSOR_PATTERN, MAX_BULK, MAX_LIMIT, MAX_QUERY, STATUS_FILTERS
from agent_gateway.runs import VISIBLE

# -- OpenAPI: this module's path items, merged into /openapi.json by routes/system.py -----------------
# (Kept here, self-contained, so gateway/openapi.json can change independently.)

# The error responses gateway/openapi.json defines, by status.
_ERROR_RESPONSES = {
    "400": "BadRequest",
    "401": "Unauthorized",
    "403": "Forbidden",
    "404": "NotFound",
    "409": "Conflict",
    "413": "PayloadTooLarge",
    "415": "UnsupportedMediaType",
    "503": "ServiceUnavailable",
}
_BAD_GATEWAY = {
    "description": "the agent could not delete its session",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}


def _err(status: str) -> dict[str, Any]:
    if status == "502":
        return _BAD_GATEWAY
    return {"$ref": f"#/components/responses/{_ERROR_RESPONSES[status]}"}


_ID_SCHEMA = {"type": "string", "minLength": 1, "maxLength": 200, "pattern": VISIBLE.pattern}
_SESSION_ID = {"name": "sessionId", "in": "path", "required": True, "schema": _ID_SCHEMA}
# What every sessions route can answer besides its own statuses.
_ERRORS = {status: _err(status) for status in ("400", "401", "403", "404", "503")}
# ... and a route that reads a JSON body.
_BODY_ERRORS = {status: _err(status) for status in ("413", "415")}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


OPENAPI_SCHEMAS: dict[str, Any] = {
    "SessionSummary": {
        "type": "object",
        "properties": {
            "sessionId": {"type": "string"},
            "workspaceId": {"type": "string"},
            "agentId": {"type": "string"},
            "agentName": {"type": ["string", "null"]},
            "profile": {"type": ["string", "null"]},
            "model": {"type": ["string", "null"]},
            "title": {"type": "string"},
            "titleCustom": {"type": "boolean"},
            "pinned": {"type": "boolean"},
            "runCount": {"type": "integer"},
            "messageCount": {"type": "integer"},
            "toolCount": {"type": "integer"},
            "sessionMode": {"type": ["string", "null"]},
            "lastStatus": {"type": ["string", "null"]},
            "lastRunId": {"type": ["string", "null"]},
            "activeRun": {"oneOf": [{"$ref": "#/components/schemas/Run"}, {"type": "null"}]},
            "createdAt": {"type": "integer"},
            "updatedAt": {"type": "integer"},
            "snippet": {"type": "string", "description": "search only: HTML-escaped text, hits in <mark>"},
            "score": {"type": "number", "description": "search only: the engine's rank"},
        },
    },
    "Transcript": {
        "type": "object",
        "description": "gateway.transcript.v1: one run's response projection (docs/sessions.md)",
        "properties": {
            "schema": {"const": "gateway.transcript.v1"},
            "hostRunId": {"type": ["string", "null"]},
            "question": {"type": ["string", "null"]},
            "status": {"type": "string"},
            "answer": {"type": "object"},
            "thoughts": {"type": "object"},
            "tools": {"type": "array", "items": {"type": "object"}},
            "plan": {"type": ["object", "null"]},
            "permissions": {"type": "array", "items": {"type": "object"}},
            "citations": {"type": "array", "items": {"type": "object"}},
            "files": {"type": "array", "items": {"type": "object"}},
            "sessionMode": {"type": ["string", "null"]},
            "modeHistory": {"type": "array", "items": {"type": "object"}},
        },
    },
    "SessionDetail": {
        "type": "object",
        "properties": {
            "schema": {"type": "string"},
            "session": {"$ref": "#/components/schemas/SessionSummary"},
            "binding": {"type": "object"},
            "runs": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "receipt": {"$ref": "#/components/schemas/Run"},
                        "transcript": {"$ref": "#/components/schemas/Transcript"},
                        "events": {"type": "array", "items": {"type": "object"}},
                    },
                },
            },
        },
    },
    "SessionsDeleted": {
        "type": "object",
        "properties": {
            "schema": {"const": "gateway.sessions_deleted.v1"},
            "deleted": {"type": "array", "items": {"type": "string"}},
            "notFound": {"type": "array", "items": {"type": "string"}},
        },
    },
}

OPENAPI_PATHS: dict[str, Any] = {
    "/v1/sessions": {
        "get": {
            "summary": "The caller's sessions: pinned first, then most recently updated; with q, a ranked search",
            "parameters": [
                {"name": "q", "in": "query", "schema": {"type": "string", "maxLength": MAX_QUERY}},
                {"name": "agentId", "in": "query", "schema": {"type": "string", "maxLength": 200}},
                {"name": "status", "in": "query", "schema": {"type": "string", "enum": sorted(STATUS_FILTERS)}},
                {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}},
                {"name": "cursor", "in": "query", "schema": {"type": "string", "pattern": CURSOR_PATTERN}},
            ],
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {
                            "schema": {"const": "gateway.sessions.v1"},
                            "sessions": {"type": "array", "items": {"$ref": "#/components/schemas/SessionSummary"}},
                            "nextCursor": {"type": ["string", "null"]},
                        },
                    },
                    "A page of sessions",
                ),
                **_ERRORS,
            },
        }
    },
    "/v1/sessions:delete": {
        "post": {
            "summary": "Delete the gateway's history of several sessions (all refused if one has an active run)",
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "required": ["sessionIds"],
                            "additionalProperties": False,
                            "properties": {
                                "sessionIds": {
                                    "type": "array",
                                    "minItems": 1,
                                    "maxItems": MAX_BULK,
                                    "items": _ID_SCHEMA,
                                }
                            },
                        }
                    }
                },
            },
            "responses": {
                "200": _json({"$ref": "#/components/schemas/SessionsDeleted"}, "What was deleted"),
                **_ERRORS,
                **_BODY_ERRORS,
                "409": _err("409"),
            },
        }
    },
    "/v1/sessions/{sessionId}": {
        "parameters": [_SESSION_ID],
        "get": {
            "summary": "A session: its runs' transcripts in order and the runtime binding",
            "responses": {"200": _json({"$ref": "#/components/schemas/SessionDetail"}, "The session"), **_ERRORS},
        },
        "patch": {
            "summary": "Rename (title; empty: the default) and/or pin a session",
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "additionalProperties": False,
                            "minProperties": 1,
                            "properties": {
                                "title": {"type": "string", "maxLength": 200},
                                "pinned": {"type": "boolean"},
                            },
                        }
                    }
                },
            },
            "responses": {"200": _json({"type": "object"}, "The updated summary"), **_ERRORS, **_BODY_ERRORS},
        },
        "delete": {
            "summary": "Delete the gateway's history of a session (never the agent's own store)",
            "responses": {
                "200": _json({"$ref": "#/components/schemas/SessionsDeleted"}, "Deleted"),
                **_ERRORS,
                "409": _err("409"),
            },
        },
    },
    "/v1/sessions/{sessionId}/export": {
        "parameters": [_SESSION_ID],
        "get": {
            "summary": "Export a session: runs, transcripts, events and binding (json) or a readable document",
            "parameters": [
                {"name": "format", "in": "query", "schema": {"type": "string", "enum": ["json", "markdown"]}}
            ],
            "responses": {
                "200": {
                    "description": "The export",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/SessionDetail"}},
                        "text/markdown": {"schema": {"type": "string"}},
                    },
                },
                **_ERRORS,
            },
        },
    },
    "/v1/sessions/{sessionId}/agent-session": {
        "parameters": [_SESSION_ID],
        "delete": {
            "summary": "Ask the agent to delete its own session (only when the runtime declares it can)",
            "responses": {
                "200": _json({"type": "object"}, "Deleted by the agent"),
                **_ERRORS,
                "409": _err("409"),
                "502": _err("502"),
            },
        },
    },
}
