"""A small asynchronous client for a LightRAG server's HTTP API (``lightrag-hku`` 1.5.x).

Only what the knowledge facade needs: ``GET /health``, ``POST /query``, ``POST /query/data``,
``POST /documents/text``, ``GET /documents/track_status/{id}``, ``POST /documents/paginated``,
``DELETE /documents/delete_document``. Auth is the ``X-API-Key`` header.

Errors are :class:`ProviderError` with a message written here, never the provider's URL or its
response text verbatim (a provider message can name its storage folders): callers may show
``message`` to agents and hosts as it is.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp

log = logging.getLogger(__name__)


class ProviderError(Exception):
    """A failed provider call. ``retryable``: a 5xx, a dropped connection or a timeout;
    ``status``: the HTTP status when there was one; ``detail``: a short, sanitised hint."""

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = False, detail: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.retryable = retryable
        self.detail = detail


def _short_detail(body: Any) -> str:
    """The provider's error ``detail`` as a hint, cut short; callers sanitise it before use."""
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, str):
        return detail[:300]
    return ""


class LightRAGClient:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 60.0,
        connect_timeout: float = 5.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._session: aiohttp.ClientSession | None = None

    @property
    def configured(self) -> bool:
        return bool(self.base_url)

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(total=self.timeout, sock_connect=self.connect_timeout)
            # force_close: a provider restarted between calls must not leave a dead keep-alive
            # connection that fails the next call.
            self._session = aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(force_close=True))
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        if not self.configured:
            raise ProviderError("the knowledge provider is not configured ([lightrag] url is empty)")
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["X-API-Key"] = self.api_key
        try:
            async with self._http().request(method, self.base_url + path, json=body, headers=headers) as response:
                try:
                    payload = await response.json(content_type=None)
                except ValueError:
                    payload = None
                if response.status >= 500:
                    raise ProviderError(
                        f"the knowledge provider failed (HTTP {response.status})",
                        status=response.status,
                        retryable=True,
                        detail=_short_detail(payload),
                    )
                if response.status in (401, 403):
                    raise ProviderError(
                        f"the knowledge provider refused the gateway's credentials (HTTP {response.status}); "
                        "check [lightrag] api_key",
                        status=response.status,
                    )
                if response.status >= 400:
                    raise ProviderError(
                        f"the knowledge provider rejected the request (HTTP {response.status})",
                        status=response.status,
                        detail=_short_detail(payload),
                    )
                if payload is None:
                    raise ProviderError("the knowledge provider answered something that is not JSON", retryable=True)
                return payload
        except ProviderError:
            raise
        except TimeoutError as exc:
            raise ProviderError(
                f"the knowledge provider did not answer within {self.timeout:g} s", retryable=True
            ) from exc
        except aiohttp.ClientConnectorError as exc:
            raise ProviderError("the knowledge provider is unreachable (connection refused)", retryable=True) from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError) as exc:
            raise ProviderError(
                "the knowledge provider dropped the connection before answering", retryable=True
            ) from exc
        except aiohttp.ClientError as exc:
            raise ProviderError(f"the knowledge provider call failed ({type(exc).__name__})", retryable=True) from exc
        except asyncio.CancelledError:
            raise

    # -- endpoints ------------------------------------------------------------------------------------
    async def health(self) -> dict[str, Any]:
        return await self.request("GET", "/health")

    async def query(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.request("POST", "/query", body)

    async def query_data(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.request("POST", "/query/data", body)

    async def insert_text(self, text: str, file_source: str) -> dict[str, Any]:
        return await self.request("POST", "/documents/text", {"text": text, "file_source": file_source})

    async def track_status(self, track_id: str) -> dict[str, Any]:
        from urllib.parse import quote

        return await self.request("GET", "/documents/track_status/" + quote(track_id, safe=""))

    async def documents_page(self, page: int, page_size: int = 100) -> dict[str, Any]:
        return await self.request("POST", "/documents/paginated", {"page": page, "page_size": page_size})

    async def delete_documents(self, doc_ids: list[str]) -> dict[str, Any]:
        return await self.request("DELETE", "/documents/delete_document", {"doc_ids": doc_ids})
