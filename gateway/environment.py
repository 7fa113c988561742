"""The environment an agent process starts with: a documented base, never the gateway's whole one.

The gateway's own environment may hold secrets meant for one agent or for the gateway alone (a
provider key, a database password): an agent process gets only the variables a program needs to
run as the same user on the same machine (:data:`BASE_VARIABLES`, :data:`BASE_PREFIXES`), what
its runtime adds, and its configuration section's ``env``. A section with ``inherit_env = true``
gets the gateway's whole environment instead of the base (its ``env`` still wins).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# Passed through from the gateway's environment when set.
BASE_VARIABLES: tuple[str, ...] = (
    # who and where: the user's programs, home and shell
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    # language, terminal, time zone, temporary files
    "LANG",
    "LANGUAGE",
    "TERM",
    "TZ",
    "TMPDIR",
    # the user's configuration, data and cache directories
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_CACHE_HOME",
    "XDG_STATE_HOME",
    "XDG_RUNTIME_DIR",
    # reaching the network as the gateway does: proxies and extra CA certificates
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
)
# Every variable starting with one of these is passed through too (locale categories).
BASE_PREFIXES: tuple[str, ...] = ("LC_",)


def agent_environment(
    env: Mapping[str, str] | None = None,
    *,
    inherit: bool = False,
    source: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The whole environment for an agent process.

    The base variables of ``source`` (default: the gateway's ``os.environ``), or all of it with
    ``inherit``, then ``env`` on top (the runtime's own variables and the section's ``env``; a
    value there wins, including ``PATH`` and ``HOME``).
    """
    source = os.environ if source is None else source
    if inherit:
        base = dict(source)
    else:
        base = {
            name: value for name, value in source.items() if name in BASE_VARIABLES or name.startswith(BASE_PREFIXES)
        }
    base.update({name: str(value) for name, value in (env or {}).items()})
    return base
