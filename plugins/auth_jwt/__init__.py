"""Built-in JWT authenticator: ``Authorization: Bearer <JWT>`` from an OpenID Connect provider or
your own auth server becomes an :class:`agent_gateway.Actor` (``[auth_jwt]``, off by default).

Built on PyJWT (``pip install 'agent-gateway[jwt]'``): the signature, ``exp``/``nbf``/``iat``,
``iss`` and ``aud`` are checked by it, against an algorithm allow-list. Keys come from a key file
(a PEM public key or certificate, or an HMAC secret) or a JWKS URL, fetched with aiohttp off the
request path's blocking calls, cached, and fetched again when a token names an unknown ``kid``
(keys rotate) — at most once per ``jwks_min_refetch_seconds``, so tokens with made-up ``kid``\\ s
cannot make the gateway hammer the provider. See docs/auth.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agent_gateway import Actor, ApiError, PluginError, bearer_token, hookimpl

log = logging.getLogger(__name__)

SECTION = "auth_jwt"
DEFAULTS: dict[str, Any] = {
    "enabled": False,
    "issuer": "",
    "audience": "",
    "jwks_url": "",
    "key_file": "",
    "algorithms": ["RS256", "ES256"],
    "actor_claim": "sub",
    "roles_claim": "roles",
    "workspaces_claim": "",
    "leeway_seconds": 30.0,
    "jwks_cache_seconds": 600.0,
    "jwks_min_refetch_seconds": 10.0,
}
# Algorithm families: a key serves one family only, so a token cannot pick another (an HS256
# token "signed" with the RSA public key's PEM as its HMAC secret is the classic confusion).
FAMILIES = {
    "HS256": "hmac",
    "HS384": "hmac",
    "HS512": "hmac",
    "RS256": "rsa",
    "RS384": "rsa",
    "RS512": "rsa",
    "PS256": "rsa",
    "PS384": "rsa",
    "PS512": "rsa",
    "ES256": "ec",
    "ES384": "ec",
    "ES512": "ec",
    "EdDSA": "okp",
}
JWKS_MAX_BYTES = 1024 * 1024
JWKS_TIMEOUT_S = 10.0


def validate(section: dict[str, Any]) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    algorithms = section["algorithms"]
    if not isinstance(algorithms, list) or not algorithms or not all(isinstance(a, str) for a in algorithms):
        problems.append(("algorithms", "must be a non-empty list of algorithm names"))
        algorithms = []
    unknown = [a for a in algorithms if a not in FAMILIES]
    if unknown:
        problems.append(("algorithms", f"unknown or refused algorithm(s) {unknown}; known: {sorted(FAMILIES)}"))
    families = {FAMILIES[a] for a in algorithms if a in FAMILIES}
    if len(families) > 1 and "hmac" in families:
        problems.append(("algorithms", "HMAC (HS*) and public-key algorithms must not be mixed"))
    for key in ("leeway_seconds", "jwks_cache_seconds", "jwks_min_refetch_seconds"):
        if section[key] < 0:
            problems.append((key, "must be 0 or more"))
    if not section["actor_claim"]:
        problems.append(("actor_claim", "must name the claim that holds the actor id"))
    url = section["jwks_url"]
    if url and urlsplit(url).scheme not in ("https", "http"):
        problems.append(("jwks_url", "must be an https:// (or http://) URL"))
    if not section["enabled"]:
        return problems
    if not section["issuer"]:
        problems.append(("issuer", "required with enabled = true: tokens of another issuer are refused"))
    if not section["audience"]:
        problems.append(("audience", "required with enabled = true: tokens minted for another audience are refused"))
    if bool(url) == bool(section["key_file"]):
        problems.append(("jwks_url", "set exactly one of jwks_url and key_file"))
    if "hmac" in families and url:
        problems.append(("algorithms", "HMAC algorithms need a key_file holding the secret, not a JWKS"))
    if section["key_file"] and not Path(section["key_file"]).expanduser().is_file():
        problems.append(("key_file", f"no such file: {section['key_file']}"))
    return problems


def _claim(claims: Mapping[str, Any], path: str) -> Any:
    """A claim by name, or a dotted path into nested objects (``realm_access.roles``)."""
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _string_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return value.split()  # a space-separated claim, as OAuth's scope is
    if isinstance(value, list):
        return [item for item in value if isinstance(item, str)]
    return []


def _family_of_key(key: Any) -> str:
    from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

    if isinstance(key, rsa.RSAPublicKey):
        return "rsa"
    if isinstance(key, ec.EllipticCurvePublicKey):
        return "ec"
    if isinstance(key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
        return "okp"
    raise PluginError(f"[{SECTION}] key_file: unsupported public key type {type(key).__name__}")


def _load_key_file(path: Path) -> tuple[Any, str]:
    """The verification key in ``path`` and its family: a PEM public key or certificate, else
    the file's bytes as an HMAC secret."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    data = path.read_bytes()
    if b"-----BEGIN CERTIFICATE-----" in data:
        certified = x509.load_pem_x509_certificate(data).public_key()
        return certified, _family_of_key(certified)
    if b"-----BEGIN" in data:
        if b"PRIVATE KEY" in data:
            raise PluginError(f"[{SECTION}] key_file {path} holds a private key: give the public key")
        key = serialization.load_pem_public_key(data)
        return key, _family_of_key(key)
    secret = data.strip()
    if len(secret) < 32:
        raise PluginError(f"[{SECTION}] key_file {path}: an HMAC secret must be at least 32 bytes")
    return secret, "hmac"


class JwtVerifier:
    """One ``[auth_jwt]`` configuration: its keys and the checks of every token."""

    def __init__(self, section: Mapping[str, Any]) -> None:
        try:
            import jwt
        except ImportError as exc:  # the optional extra
            raise PluginError(f"[{SECTION}] needs PyJWT: pip install 'agent-gateway[jwt]'") from exc
        self.jwt = jwt
        self.issuer = str(section["issuer"])
        self.audience = str(section["audience"])
        self.algorithms = [a for a in section["algorithms"] if a in FAMILIES]
        self.actor_claim = str(section["actor_claim"])
        self.roles_claim = str(section["roles_claim"])
        self.workspaces_claim = str(section["workspaces_claim"])
        self.leeway = float(section["leeway_seconds"])
        self.jwks_url = str(section["jwks_url"])
        self.cache_seconds = float(section["jwks_cache_seconds"])
        self.min_refetch = float(section["jwks_min_refetch_seconds"])
        self.key: Any = None
        if section["key_file"]:
            path = Path(section["key_file"]).expanduser()
            try:
                self.key, family = _load_key_file(path)
            except PluginError:
                raise
            except Exception as exc:
                raise PluginError(f"[{SECTION}] key_file {path}: {type(exc).__name__}: {exc}") from exc
            refused = [a for a in self.algorithms if FAMILIES[a] != family]
            if refused:
                raise PluginError(f"[{SECTION}] algorithms {refused} cannot be verified with a {family} key_file")
        # The JWKS: signing keys by kid, when they were fetched, and the fetch under way (one at a time).
        self.keys: dict[str | None, Any] = {}
        self.fetched_at: float | None = None
        self._fetching: asyncio.Task[None] | None = None
        self.fetches = 0

    # -- the request path -------------------------------------------------------------------------
    def actor_for(self, token: str) -> Actor | Awaitable[Actor] | None:
        """None when ``token`` is not a JWT (another authenticator's token); else the Actor, or
        an awaitable of it when the JWKS must be fetched first. A JWT that fails any check is a
        401 naming why."""
        try:
            header = self.jwt.get_unverified_header(token)
        except self.jwt.InvalidTokenError:
            return None  # not a JWT: the static tokens (tried last) may know it
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self.algorithms:
            raise _unauthorized(f"algorithm {str(alg)[:20]!r} is not accepted")
        if self.key is not None:
            return self._verify(token, alg, self.key)
        kid = header.get("kid")
        if not isinstance(kid, str | None):
            raise _unauthorized("kid must be a string")
        fetched_at = self.fetched_at
        if fetched_at is not None and not self._in_flight():
            age = time.monotonic() - fetched_at
            jwk = self._jwk(kid) if age < self.cache_seconds else None
            if jwk is not None:
                return self._verify_jwk(token, alg, jwk)
            if age < self.min_refetch:
                raise _unauthorized("no key with this kid")  # not again so soon: kids can be made up
        return self._after_fetch(token, alg, kid)

    def _in_flight(self) -> bool:
        return self._fetching is not None and not self._fetching.done()

    async def _after_fetch(self, token: str, alg: str, kid: str | None) -> Actor:
        await self.refresh()
        jwk = self._jwk(kid)
        if jwk is None:
            raise _unauthorized("no key with this kid")
        return self._verify_jwk(token, alg, jwk)

    def _jwk(self, kid: str | None) -> Any:
        if kid is None and len(self.keys) == 1:  # a token without kid, a set of one key
            return next(iter(self.keys.values()))
        return self.keys.get(kid)

    def _verify_jwk(self, token: str, alg: str, jwk: Any) -> Actor:
        if jwk.algorithm_name != alg:  # the key serves one algorithm, whatever the token says
            raise _unauthorized(f"algorithm {alg!r} does not match the key's")
        return self._verify(token, alg, jwk.key)

    def _verify(self, token: str, alg: str, key: Any) -> Actor:
        jwt = self.jwt
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.InvalidTokenError as exc:
            raise _unauthorized(str(exc) or type(exc).__name__) from None
        actor_id = _claim(claims, self.actor_claim)
        if not isinstance(actor_id, str) or not actor_id.strip():
            raise _unauthorized(f"the {self.actor_claim!r} claim must hold the actor id")
        actor_claims: dict[str, Any] = {"roles": _string_list(_claim(claims, self.roles_claim)), "jwt": claims}
        if self.workspaces_claim:  # configured but absent: no workspace, rather than every one
            actor_claims["workspaces"] = _string_list(_claim(claims, self.workspaces_claim))
        return Actor(actor_id, actor_claims)

    # -- the JWKS -----------------------------------------------------------------------------------
    async def refresh(self) -> None:
        """Fetch the JWKS, once however many requests wait for it, and at most once per
        ``jwks_min_refetch_seconds``; a failed fetch keeps the keys already known."""
        task = self._fetching
        if task is None or task.done() or task.get_loop() is not asyncio.get_running_loop():
            if self.fetched_at is not None and time.monotonic() - self.fetched_at < self.min_refetch:
                return
            self.fetched_at = time.monotonic()  # the attempt counts, failed or not
            task = self._fetching = asyncio.ensure_future(self._fetch())
        await asyncio.shield(task)

    async def _fetch(self) -> None:
        import aiohttp

        self.fetches += 1
        try:
            timeout = aiohttp.ClientTimeout(total=JWKS_TIMEOUT_S)
            async with aiohttp.ClientSession(timeout=timeout) as session, session.get(self.jwks_url) as response:
                response.raise_for_status()
                body = await response.content.read(JWKS_MAX_BYTES + 1)
            if len(body) > JWKS_MAX_BYTES:
                raise ValueError(f"the JWKS is larger than {JWKS_MAX_BYTES} bytes")
            data = json.loads(body)
            keys: dict[str | None, Any] = {}
            for entry in data.get("keys", []) if isinstance(data, dict) else []:
                if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
                    continue
                try:
                    jwk = self.jwt.PyJWK(entry)
                except self.jwt.PyJWTError as exc:  # a key this gateway cannot use: skip it, keep the rest
                    log.warning("[%s] JWKS key %r skipped: %s", SECTION, entry.get("kid"), exc)
                    continue
                keys[entry.get("kid")] = jwk
        except Exception as exc:
            log.warning("[%s] fetching the JWKS %s failed: %s: %s", SECTION, self.jwks_url, type(exc).__name__, exc)
            return
        self.keys = keys


def _unauthorized(reason: str) -> ApiError:
    return ApiError(401, "unauthorized", f"invalid token: {reason}")


# One verifier per loaded configuration (a process may serve several, as the tests do), None for
# one with [auth_jwt] off; by the configuration's identity, forgotten with it.
_verifiers: dict[int, tuple[weakref.ref[Any], JwtVerifier | None]] = {}


def verifier_for(config: Any) -> JwtVerifier | None:
    """The verifier of ``config``'s ``[auth_jwt]``, or None when it is not enabled."""
    key = id(config)
    entry = _verifiers.get(key)
    if entry is not None and entry[0]() is config:
        return entry[1]
    section = config.section(SECTION)
    found = JwtVerifier(section) if section["enabled"] else None
    _verifiers[key] = (weakref.ref(config, lambda _ref: _verifiers.pop(key, None)), found)
    return found


@hookimpl
def config_sections(register: Any) -> None:
    register(SECTION, DEFAULTS, validate, doc="JWT bearer tokens as actors (docs/auth.md)")


@hookimpl
def authentication_enabled(config: Any) -> bool:
    # Built here, at start-up, so an unreadable key file stops the gateway with its reason.
    return verifier_for(config) is not None


@hookimpl
def authenticate(request: Any, config: Any) -> Actor | Awaitable[Actor] | None:
    token = bearer_token(request)
    if token is None:
        return None
    verifier = verifier_for(config)
    return verifier.actor_for(token) if verifier is not None else None
