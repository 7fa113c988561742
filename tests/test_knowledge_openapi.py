"""The knowledge routes (the lightrag plugin's ``/v1/knowledge/...``) do what ``/openapi.json``
says, checked by Schemathesis as tests/test_openapi_conformance.py checks the core's.

The gateway (tests/_openapi.GatewayThread with ``knowledge``) points the plugin at a fake LightRAG
server (tests/_fake_lightrag.py: the real server's shapes and refusals, in memory) and has a
workspace ``default`` with two files. Every built-in check runs on every knowledge operation:
examples, coverage and fuzzing cases. A 5xx is a failure here: the fake is healthy, so a
``provider_error`` means the gateway forwarded something the provider refuses. Same settings as
the core's test: fixed seed, derandomized, no example database, a few examples per operation.
"""

from __future__ import annotations

from collections.abc import Iterator

import hypothesis
import pytest
import schemathesis
from schemathesis.specs.openapi.schemas import OpenApiSchema

from tests._openapi import (  # noqa: F401  (fixtures)
    KNOWLEDGE,
    GatewayThread,
    _node_id_for_schemathesis,
    headers_for,
    load_schema,
)


@pytest.fixture(scope="module")
def knowledge_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with GatewayThread(str(tmp_path_factory.mktemp("knowledge")), knowledge=True) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def knowledge_schema(knowledge_gateway: GatewayThread) -> OpenApiSchema:
    return load_schema(knowledge_gateway.url).include(path_regex=KNOWLEDGE)


schema = schemathesis.pytest.from_fixture("knowledge_schema")


@schema.parametrize()
@hypothesis.settings(deadline=None, suppress_health_check=list(hypothesis.HealthCheck))
def test_every_knowledge_operation_conforms(case: schemathesis.Case) -> None:
    case.call_and_validate(headers=headers_for(case))
