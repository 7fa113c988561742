"""The ``knowledge_rag.*`` tools: thin handlers over :class:`KnowledgeService`, run through the
tool facade (validation, veto hooks, receipts, ``tool.*`` events)."""

from __future__ import annotations

from typing import Any

from agent_gateway import Tool, ToolCall

from .declared import (
    MAX_CHUNK_ID,
    MAX_EXCERPT,
    MAX_PATH,
    MAX_QUERY,
    MAX_REFERENCE_ID,
    MAX_SOURCE_PATHS,
    MAX_TOP_K,
    QUERY_DESCRIPTION,
)
from .mapping import QUERY_PATTERN
from .service import MODES, KnowledgeService, Where

CAP_KNOWLEDGE = "knowledge_rag"

# The limits are the routes' (declared.py): a call is refused the same way by either door.
QUERY_SCHEMA = {
    "type": "string",
    "minLength": 3,
    "maxLength": MAX_QUERY,
    "pattern": QUERY_PATTERN,
    "description": QUERY_DESCRIPTION,
}
RELATIVE_PATH_SCHEMA = {"type": "string", "minLength": 1, "maxLength": MAX_PATH}
REFERENCE_ID_SCHEMA = {"type": "string", "minLength": 1, "maxLength": MAX_REFERENCE_ID}
# What open_reference reads of a reference (a knowledge_rag.query reference has more).
REFERENCE_ARGUMENT = {
    "type": "object",
    "properties": {
        "referenceId": REFERENCE_ID_SCHEMA,
        "sourcePath": {**RELATIVE_PATH_SCHEMA, "type": ["string", "null"]},
        "filePath": RELATIVE_PATH_SCHEMA,
    },
    "anyOf": [
        {"required": ["referenceId"]},
        {"required": ["filePath"]},
        {"required": ["sourcePath"], "properties": {"sourcePath": {"type": "string"}}},
    ],
}

SOURCE_PATHS_SCHEMA = {
    "type": "array",
    "maxItems": MAX_SOURCE_PATHS,
    "items": RELATIVE_PATH_SCHEMA,
    "description": (
        "Workspace paths or folders (notes/ or notes/a.md). Applied AFTER retrieval: only the references "
        "returned are limited to them; the answer may still use other documents (post_filter_mapped_references)."
    ),
}


def where_of(call: ToolCall) -> Where:
    scope = call.scope
    return Where(scope.workspace_id, scope.workspace_root, scope.allowed_roots, call.in_thread, scope.actor_id)


class KnowledgeTools:
    def __init__(self, service: KnowledgeService) -> None:
        self.service = service

    async def status(self, call: ToolCall) -> dict[str, Any]:
        return await self.service.status(call.scope.workspace_id)

    async def query(self, call: ToolCall) -> dict[str, Any]:
        args = call.arguments
        result = await self.service.query(
            where_of(call),
            args["query"],
            source_paths=args.get("sourcePaths") or None,
            mode=args.get("mode"),
            top_k=args.get("topK"),
        )
        call.note = f"{len(result['references'])} reference(s); sourcePaths={args.get('sourcePaths') or 'all'}"
        return result

    async def open_reference(self, call: ToolCall) -> dict[str, Any]:
        args = call.arguments
        return await self.service.open_reference(
            where_of(call),
            reference=args.get("reference"),
            reference_id_=args.get("referenceId"),
            file_path=args.get("filePath"),
            source_path=args.get("sourcePath"),
            chunk_id=args.get("chunkId"),
            excerpt=args.get("excerpt"),
            query=args.get("query"),
        )

    def tools(self) -> list[Tool]:
        caps = (CAP_KNOWLEDGE,)
        return [
            Tool(
                "knowledge_rag.status",
                "Whether the knowledge base (LightRAG) is configured and reachable, and its query modes.",
                {"type": "object", "properties": {}, "additionalProperties": False},
                caps,
                self.status,
            ),
            Tool(
                "knowledge_rag.query",
                "Ask the workspace knowledge base. Returns an answer and references mapped to workspace "
                "paths, each with citationMarkdown to cite. When locatorDegraded is true the citation is "
                "document-level: never state a page, line or position for it. sourcePaths filters the "
                "returned references after retrieval (it does not restrict what the provider retrieves).",
                {
                    "type": "object",
                    "properties": {
                        "query": QUERY_SCHEMA,
                        "sourcePaths": SOURCE_PATHS_SCHEMA,
                        "mode": {"type": "string", "enum": list(MODES)},
                        "topK": {"type": "integer", "minimum": 1, "maximum": MAX_TOP_K},
                    },
                    "required": ["query"],
                    "additionalProperties": False,
                },
                caps,
                self.query,
            ),
            Tool(
                "knowledge_rag.open_reference",
                "Turn a reference from knowledge_rag.query (or a provider hint: filePath, chunkId with its "
                "query, an excerpt) into a clickable citation with the precise line locator when the text is "
                "found in the workspace file, or a document-level citation marked locatorDegraded otherwise.",
                {
                    "type": "object",
                    "properties": {
                        "reference": REFERENCE_ARGUMENT,
                        "referenceId": REFERENCE_ID_SCHEMA,
                        "sourcePath": RELATIVE_PATH_SCHEMA,
                        "filePath": RELATIVE_PATH_SCHEMA,
                        "chunkId": {"type": "string", "minLength": 1, "maxLength": MAX_CHUNK_ID},
                        "query": QUERY_SCHEMA,
                        "excerpt": {"type": "string", "minLength": 1, "maxLength": MAX_EXCERPT},
                    },
                    "anyOf": [
                        {"required": ["reference"]},
                        {"required": ["referenceId"]},
                        {"required": ["sourcePath"]},
                        {"required": ["filePath"]},
                    ],
                    "additionalProperties": False,
                },
                caps,
                self.open_reference,
            ),
        ]
