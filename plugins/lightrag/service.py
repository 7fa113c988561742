"""The knowledge facade over LightRAG: query, open_reference, status and documents.

Shared by the tools (``knowledge_rag.*``, called through the tool facade) and the plugin's HTTP
routes (``/v1/knowledge/...``). Every answer is in workspace terms: references are mapped from the
provider's ``file_path`` to workspace paths (see :mod:`agent_gateway.plugins.lightrag.mapping`), and nothing the
provider says about itself (its URL, its storage folders) is passed on.

Workspaces are isolated at the provider: a LightRAG server holds one knowledge base (1.5.x keeps
one ``LightRAG`` instance per server; its ``LIGHTRAG-WORKSPACE`` header selects only the pipeline
status ``/health`` reports), so ``[lightrag] workspace_urls`` gives each workspace its own server
and every call of that workspace — query, documents, status — goes there. Workspaces not listed
share ``url``; there the gateway only filters (references of other workspaces dropped), which the
query result says (``sourceScope.workspaceIsolation``). Either way the answer text never names
another workspace's documents: its reference list is rewritten (see :func:`mapping.rewrite_answer`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from agent_gateway import PathError, ToolError, read_file_safely, resolve_path

from .client import LightRAGClient, ProviderError
from .mapping import (
    REFERENCE_SCHEMA,
    Locator,
    citation,
    decode_source,
    display_name,
    encode_source,
    in_source_paths,
    locate,
    normalise_relative,
    reference_id,
    rewrite_answer,
    scrub,
    split_sources,
)

log = logging.getLogger(__name__)

QUERY_SCHEMA = "gateway.knowledge_rag.query_result.v1"
OPEN_SCHEMA = "gateway.knowledge_rag.open_reference.v1"
STATUS_SCHEMA = "gateway.knowledge_rag.status.v1"
DOCUMENT_SCHEMA = "gateway.knowledge_rag.document.v1"
SOURCE_SCOPE_MODE = "post_filter_mapped_references"
SOURCE_SCOPE_DESCRIPTION = (
    "sourcePaths filters the references after retrieval: the provider retrieved from the whole "
    "knowledge base and the answer may draw on documents outside sourcePaths; only the references "
    "returned are limited to them"
)
Mode = Literal["naive", "local", "global", "hybrid", "mix"]
MODES: tuple[str, ...] = get_args(Mode)
NO_CONTEXT_MARK = "[no-context]"
REFERENCE_CACHE_SIZE = 2048
LOCATE_MAX_BYTES = 4 * 1024 * 1024


@dataclass
class Settings:
    url: str = ""
    api_key: str = ""
    timeout: float = 60.0
    connect_timeout: float = 5.0
    mode: str = "mix"
    top_k: int = 0
    citation_url: str = "agent-gateway://workspace/{workspace}/{path}{fragment}"
    max_document_bytes: int = 5 * 1024 * 1024
    max_references: int = 20
    # Workspace id -> the URL of that workspace's own LightRAG server (isolated at the provider).
    workspace_urls: dict[str, str] = field(default_factory=dict)


def workspace_url_problems(urls: Any, citation_template: str = "") -> list[tuple[str, str]]:
    """Config problems of ``[lightrag] workspace_urls`` (a table: workspace id -> server URL)."""
    if not isinstance(urls, dict):
        return [("workspace_urls", "must be a table of workspace id = server URL")]
    problems = []
    for workspace_id, url in urls.items():
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            key = f'workspace_urls."{workspace_id}"'
            problems.append((key, "must be a URL starting with http:// or https://"))
        elif citation_template.startswith(url.rstrip("/")):
            problems.append(("citation_url", "must not point at a provider (its URL is never given to clients)"))
    return problems


@dataclass
class Where:
    """The workspace a call works in: its id, directory, the allowed roots to read files below, and
    how to run blocking I/O."""

    workspace_id: str
    workspace_root: Path | None
    allowed_roots: list[str]
    in_thread: Callable[..., Awaitable[Any]]
    actor_id: str | None = None


@dataclass
class _Cached:
    workspace_id: str
    source_path: str | None
    file_path: str
    chunks: list[str] = field(default_factory=list)


class KnowledgeService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.client = self._new_client(settings.url)
        # One client per workspace server, by workspace id.
        self.workspace_clients = {
            workspace_id: self._new_client(url) for workspace_id, url in settings.workspace_urls.items()
        }
        self._secrets = [settings.url, *settings.workspace_urls.values(), settings.api_key]
        self._references: OrderedDict[str, _Cached] = OrderedDict()
        # Set by the register_routes hook: lets the tools read the actor's knowledge preferences.
        self.preferences: Callable[[str], Awaitable[dict[str, Any]]] | None = None

    def _new_client(self, url: str) -> LightRAGClient:
        settings = self.settings
        return LightRAGClient(
            url.rstrip("/"), settings.api_key, timeout=settings.timeout, connect_timeout=settings.connect_timeout
        )

    def client_for(self, workspace_id: str | None) -> LightRAGClient:
        """The server that holds ``workspace_id``'s documents: its own, else the shared ``url``."""
        if workspace_id is not None and workspace_id in self.workspace_clients:
            return self.workspace_clients[workspace_id]
        return self.client

    def isolation_of(self, workspace_id: str) -> str:
        """``provider``: the workspace has its own server; ``shared``: ``url``, filtered only."""
        return "provider" if workspace_id in self.workspace_clients else "shared"

    async def close(self) -> None:
        for client in (self.client, *self.workspace_clients.values()):
            await client.close()

    # -- helpers --------------------------------------------------------------------------------------
    def _scrub(self, text: str) -> str:
        return scrub(text, self._secrets)

    def _fail(self, exc: ProviderError, what: str) -> ToolError:
        if exc.status == 409:
            return ToolError("already_exists", f"{what}: the knowledge base already has this document")
        code = "provider_unavailable" if exc.retryable or exc.status is None else "provider_error"
        return ToolError(code, f"{what}: {self._scrub(exc.message)}")

    async def _retrying(self, call: Callable[[], Awaitable[Any]], what: str) -> Any:
        try:
            return await call()
        except ProviderError as exc:
            if not exc.retryable:
                raise self._fail(exc, what) from exc
            log.warning("%s: %s; retrying once", what, exc.message)
        try:
            return await call()
        except ProviderError as exc:
            raise self._fail(exc, f"{what} (after one retry)") from exc

    def _remember(self, ref_id: str, entry: _Cached) -> None:
        self._references[ref_id] = entry
        self._references.move_to_end(ref_id)
        while len(self._references) > REFERENCE_CACHE_SIZE:
            self._references.popitem(last=False)

    async def _locator(self, where: Where, source_path: str | None, chunks: list[str]) -> Locator:
        if source_path is None:
            return Locator("document", reason="not a workspace file")
        if not chunks:
            return Locator("document", reason="the provider returned no text to locate")
        if where.workspace_root is None:
            return Locator("document", reason="this workspace has no directory configured")

        def read() -> str | None:
            try:
                resolved = resolve_path(where.workspace_root, where.allowed_roots, source_path)
                data = read_file_safely(resolved, LOCATE_MAX_BYTES)
            except PathError:
                return None
            return data.decode("utf-8", "replace")

        text = await where.in_thread(read)
        if text is None:
            return Locator("document", reason="the file is not readable within this run's allowed roots")
        for chunk in chunks:
            found = locate(text, chunk)
            if found is not None:
                return found
        return Locator("document", reason="the retrieved text is no longer in the workspace file as it was indexed")

    async def _reference(self, where: Where, file_path: str, chunks: list[str]) -> dict[str, Any] | None:
        """One mapped reference, or None when it belongs to another workspace."""
        decoded = decode_source(file_path)
        source_path: str | None = None
        if decoded is not None:
            workspace_id, source_path = decoded
            if workspace_id != where.workspace_id:
                return None
        ref_id = reference_id(where.workspace_id, source_path, file_path)
        self._remember(ref_id, _Cached(where.workspace_id, source_path, file_path, chunks))
        locator = await self._locator(where, source_path, chunks)
        return {
            "schema": REFERENCE_SCHEMA,
            "referenceId": ref_id,
            "sourcePath": source_path,
            "filePath": file_path if decoded is not None else display_name(file_path),
            "title": (source_path or display_name(file_path)).rsplit("/", 1)[-1],
            **citation(self.settings.citation_url, where.workspace_id, source_path, file_path, locator),
        }

    async def _actor_preferences(self, actor_id: str | None) -> dict[str, Any]:
        if self.preferences is None or actor_id is None:
            return {}
        try:
            values = await self.preferences(actor_id)
        except Exception:  # preferences are a convenience here; the query still runs
            log.exception("could not read knowledge preferences")
            return {}
        return values

    # -- tools ------------------------------------------------------------------------------------------
    async def status(self, workspace_id: str | None = None) -> dict[str, Any]:
        """The provider's state — of ``workspace_id``'s own server when it has one."""
        client = self.client_for(workspace_id)
        out: dict[str, Any] = {
            "schema": STATUS_SCHEMA,
            "provider": "lightrag",
            "configured": client.configured,
            "available": False,
            "sourceScopeMode": SOURCE_SCOPE_MODE,
            "modes": list(MODES),
            "defaultMode": self.settings.mode,
        }
        if not client.configured:
            out["reason"] = "[lightrag] url is not set"
            if workspace_id is not None and self.workspace_clients:
                out["reason"] += f" and workspace_urls has no server for {workspace_id!r}"
            return out
        try:
            health = await client.health()
        except ProviderError as exc:
            out["reason"] = self._scrub(exc.message)
            return out
        out.update(
            available=health.get("status") == "healthy",
            providerVersion=health.get("core_version"),
            pipelineBusy=bool(health.get("pipeline_busy")),
        )
        if not out["available"]:
            out["reason"] = "the provider does not report itself healthy"
        return out

    async def query(
        self,
        where: Where,
        query: str,
        *,
        source_paths: list[str] | None = None,
        mode: str | None = None,
        top_k: int | None = None,
    ) -> dict[str, Any]:
        prefs = await self._actor_preferences(where.actor_id)
        mode = mode or prefs.get("ai.common.knowledge_rag.mode") or self.settings.mode
        if top_k is None:
            top_k = prefs.get("ai.common.knowledge_rag.topK") or self.settings.top_k or None
        body: dict[str, Any] = {
            "query": query,
            "mode": mode,
            "include_references": True,
            "include_chunk_content": True,
            "stream": False,
        }
        if top_k:
            body["top_k"] = int(top_k)

        client = self.client_for(where.workspace_id)

        async def ask() -> dict[str, Any]:
            answer = await client.query(body)
            text = answer.get("response") if isinstance(answer, dict) else None
            if not isinstance(text, str) or not text.strip():
                raise ProviderError("the knowledge provider returned an empty answer", retryable=True)
            return answer

        result = await self._retrying(ask, "knowledge_rag.query")
        raw_refs = result.get("references") or []
        by_name: OrderedDict[str, list[str]] = OrderedDict()
        for ref in raw_refs if isinstance(raw_refs, list) else []:
            if not isinstance(ref, dict):
                continue
            content = ref.get("content")
            chunks = [c for c in (content if isinstance(content, list) else [content]) if isinstance(c, str)]
            for name in split_sources(ref.get("file_path")):
                by_name.setdefault(name, []).extend(chunks)
        references: list[dict[str, Any]] = []
        names: dict[str, str] = {}  # this workspace's provider names -> what the answer shows
        foreign: list[str] = []  # provider names of other workspaces' documents
        for name, chunks in by_name.items():
            ref = await self._reference(where, name, chunks)
            if ref is None:
                foreign.append(name)
                continue
            names[name] = ref["sourcePath"] or ref["filePath"]
            references.append(ref)
        retrieved = len(references)
        if source_paths:
            references = [r for r in references if r["sourcePath"] and in_source_paths(r["sourcePath"], source_paths)]
        references = references[: self.settings.max_references]
        answer = rewrite_answer(str(result.get("response", "")), where.workspace_id, names, foreign, self._secrets)
        found = NO_CONTEXT_MARK not in answer and bool(result.get("llm_generated", True))
        return {
            "schema": QUERY_SCHEMA,
            "answer": answer.replace(NO_CONTEXT_MARK, "").strip(),
            "answerFound": found,
            "mode": mode,
            "sourceScopeMode": SOURCE_SCOPE_MODE,
            "sourceScope": {
                "mode": SOURCE_SCOPE_MODE,
                "sourcePaths": list(source_paths) if source_paths else None,
                "description": SOURCE_SCOPE_DESCRIPTION,
                "retrievedReferences": retrieved,
                "returnedReferences": len(references),
                "otherWorkspaceReferencesDropped": len(foreign),
                "workspaceIsolation": self.isolation_of(where.workspace_id),
            },
            "references": references,
            "citations": [r["citationMarkdown"] for r in references],
            "citationGuidance": (
                "cite with citationMarkdown; when locatorDegraded is true say the location is approximate "
                "(document-level) and do not state a page, line or position"
            ),
        }

    async def open_reference(
        self,
        where: Where,
        *,
        reference: dict[str, Any] | None = None,
        reference_id_: str | None = None,
        file_path: str | None = None,
        source_path: str | None = None,
        chunk_id: str | None = None,
        excerpt: str | None = None,
        query: str | None = None,
    ) -> dict[str, Any]:
        chunks: list[str] = []
        provider_name: str | None = None
        if reference is not None:
            reference_id_ = reference_id_ or reference.get("referenceId")
            source_path = source_path or reference.get("sourcePath")
            file_path = file_path or reference.get("filePath")
        cached = self._references.get(reference_id_) if reference_id_ else None
        if cached is not None and cached.workspace_id == where.workspace_id:
            source_path, provider_name, chunks = cached.source_path, cached.file_path, list(cached.chunks)
        if chunk_id:
            if not query:
                raise ToolError(
                    "invalid_arguments",
                    "a chunkId can only be located together with the query that retrieved it (give query too)",
                )
            data = await self._retrying(
                lambda: self.client_for(where.workspace_id).query_data(
                    {"query": query, "mode": "naive", "include_references": True}
                ),
                "knowledge_rag.open_reference",
            )
            for chunk in ((data.get("data") or {}).get("chunks") or []) if isinstance(data, dict) else []:
                if isinstance(chunk, dict) and chunk.get("chunk_id") == chunk_id:
                    provider_name = provider_name or str(chunk.get("file_path") or "")
                    if isinstance(chunk.get("content"), str):
                        chunks.insert(0, chunk["content"])
                    break
            else:
                if provider_name is None and file_path is None and source_path is None:
                    raise ToolError("not_found", f"chunk {chunk_id[:80]!r} was not retrieved by that query")
        if excerpt:
            chunks.insert(0, excerpt)
        if provider_name is None and file_path:
            provider_name = file_path
        if source_path is None and provider_name:
            decoded = decode_source(provider_name)
            if decoded is not None:
                if decoded[0] != where.workspace_id:
                    raise ToolError("not_found", "that reference belongs to another workspace")
                source_path = decoded[1]
        if source_path is not None:
            clean = normalise_relative(source_path)
            if clean is None:
                # a lookup: no document of the workspace has such a path
                raise ToolError("not_found", "no document has that sourcePath (not a workspace-relative path)")
            source_path = clean
            provider_name = provider_name or encode_source(where.workspace_id, source_path)
        if provider_name is None and reference_id_:
            # Only a referenceId, and not one this gateway gave out (or no longer remembered).
            raise ToolError(
                "not_found",
                f"reference {reference_id_[:80]!r} is not known here: give its sourcePath or filePath too",
            )
        if provider_name is None:
            raise ToolError("invalid_arguments", "give a reference, a referenceId, a sourcePath or a filePath")
        ref_id = reference_id(where.workspace_id, source_path, provider_name)
        locator = await self._locator(where, source_path, chunks)
        return {
            "schema": OPEN_SCHEMA,
            "referenceId": ref_id,
            "sourcePath": source_path,
            "filePath": provider_name if source_path is not None else display_name(provider_name),
            **citation(self.settings.citation_url, where.workspace_id, source_path, provider_name, locator),
        }

    # -- documents ------------------------------------------------------------------------------------------
    async def add_document(
        self, where: Where, *, path: str | None = None, text: str | None = None, name: str | None = None
    ) -> dict[str, Any]:
        if (path is None) == (text is None):
            raise ToolError("invalid_arguments", "give either path (a workspace file) or text with a name")
        if path is not None:

            def read() -> tuple[str, bytes]:
                resolved = resolve_path(where.workspace_root, where.allowed_roots, path)
                return resolved.relative, read_file_safely(resolved, self.settings.max_document_bytes)

            try:
                source_path, data = await where.in_thread(read)
            except PathError as exc:
                raise ToolError(exc.code, str(exc)) from exc
            if b"\x00" in data:
                raise ToolError("not_text", f"{source_path!r} looks binary; only UTF-8 text can be indexed")
            try:
                content = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ToolError("not_text", f"{source_path!r} is not valid UTF-8 text") from exc
        else:
            clean = normalise_relative(name or "")
            if clean is None:
                raise ToolError("invalid_arguments", "name must be a workspace-style relative path such as notes/a.md")
            source_path, content = clean, str(text)
            if len(content.encode("utf-8")) > self.settings.max_document_bytes:
                raise ToolError("too_large", f"the text exceeds {self.settings.max_document_bytes} bytes")
        if not content.strip():
            raise ToolError("invalid_arguments", "the document is empty")
        file_source = encode_source(where.workspace_id, source_path)
        try:
            answer = await self.client_for(where.workspace_id).insert_text(content, file_source)
        except ProviderError as exc:
            if exc.status == 409:
                raise ToolError(
                    "already_exists",
                    f"{source_path!r} is already in the knowledge base; delete it before adding it again",
                ) from exc
            raise self._fail(exc, f"adding {source_path!r}") from exc
        status = answer.get("status") if isinstance(answer, dict) else None
        if status not in ("success", "partial_success"):
            raise ToolError("provider_error", f"the knowledge provider did not accept {source_path!r} ({status})")
        return {
            "schema": DOCUMENT_SCHEMA,
            "workspaceId": where.workspace_id,
            "sourcePath": source_path,
            "trackId": answer.get("track_id"),
            "status": "queued",
        }

    def _document(self, where: Where, doc: dict[str, Any]) -> dict[str, Any] | None:
        decoded = decode_source(str(doc.get("file_path") or ""))
        if decoded is None or decoded[0] != where.workspace_id:
            return None
        status = str(doc.get("status") or "").lower().removeprefix("docstatus.")
        out = {
            "schema": DOCUMENT_SCHEMA,
            "documentId": doc.get("id"),
            "workspaceId": where.workspace_id,
            "sourcePath": decoded[1],
            "status": status,
            "chunks": doc.get("chunks_count"),
            "updatedAt": doc.get("updated_at"),
        }
        if doc.get("error_msg"):
            out["error"] = self._scrub(str(doc["error_msg"]))[:300]
        return out

    async def track(self, where: Where, track_id: str) -> dict[str, Any]:
        try:
            answer = await self.client_for(where.workspace_id).track_status(track_id)
        except ProviderError as exc:
            raise self._fail(exc, "reading the indexing status") from exc
        docs = [self._document(where, d) for d in answer.get("documents") or [] if isinstance(d, dict)]
        documents = [d for d in docs if d is not None]
        return {"trackId": track_id, "workspaceId": where.workspace_id, "documents": documents}

    async def list_documents(self, where: Where, max_pages: int = 50) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for page in range(1, max_pages + 1):
            try:
                answer = await self.client_for(where.workspace_id).documents_page(page, 100)
            except ProviderError as exc:
                raise self._fail(exc, "listing documents") from exc
            for doc in answer.get("documents") or []:
                mapped = self._document(where, doc) if isinstance(doc, dict) else None
                if mapped is not None:
                    out.append(mapped)
            if not (answer.get("pagination") or {}).get("has_next"):
                break
        return out

    async def delete_documents(
        self, where: Where, *, document_ids: list[str] | None = None, source_paths: list[str] | None = None
    ) -> dict[str, Any]:
        if not document_ids and not source_paths:
            raise ToolError("invalid_arguments", "give documentIds or sourcePaths")
        known = await self.list_documents(where)
        wanted_ids = set(document_ids or ())
        wanted_paths = {normalise_relative(p) for p in source_paths or ()}
        chosen = [d for d in known if d["documentId"] in wanted_ids or d["sourcePath"] in wanted_paths]
        missing = sorted(wanted_ids - {d["documentId"] for d in chosen}) + sorted(
            str(p) for p in wanted_paths - {d["sourcePath"] for d in chosen}
        )
        if missing:
            raise ToolError("not_found", f"not in this workspace's knowledge base: {', '.join(missing)[:300]}")
        deleted = []
        for doc in chosen:
            try:
                answer = await self.client_for(where.workspace_id).delete_documents([str(doc["documentId"])])
            except ProviderError as exc:
                raise self._fail(exc, f"deleting {doc['sourcePath']!r}") from exc
            status = answer.get("status")
            if status != "deletion_started":
                reason = "the provider's pipeline is busy; try again" if status == "busy" else f"refused ({status})"
                raise ToolError(
                    "provider_busy" if status == "busy" else "provider_error",
                    f"deleting {doc['sourcePath']!r}: {reason}",
                )
            deleted.append({"documentId": doc["documentId"], "sourcePath": doc["sourcePath"], "status": "deleting"})
        return {"workspaceId": where.workspace_id, "deleted": deleted}


async def wait_processed(
    service: KnowledgeService, where: Where, track_id: str, timeout: float = 60.0
) -> dict[str, Any]:
    """Follow a track id until every document is processed or failed (bounded)."""
    delay = 0.1
    async with asyncio.timeout(timeout):
        while True:
            tracked = await service.track(where, track_id)
            docs = tracked["documents"]
            if docs and all(d["status"] in ("processed", "failed") for d in docs):
                return tracked
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 1.0)
