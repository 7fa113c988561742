"""The console's page and files as HTTP: public (the page holds no data), only the package's own
files, safe headers, and out of the API and its OpenAPI document."""

from __future__ import annotations

from typing import Any

from agent_gateway.routes.console import CONSOLE_ROUTES

TOKEN = "tok-console-0123456789abcdef"


async def test_the_page_and_its_files_are_public_and_the_api_is_not(make_gateway: Any) -> None:
    client = await make_gateway(tokens={TOKEN: "alice"})
    page = await client.get("/")
    assert page.status == 200
    assert page.content_type == "text/html"
    html = await page.text()
    assert '<script type="module" src="/console/app.js">' in html
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    for name, content_type in (("app.js", "text/javascript"), ("style.css", "text/css")):
        asset = await client.get(f"/console/{name}")
        assert asset.status == 200, name
        assert asset.content_type == content_type
    # the API behind it still needs the token
    assert (await client.get("/v1/sessions")).status == 401
    assert (await client.get("/v1/sessions", headers={"Authorization": f"Bearer {TOKEN}"})).status == 200


async def test_only_the_packaged_files_are_served(make_gateway: Any) -> None:
    client = await make_gateway(tokens={TOKEN: "alice"})
    for path in ("/console/nope.js", "/console/..%2Fapp.py", "/console/%2e%2e%2fconfig.py", "/console/"):
        response = await client.get(path)
        assert response.status in (401, 404), path
        body = await response.json()
        assert set(body["error"]) >= {"code", "message"}, path
    # a file that is not one of the console's is not public either
    assert (await client.get("/console/secret.txt")).status == 401


async def test_the_console_is_not_in_openapi(make_gateway: Any) -> None:
    client = await make_gateway()
    spec = await (await client.get("/openapi.json")).json()
    assert not set(spec["paths"]) & set(CONSOLE_ROUTES)
    assert not any(path.startswith("/console") for path in spec["paths"])


VENDOR = (
    "vendor/marked/marked.esm.js",
    "vendor/dompurify/purify.es.mjs",
    "vendor/highlight.js/highlight.min.js",
    "vendor/highlight.js/github.min.css",
    "vendor/highlight.js/github-dark.min.css",
)


async def test_the_vendored_modules_are_served_with_the_same_policy(make_gateway: Any) -> None:
    client = await make_gateway(tokens={TOKEN: "alice"})
    page_policy = (await client.get("/")).headers["Content-Security-Policy"]
    assert "script-src 'self';" in page_policy and "unsafe" not in page_policy  # no inline script, no eval
    for name in VENDOR:
        response = await client.get(f"/console/{name}")
        assert response.status == 200, name
        assert response.content_type == ("text/css" if name.endswith(".css") else "text/javascript"), name
        assert response.headers["Content-Security-Policy"] == page_policy
    # licences and notes stay in the package, not on the web; no path outside the listed files
    for path in (
        "/console/vendor/marked/LICENSE",
        "/console/vendor/README.md",
        "/console/vendor/marked/marked.esm.js.map",
        "/console/vendor/marked/%2e%2e/%2e%2e/%2e%2e/routes/console.py",
        "/console/vendor/marked%2f..%2f..%2fapp.js",
    ):
        assert (await client.get(path)).status in (401, 404), path
