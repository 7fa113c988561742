"""The web console: static files served at ``/`` and ``/console/<file>`` (``<file>`` may be a
path under ``vendor/``, the third-party ES modules shipped with the package).

The page holds no data (it is a client of the public ``/v1`` API, which checks the token), so its
files are public: a browser cannot send a bearer token on navigation. The page asks for a token
when the API answers 401. These are not API routes: they stay out of ``/v1/`` and out of OpenAPI.
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib import resources
from importlib.resources.abc import Traversable

from aiohttp import web

from agent_gateway.errors import ApiError

CONSOLE_PREFIX = "/console/"
# The console's routes: a web page, not API routes, so never in OpenAPI.
CONSOLE_ROUTES = ("/", CONSOLE_PREFIX + "{name}")
# {name} may hold slashes (vendor/marked/marked.esm.js): it is only ever a key of _FILES.
_FILE_PATTERN = CONSOLE_PREFIX + "{name:.+}"
_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
}


def _walk(folder: Traversable, prefix: str = "") -> Iterator[tuple[str, Traversable]]:
    for entry in folder.iterdir():
        if entry.is_dir():
            yield from _walk(entry, f"{prefix}{entry.name}/")
        elif entry.is_file():
            yield prefix + entry.name, entry


# The console's files, read from the installed package (never a path built from the request);
# LICENSE and README files of vendor/ are not served (no type of theirs is listed).
_FILES: dict[str, tuple[bytes, str]] = {
    name: (entry.read_bytes(), _TYPES[suffix])
    for name, entry in _walk(resources.files("agent_gateway").joinpath("console"))
    if (suffix := "." + name.rsplit(".", 1)[-1]) in _TYPES
}
# Public (no token): the page and its assets hold no data.
PUBLIC_PATHS = frozenset({"/", *(CONSOLE_PREFIX + name for name in _FILES)})
# The page may only load its own files; the API is same-origin.
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)


def _file(name: str) -> web.Response:
    found = _FILES.get(name)
    if found is None:
        raise ApiError(404, "not_found", "no such console file")
    body, content_type = found
    response = web.Response(body=body, content_type=content_type, charset="utf-8")
    response.headers["Cache-Control"] = "no-cache"
    response.headers["Content-Security-Policy"] = _CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


def setup(app: web.Application) -> None:
    async def index(request: web.Request) -> web.Response:
        return _file("index.html")

    async def asset(request: web.Request) -> web.Response:
        return _file(request.match_info["name"])

    app.router.add_get(CONSOLE_ROUTES[0], index, name="console.index")
    app.router.add_get(_FILE_PATTERN, asset, name="console.file")
