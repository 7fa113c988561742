"""Every error a client can get has the JSON shape, including the HTTP parser's, and a 405 says
which methods the path takes.

Before: a 100 KB path segment or 10,000 query parameters were a 400 `text/plain` written by
aiohttp's parser (the application never saw the request), and a 405 carried no `Allow`.
The parser's answers come from the launcher's server, so these tests run the real console script.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests._cli import Served, clean_env, serve
from tests._harness import WAIT


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Served]:
    env = clean_env(tmp_path)
    async with serve("--port", "0", "--data-dir", str(tmp_path / "data"), env=env, cwd=tmp_path) as served:
        yield served


async def raw_request(served: Served, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send bytes as they are (no client library would send these) and read the whole answer."""
    reader, writer = await asyncio.open_connection(served.host, served.port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(WAIT):
            raw = await reader.read()  # the server closes the connection after a parser error
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in header_lines)}
    if headers.get("transfer-encoding") == "chunked":
        size, _, rest = body.partition(b"\r\n")
        body = rest[: int(size, 16)]
    return int(status_line.split()[1]), headers, body


@pytest.mark.parametrize(
    "target",
    [
        "/v1/runs/" + "a" * 100_000,
        "/v1/runs?" + "&".join(f"p{i}=1" for i in range(10_000)),
    ],
    ids=["100KB-path-segment", "10000-query-parameters"],
)
async def test_parser_errors_have_the_json_error_shape(gateway: Served, target: str) -> None:
    request = f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    status, headers, body = await raw_request(gateway, request)
    assert 400 <= status < 500
    assert headers["content-type"].startswith("application/json"), (headers, body[:200])
    error = json.loads(body)["error"]
    assert error["code"] == "bad_http_request" and error["message"].startswith("malformed HTTP request")


async def test_a_header_line_too_long_is_json_too(gateway: Served) -> None:
    request = b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"x" * 100_000 + b"\r\n\r\n"
    status, headers, body = await raw_request(gateway, request)
    assert 400 <= status < 500 and headers["content-type"].startswith("application/json")
    assert json.loads(body)["error"]["code"] == "bad_http_request"


async def test_a_405_carries_allow_and_the_json_shape(gateway: Served) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.delete(f"{gateway.url}/v1/runs") as response:
            assert response.status == 405
            assert "POST" in response.headers["Allow"]
            assert (await response.json())["error"]["code"] == "method_not_allowed"
        # the server still serves after the parser errors above closed their connections
        async with http.get(f"{gateway.url}/v1/health") as response:
            assert response.status == 200
