"""Actor tokens: looked up without leaking, through timing, how much of a guess was right."""

from __future__ import annotations

import hmac
from collections.abc import Mapping


def actor_for_token(tokens: Mapping[str, str], presented: str) -> str | None:
    """The actor whose token is ``presented``, or None. Every configured token is compared in
    constant time (``hmac.compare_digest``), whichever matches, so the answer's timing says
    neither which token nor how many leading bytes matched."""
    candidate = presented.encode("utf-8", "surrogatepass")
    found: str | None = None
    for token, actor in tokens.items():
        if hmac.compare_digest(token.encode("utf-8", "surrogatepass"), candidate):
            found = actor
    return found
