"""A small in-memory LightRAG server for tests that need the knowledge routes answered but not
LightRAG's retrieval (tests/test_lightrag.py runs the real server, a peer).

It answers what :class:`agent_gateway.plugins.lightrag.client.LightRAGClient` calls, with the
shapes and refusals of ``lightrag-hku`` 1.5.x: ``X-API-Key`` checked (``/health`` whitelisted), a
query refused with 422 when it is blank or shorter than three characters once stripped (CJK
characters count two), a text refused when blank, a second document of the same ``file_source``
refused with 409. Documents are processed as soon as they are added; every query "retrieves"
every stored document.
"""

from __future__ import annotations

import hashlib
from typing import Any

from aiohttp import web

API_KEY = "fake-rag-key"


# The blocks LightRAG counts as two characters (lightrag/query_validation.py), coarsely.
WIDE = ((0x1100, 0x11FF), (0x2E80, 0x9FFF), (0xA960, 0xA97F), (0xAC00, 0xD7FF), (0xF900, 0xFAFF),
        (0xFE30, 0xFE4F), (0xFF00, 0xFFEE), (0x16FE0, 0x1B2FF), (0x20000, 0x3FFFD))  # fmt: skip


NO_CONTEXT = "Sorry, I'm not able to provide an answer to that question.[no-context]"


def query_weight(query: str) -> int:
    return sum(2 if any(lo <= ord(c) <= hi for lo, hi in WIDE) else 1 for c in query.strip())


def _refused(status: int, detail: str) -> web.Response:
    return web.json_response({"detail": detail}, status=status)


class FakeLightRAG:
    """Start with ``await start()`` (on the loop that will serve it), stop with ``await stop()``."""

    def __init__(self, api_key: str = API_KEY) -> None:
        self.api_key = api_key
        self.documents: dict[str, dict[str, Any]] = {}  # id -> LightRAG's DocStatusResponse
        self.texts: dict[str, str] = {}  # id -> content
        self.calls: list[tuple[str, str]] = []
        self._inserts = 0
        self._runner: web.AppRunner | None = None
        self.url = ""

    def forget_documents(self) -> None:
        """Back to an empty store (the calls stay recorded). A stateful test calls it before each
        sequence: a document left by the previous one would make the same add a 409, not a 202."""
        self.documents.clear()
        self.texts.clear()
        self._inserts = 0

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/health", self.health)
        app.router.add_post("/query", self.query)
        app.router.add_post("/query/data", self.query_data)
        app.router.add_post("/documents/text", self.insert_text)
        app.router.add_get("/documents/track_status/{track_id}", self.track_status)
        app.router.add_post("/documents/paginated", self.paginated)
        app.router.add_delete("/documents/delete_document", self.delete_document)
        return app

    async def start(self) -> str:
        self._runner = web.AppRunner(self.app())
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.calls.append((request.method, request.path))
        if request.path != "/health" and request.headers.get("X-API-Key") != self.api_key:
            return _refused(401, "No credentials provided")
        return await handler(request)

    # -- endpoints ------------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"status": "healthy", "working_directory": "/srv/rag-storage", "core_version": "1.5.0",
             "api_version": "0250", "pipeline_busy": False}
        )  # fmt: skip

    async def _query_body(self, request: web.Request) -> dict[str, Any] | web.Response:
        body = await request.json()
        query = body.get("query") if isinstance(body, dict) else None
        if not isinstance(query, str) or not query.strip():
            return _refused(422, "Query must not be empty.")
        if query_weight(query) < 3:
            return _refused(422, "RAG query is too short.")
        top_k = body.get("top_k")
        if top_k is not None and not (isinstance(top_k, int) and 1 <= top_k <= 1000):
            return _refused(422, "top_k out of range")
        if body.get("mode", "mix") not in ("local", "global", "hybrid", "naive", "mix", "bypass"):
            return _refused(422, "mode")
        return body

    def _references(self) -> list[dict[str, Any]]:
        return [
            {"reference_id": str(n), "file_path": doc["file_path"], "content": [self.texts[doc_id]]}
            for n, (doc_id, doc) in enumerate(self.documents.items(), 1)
        ]

    async def query(self, request: web.Request) -> web.Response:
        body = await self._query_body(request)
        if isinstance(body, web.Response):
            return body
        references = self._references()
        if not references:
            return web.json_response({"response": NO_CONTEXT, "references": []})
        listing = "\n".join(f"- [{r['reference_id']}] {r['file_path']}" for r in references)
        answer = f"Here is what the documents say.\n\n### References\n{listing}"
        return web.json_response({"response": answer, "references": references})

    async def query_data(self, request: web.Request) -> web.Response:
        body = await self._query_body(request)
        if isinstance(body, web.Response):
            return body
        chunks = [
            {"content": self.texts[doc_id], "file_path": doc["file_path"], "chunk_id": "chunk-" + doc_id[4:],
             "reference_id": str(n)}
            for n, (doc_id, doc) in enumerate(self.documents.items(), 1)
        ]  # fmt: skip
        data = {"entities": [], "relationships": [], "chunks": chunks, "references": self._references()}
        return web.json_response(
            {"status": "success", "message": "Query executed successfully", "data": data,
             "metadata": {"query_mode": body.get("mode", "mix")}}
        )  # fmt: skip

    async def insert_text(self, request: web.Request) -> web.Response:
        body = await request.json()
        text, source = body.get("text"), body.get("file_source")
        if not isinstance(text, str) or not text.strip():
            return _refused(422, "Text must not be empty")
        doc_id = "doc-" + hashlib.md5(text.strip().encode()).hexdigest()
        if doc_id in self.documents or any(d["file_path"] == source for d in self.documents.values()):
            return _refused(409, f"A document named {source!r} already exists")
        self._inserts += 1
        track_id = f"insert_{self._inserts:06d}"
        self.texts[doc_id] = text
        self.documents[doc_id] = {
            "id": doc_id, "content_summary": text[:100], "content_length": len(text), "status": "processed",
            "created_at": "2026-01-01T00:00:00+00:00", "updated_at": "2026-01-01T00:00:00+00:00",
            "track_id": track_id, "chunks_count": 1, "error_msg": None, "metadata": {},
            "file_path": source or "unknown_source",
        }  # fmt: skip
        return web.json_response({"status": "success", "message": "Text successfully received.", "track_id": track_id})

    async def track_status(self, request: web.Request) -> web.Response:
        track_id = request.match_info["track_id"].strip()
        if not track_id:
            return _refused(400, "Track ID cannot be empty")
        documents = [d for d in self.documents.values() if d["track_id"] == track_id]
        summary: dict[str, int] = {}
        for doc in documents:
            summary[doc["status"]] = summary.get(doc["status"], 0) + 1
        return web.json_response(
            {"track_id": track_id, "documents": documents, "total_count": len(documents), "status_summary": summary}
        )

    async def paginated(self, request: web.Request) -> web.Response:
        body = await request.json()
        page, size = body.get("page", 1), body.get("page_size", 50)
        if not (isinstance(page, int) and page >= 1 and isinstance(size, int) and 10 <= size <= 200):
            return _refused(422, "page or page_size out of range")
        documents = list(self.documents.values())
        pages = max(1, -(-len(documents) // size))
        return web.json_response(
            {
                "documents": documents[(page - 1) * size : page * size],
                "pagination": {"page": page, "page_size": size, "total_count": len(documents),
                               "total_pages": pages, "has_next": page < pages, "has_prev": page > 1},
                "status_counts": {"processed": len(documents)},
            }
        )  # fmt: skip

    async def delete_document(self, request: web.Request) -> web.Response:
        body = await request.json()
        doc_ids = body.get("doc_ids")
        if not isinstance(doc_ids, list) or not doc_ids or not all(isinstance(d, str) for d in doc_ids):
            return _refused(422, "doc_ids must be a non-empty list of strings")
        for doc_id in doc_ids:
            self.documents.pop(doc_id, None)
            self.texts.pop(doc_id, None)
        return web.json_response(
            {"status": "deletion_started", "message": "Document deletion started.", "doc_id": ", ".join(doc_ids)}
        )
