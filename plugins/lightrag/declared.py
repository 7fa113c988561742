"""The ``/v1/knowledge/...`` routes declared once: their bodies, queries, path variables and
answers as pydantic models (class names are the component names in ``/openapi.json``).

The handlers (:mod:`.routes`) validate with these declarations and the served document is built
from them. Field errors answer the gateway's ``400 invalid_request``; the rules of a knowledge call
beyond one field's type (a query LightRAG would refuse, which keys a body must give together)
answer ``400 invalid_arguments``, as the service and the ``knowledge_rag.*`` tools do.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator
from pydantic_core import PydanticCustomError

from agent_gateway import Identifier, NonBlankText, Route, RouteResponse, refuse

from .mapping import QUERY_PATTERN, REFERENCE_SCHEMA
from .service import DOCUMENT_SCHEMA, OPEN_SCHEMA, QUERY_SCHEMA, SOURCE_SCOPE_MODE, STATUS_SCHEMA, Mode

TAGS = ("knowledge (lightrag plugin)",)

# The workspace path rules a pattern can say (`agent_gateway.paths`), for the document only (the
# route checks paths itself, answering `path_refused`): no control character or backslash, no
# leading `~`, no `..` component, and a last component that names something (not empty, not `.`).
# Written without lookahead, one alternative per way a component can start, so Python and
# ECMA-262 read it alike and a generator builds matching strings quickly.
_CHAR = r"[^/\\\u0000-\u001f\u007f]"  # within a component
_NOT_DOT = r"[^/.\\\u0000-\u001f\u007f]"
_NAMED = rf"(?:\.?{_NOT_DOT}{_CHAR}*|\.\.{_CHAR}+)"  # neither empty, `.` nor `..`
_FIRST_NAMED = rf"(?:[^/.~\\\u0000-\u001f\u007f]{_CHAR}*|\.{_NOT_DOT}{_CHAR}*|\.\.{_CHAR}+)"  # no leading `~`
_MIDDLE = rf"(?:{_NAMED}|\.)?"
PATH_PATTERN = rf"^(?:(?:{_FIRST_NAMED}|\.)?(?:/{_MIDDLE})*/{_NAMED}|{_FIRST_NAMED})$"
NAME_PATTERN = rf"^(?:(?:{_FIRST_NAMED}|\.)(?:/{_MIDDLE})*/{_NAMED}|{_FIRST_NAMED})$"  # relative: no leading `/`

MAX_QUERY = 4000
MAX_PATH = 4096
# The other limits of a knowledge call's fields (the knowledge_rag tools' schemas say the same).
MAX_REFERENCE_ID = 64
MAX_CHUNK_ID = 200
MAX_EXCERPT = 20_000
MAX_SOURCE_PATHS = 100
MAX_TOP_K = 200
QUERY_TEXT = re.compile(QUERY_PATTERN)
QUERY_DESCRIPTION = "At least three characters besides white space at either end"


def _document(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """(every model's ``json_schema_extra``) A field left out is None in the model, but a client
    never sends null for it unless ``NULLABLE`` names it: the document lists its type without
    null and without a default. Then the model's ``SCHEMA_EXTRA`` (keys JSON Schema says of the
    whole object: ``anyOf``, ``dependentRequired``, ...)."""
    nullable: frozenset[str] = getattr(model, "NULLABLE", frozenset())
    for name, prop in schema.get("properties", {}).items():
        if name in nullable:
            continue
        alternatives = prop.get("anyOf")
        if isinstance(alternatives, list) and {"type": "null"} in alternatives:
            kept = [item for item in alternatives if item != {"type": "null"}]
            del prop["anyOf"]
            prop.update(kept[0] if len(kept) == 1 else {"anyOf": kept})
        if "default" in prop and prop["default"] is None:
            del prop["default"]
    schema.update(getattr(model, "SCHEMA_EXTRA", {}))


class _Model(BaseModel):
    NULLABLE: ClassVar[frozenset[str]] = frozenset()
    SCHEMA_EXTRA: ClassVar[dict[str, Any]] = {}
    model_config = ConfigDict(defer_build=True, json_schema_extra=_document)


class _Request(_Model):
    """A body or query: strict, unknown keys refused, and null refused where the document has none."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _not_null(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, value in data.items():
                if value is None and name in cls.model_fields and name not in cls.NULLABLE:
                    raise refuse("invalid_request", f"{name} must not be null", field=name)
        return data


# -- requests ---------------------------------------------------------------------------------------


def _roots(value: Any) -> Any:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(root, str) for root in value):
        raise PydanticCustomError("allowed_roots", "must be a list of strings")
    return value


AllowedRoots = Annotated[
    list[str],
    BeforeValidator(_roots),
    WithJsonSchema({"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}),
]


def _query_text(value: Any) -> Any:
    """LightRAG refuses a query with fewer than three characters once stripped: refused first
    (its 422 would come back as a 502)."""
    if not isinstance(value, str):
        return value  # (the type's check says so)
    if len(value) > MAX_QUERY:
        raise refuse("invalid_arguments", f"query must be at most {MAX_QUERY} characters", field="query")
    if not QUERY_TEXT.search(value):
        raise refuse(
            "invalid_arguments",
            "query must have at least three characters besides white space at either end",
            field="query",
        )
    return value


QueryText = Annotated[
    str,
    BeforeValidator(_query_text),
    Field(
        description=QUERY_DESCRIPTION,
        json_schema_extra={"minLength": 3, "maxLength": MAX_QUERY, "pattern": QUERY_PATTERN},
    ),
]


def _integral(value: Any) -> Any:
    """JSON does not tell 7.0 from 7, nor does JSON Schema's "integer": an integral number is the
    integer it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


WorkspacePath = Annotated[str, Field(min_length=1, max_length=MAX_PATH)]


class KnowledgeWhere(_Request):
    """The workspace a call works in."""

    workspaceId: Identifier = Field("default", description="A configured workspace")
    allowedRoots: AllowedRoots = Field(
        default_factory=lambda: [""], description="Readable roots inside the workspace (default: all of it)"
    )


class KnowledgeQuery(KnowledgeWhere):
    """A question to the workspace's knowledge base."""

    query: QueryText
    sourcePaths: Annotated[list[WorkspacePath], Field(max_length=MAX_SOURCE_PATHS)] | None = Field(
        None,
        description="Workspace paths or folders (notes/ or notes/a.md). Applied after retrieval: only the "
        "references returned are limited to them; the answer may still use other documents.",
    )
    mode: Mode | None = None
    topK: Annotated[int, Field(ge=1, le=MAX_TOP_K), BeforeValidator(_integral)] | None = None


class KnowledgeReferenceArgument(_Request):
    """A reference from a query result (its other properties are ignored)."""

    NULLABLE: ClassVar[frozenset[str]] = frozenset({"sourcePath"})
    SCHEMA_EXTRA: ClassVar[dict[str, Any]] = {
        "anyOf": [
            {"required": ["referenceId"]},
            {"required": ["filePath"]},
            {"required": ["sourcePath"], "properties": {"sourcePath": {"type": "string"}}},
        ]
    }
    model_config = ConfigDict(extra="ignore")

    referenceId: Annotated[str, Field(min_length=1, max_length=MAX_REFERENCE_ID)] | None = None
    sourcePath: WorkspacePath | None = None
    filePath: WorkspacePath | None = None

    @model_validator(mode="after")
    def _one_key(self) -> KnowledgeReferenceArgument:
        if self.referenceId is None and self.filePath is None and self.sourcePath is None:
            raise refuse("invalid_arguments", "a reference has a referenceId, a filePath or a sourcePath")
        return self


class KnowledgeOpenReference(KnowledgeWhere):
    """A reference from a query result, or a provider hint (a filePath, a chunkId with the query
    that retrieved it, an excerpt), to resolve to a citation."""

    SCHEMA_EXTRA: ClassVar[dict[str, Any]] = {
        "anyOf": [{"required": [key]} for key in ("reference", "referenceId", "sourcePath", "filePath")],
        "dependentRequired": {"chunkId": ["query"]},
    }

    reference: KnowledgeReferenceArgument | None = None
    referenceId: Annotated[str, Field(min_length=1, max_length=MAX_REFERENCE_ID)] | None = None
    sourcePath: WorkspacePath | None = None
    filePath: WorkspacePath | None = None
    chunkId: Annotated[str, Field(min_length=1, max_length=MAX_CHUNK_ID)] | None = None
    query: QueryText | None = None
    excerpt: Annotated[str, Field(min_length=1, max_length=MAX_EXCERPT)] | None = None

    @model_validator(mode="after")
    def _what_to_open(self) -> KnowledgeOpenReference:
        if self.reference is None and self.referenceId is None and self.sourcePath is None and self.filePath is None:
            raise refuse("invalid_arguments", "give a reference, a referenceId, a sourcePath or a filePath")
        if self.chunkId is not None and self.query is None:
            raise refuse(
                "invalid_arguments",
                "a chunkId can only be located together with the query that retrieved it (give query too)",
            )
        return self


class KnowledgeAddDocument(KnowledgeWhere):
    """`path`: a file under the allowed roots; or `text` with `name`, a workspace-style relative
    path (no `..`, not absolute)."""

    SCHEMA_EXTRA: ClassVar[dict[str, Any]] = {
        "oneOf": [
            {"required": ["path"], "not": {"anyOf": [{"required": ["text"]}, {"required": ["name"]}]}},
            {"required": ["text", "name"], "not": {"required": ["path"]}},
        ]
    }

    path: (
        Annotated[
            str,
            Field(
                min_length=1,
                max_length=MAX_PATH,
                # (said, not checked here: the route's path check answers `path_refused`)
                json_schema_extra={"pattern": PATH_PATTERN},
                description="A workspace path (no control character or backslash, no leading `~`, no `..` "
                "component, a last component that names a file)",
            ),
        ]
        | None
    ) = None
    text: Annotated[NonBlankText, Field(description="Not only white space")] | None = None
    name: (
        Annotated[
            str,
            Field(
                min_length=1,
                max_length=MAX_PATH,
                json_schema_extra={"pattern": NAME_PATTERN},  # (said, not checked: see `path`)
                description="A workspace-style relative path (no control character or backslash, not absolute, no "
                "leading `~`, no `..` component, a last component that names a file)",
            ),
        ]
        | None
    ) = None

    @model_validator(mode="after")
    def _path_or_text(self) -> KnowledgeAddDocument:
        by_path = self.path is not None and self.text is None and self.name is None
        by_text = self.path is None and self.text is not None and self.name is not None
        if not (by_path or by_text):
            raise refuse("invalid_arguments", "give either path (a workspace file) or text with a name")
        return self


DocumentKeys = Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=500)]


class KnowledgeDeleteDocuments(KnowledgeWhere):
    """Documents of the workspace to delete, by id or by workspace path."""

    SCHEMA_EXTRA: ClassVar[dict[str, Any]] = {
        "anyOf": [{"required": [key], "properties": {key: {"minItems": 1}}} for key in ("documentIds", "sourcePaths")]
    }

    documentIds: DocumentKeys | None = None
    sourcePaths: DocumentKeys | None = None

    @model_validator(mode="after")
    def _some(self) -> KnowledgeDeleteDocuments:
        if not self.documentIds and not self.sourcePaths:
            raise refuse("invalid_arguments", "give documentIds or sourcePaths")
        return self


class KnowledgeWhereQuery(_Request):
    workspaceId: Identifier = Field("default", description="A configured workspace")
    allowedRoots: str | None = Field(None, description="A readable root inside the workspace (default: all of it)")


class TrackPath(_Request):
    trackId: str = Field(min_length=1, description="The trackId of a document added (its 202 answer)")


# -- answers ----------------------------------------------------------------------------------------


class _Answer(_Model):
    """(what the handlers answer: documentation, never validated)"""


def _constant(value: str, alias: str | None = None) -> Any:
    """A field that always holds ``value`` (the service's schema names, kept in one place there)."""
    return Field(alias=alias, json_schema_extra={"const": value})


class KnowledgeStatus(_Answer):
    """The knowledge provider's state (gateway.knowledge_rag.status.v1)."""

    schema_: str = _constant(STATUS_SCHEMA, alias="schema")
    provider: Literal["lightrag"]
    configured: bool
    available: bool
    sourceScopeMode: str = _constant(SOURCE_SCOPE_MODE)
    modes: list[str]
    defaultMode: str
    reason: str | None = Field(None, description="Why it is not available")
    providerVersion: str | None = Field(None, description="LightRAG's version, once reached")
    pipelineBusy: bool | None = Field(None, description="Whether LightRAG is indexing, once reached")
    NULLABLE: ClassVar[frozenset[str]] = frozenset({"providerVersion"})


class KnowledgeLinesLocator(_Answer):
    """The lines of the workspace file holding the retrieved text."""

    kind: Literal["lines"]
    startLine: int
    endLine: int


class KnowledgeDocumentLocator(_Answer):
    """The whole document: the text was not found as it is (the citation is degraded)."""

    kind: Literal["document"]


class _Citation(_Answer):
    sourcePath: str | None = Field(description="The workspace path; null for a document not added through the gateway")
    filePath: str
    citationMarkdown: str
    citationUrl: str | None
    locatorDegraded: bool = Field(description="True: cite the document, never a page, line or position")
    locator: KnowledgeLinesLocator | KnowledgeDocumentLocator = Field(discriminator="kind")
    degradedReason: str | None = Field(None, description="Why the locator is degraded (only then)")
    NULLABLE: ClassVar[frozenset[str]] = frozenset({"sourcePath", "citationUrl"})


class KnowledgeReference(_Citation):
    """A reference of a query result, mapped to a workspace path (gateway.knowledge_rag.reference.v1)."""

    schema_: str = _constant(REFERENCE_SCHEMA, alias="schema")
    referenceId: str
    title: str


class KnowledgeOpenedReference(_Citation):
    """A reference resolved to a citation (gateway.knowledge_rag.open_reference.v1)."""

    schema_: str = _constant(OPEN_SCHEMA, alias="schema")
    referenceId: str


class KnowledgeSourceScope(_Answer):
    """What sourcePaths did: a filter of the references after retrieval."""

    mode: str = _constant(SOURCE_SCOPE_MODE)
    sourcePaths: list[str] | None
    description: str
    retrievedReferences: int
    returnedReferences: int
    otherWorkspaceReferencesDropped: int
    workspaceIsolation: Literal["provider", "shared"] = Field(
        description="`provider`: the workspace has a LightRAG server of its own; `shared`: references of other "
        "workspaces are dropped"
    )
    NULLABLE: ClassVar[frozenset[str]] = frozenset({"sourcePaths"})


class KnowledgeQueryResult(_Answer):
    """An answer and its references (gateway.knowledge_rag.query_result.v1)."""

    schema_: str = _constant(QUERY_SCHEMA, alias="schema")
    answer: str
    answerFound: bool
    mode: str
    sourceScopeMode: str = _constant(SOURCE_SCOPE_MODE)
    sourceScope: KnowledgeSourceScope
    references: list[KnowledgeReference]
    citations: list[str] = Field(description="Each reference's citationMarkdown")
    citationGuidance: str


class KnowledgeDocumentQueued(_Answer):
    """A document accepted for indexing (gateway.knowledge_rag.document.v1)."""

    schema_: str = _constant(DOCUMENT_SCHEMA, alias="schema")
    workspaceId: str
    sourcePath: str
    trackId: str | None = Field(description="Follow it with GET /v1/knowledge/documents/track/{trackId}")
    status: Literal["queued"]
    NULLABLE: ClassVar[frozenset[str]] = frozenset({"trackId"})


class KnowledgeDocument(_Answer):
    """An indexed document of the workspace (gateway.knowledge_rag.document.v1)."""

    schema_: str = _constant(DOCUMENT_SCHEMA, alias="schema")
    documentId: str
    workspaceId: str
    sourcePath: str
    status: str = Field(description="LightRAG's: pending, processing, processed, failed, ...")
    chunks: int | None
    updatedAt: str | None
    error: str | None = Field(None, description="Why indexing failed (only then)")
    NULLABLE: ClassVar[frozenset[str]] = frozenset({"chunks", "updatedAt"})


class KnowledgeDocuments(_Answer):
    """The workspace's indexed documents."""

    workspaceId: str
    documents: list[KnowledgeDocument]


class KnowledgeTrack(_Answer):
    """The documents of one add and their indexing status."""

    trackId: str
    workspaceId: str
    documents: list[KnowledgeDocument]


class KnowledgeDeleted(_Answer):
    """A document whose deletion started."""

    documentId: str
    sourcePath: str
    status: Literal["deleting"]


class KnowledgeDeletion(_Answer):
    """The documents whose deletion started."""

    workspaceId: str
    deleted: list[KnowledgeDeleted]


# -- routes -----------------------------------------------------------------------------------------

ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
PROVIDER_RESPONSES: dict[int | str, RouteResponse] = {
    502: RouteResponse("The knowledge provider answered with an error (`provider_error`)", content=ERROR),
    503: RouteResponse(
        "The knowledge provider is not configured, unreachable or busy (`provider_unavailable`, `provider_busy`), "
        "or storage is down",
        content=ERROR,
    ),
}
READ_ERRORS = (400, 401, 403, 404, 409)
BODY_ERRORS = (*READ_ERRORS, 413, 415)

STATUS: Route[Any, Any] = Route(
    "GET",
    "/v1/knowledge/status",
    "Knowledge provider status (gateway.knowledge_rag.status.v1)",
    operation_id="getKnowledgeStatus",
    tags=TAGS,
    responses={200: RouteResponse("OK", KnowledgeStatus), **PROVIDER_RESPONSES},
    errors=READ_ERRORS,
)
QUERY: Route[KnowledgeQuery, Any] = Route(
    "POST",
    "/v1/knowledge/query",
    "Query (gateway.knowledge_rag.query_result.v1; sourcePaths filter after retrieval)",
    operation_id="queryKnowledge",
    tags=TAGS,
    body=KnowledgeQuery,
    responses={200: RouteResponse("OK", KnowledgeQueryResult), **PROVIDER_RESPONSES},
    errors=BODY_ERRORS,
)
OPEN_REFERENCE: Route[KnowledgeOpenReference, Any] = Route(
    "POST",
    "/v1/knowledge/open_reference",
    "Resolve a reference or provider hint to a locator (precise or degraded)",
    operation_id="openKnowledgeReference",
    tags=TAGS,
    body=KnowledgeOpenReference,
    responses={200: RouteResponse("OK", KnowledgeOpenedReference), **PROVIDER_RESPONSES},
    errors=BODY_ERRORS,
)
LIST_DOCUMENTS: Route[Any, KnowledgeWhereQuery] = Route(
    "GET",
    "/v1/knowledge/documents",
    "List indexed documents of the workspace",
    operation_id="listKnowledgeDocuments",
    tags=TAGS,
    query=KnowledgeWhereQuery,
    responses={200: RouteResponse("OK", KnowledgeDocuments), **PROVIDER_RESPONSES},
    errors=READ_ERRORS,
)
ADD_DOCUMENT: Route[KnowledgeAddDocument, Any] = Route(
    "POST",
    "/v1/knowledge/documents",
    "Add a text or a file from an allowed root (202: indexing started)",
    operation_id="addKnowledgeDocument",
    tags=TAGS,
    body=KnowledgeAddDocument,
    responses={
        202: RouteResponse(
            "Accepted: indexing",
            KnowledgeDocumentQueued,
            links={
                "GetKnowledgeTrack": {
                    "operationId": "getKnowledgeTrack",
                    "parameters": {"trackId": "$response.body#/trackId", "workspaceId": "$response.body#/workspaceId"},
                }
            },
        ),
        **PROVIDER_RESPONSES,
    },
    errors=BODY_ERRORS,
)
DELETE_DOCUMENTS: Route[KnowledgeDeleteDocuments, Any] = Route(
    "DELETE",
    "/v1/knowledge/documents",
    "Delete documents (202: deletion started)",
    operation_id="deleteKnowledgeDocuments",
    tags=TAGS,
    body=KnowledgeDeleteDocuments,
    responses={202: RouteResponse("Accepted: deleting", KnowledgeDeletion), **PROVIDER_RESPONSES},
    errors=BODY_ERRORS,
)
TRACK: Route[Any, KnowledgeWhereQuery, TrackPath] = Route(
    "GET",
    "/v1/knowledge/documents/track/{trackId}",
    "Indexing status",
    operation_id="getKnowledgeTrack",
    tags=TAGS,
    params=TrackPath,
    query=KnowledgeWhereQuery,
    responses={200: RouteResponse("OK", KnowledgeTrack), **PROVIDER_RESPONSES},
    errors=READ_ERRORS,
)
