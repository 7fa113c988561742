"""Routes declared once: method, path, body and parameter models, responses.

A :class:`Route` is what both halves of an HTTP route read, so they cannot drift apart: its
handler validates the request with it (:meth:`Route.parse_body`, :meth:`Route.parse_query`),
which refuses a bad one with the gateway's usual ``400 invalid_request`` naming the field, and
``/openapi.json`` lists its operation as :meth:`Route.openapi` builds it from the same models
(their JSON Schema is OpenAPI 3.1's dialect). Bodies and parameters are pydantic v2 models.

The core declares its routes here; a plugin passes its own to ``routes.add(route, handler)``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Generic, Literal, get_args

from aiohttp import web
from pydantic import AfterValidator, BaseModel, Field, ValidationError, WithJsonSchema
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import PydanticCustomError, core_schema
from typing_extensions import TypeVar

from agent_gateway.errors import ApiError, ErrorShape, PluginError

M = TypeVar("M", bound=BaseModel)
B = TypeVar("B", bound=BaseModel)
Q = TypeVar("Q", bound=BaseModel)
# (a default: a route is written Route[Body, Query] when its path has no declared variables)
P = TypeVar("P", bound=BaseModel, default=BaseModel)

COMPONENT_REF = "#/components/schemas/{model}"
# A text holds something besides white space: a character no regex dialect (Python's, ECMA-262's
# in /openapi.json, Rust's in validators) counts as white space.
VISIBLE_PATTERN = r"[^\s\u001c-\u001f\u0085\ufeff]"
VISIBLE = re.compile(VISIBLE_PATTERN)
MAX_UNKNOWN_LISTED = 200  # characters of the unknown names an error message lists
# aiohttp path variables, `{name}` or `{name:regex}`; OpenAPI writes them `{name}`
PATH_VARIABLE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?::[^{}]*)?\}")


def openapi_path(path: str) -> str:
    """The OpenAPI form of an aiohttp route path (``{name:regex}`` becomes ``{name}``)."""
    return PATH_VARIABLE.sub(r"{\1}", path)


def _non_blank(value: str) -> str:
    if not VISIBLE.search(value):
        raise PydanticCustomError("blank_text", "must be a non-empty string")
    return value


# Text with something besides white space (a blank message or id is refused, by the same rule in
# the document: its pattern).
NonBlankText = Annotated[
    str,
    Field(min_length=1, json_schema_extra={"pattern": VISIBLE_PATTERN}),
    AfterValidator(_non_blank),
]
# An identifier a client chooses: non-blank, at most 200 characters.
Identifier = Annotated[
    str,
    Field(min_length=1, max_length=200, json_schema_extra={"pattern": VISIBLE_PATTERN}),
    AfterValidator(_non_blank),
]

# The shared error responses of the core's document (components/responses), by status.
ERROR_RESPONSES: dict[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    413: "PayloadTooLarge",
    415: "UnsupportedMediaType",
    429: "TooManyRequests",
    503: "ServiceUnavailable",
}


class _OpenApiSchema(GenerateJsonSchema):
    """JSON Schema as the document writes it: no generated titles (the names are the keys)."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def model_schema(self, schema: core_schema.ModelSchema) -> dict[str, Any]:
        out = super().model_schema(schema)
        out.pop("title", None)
        return out


# (a stand-in pydantic leaves alone: it resolves every "$ref" it meets among its own definitions)
_COMPONENT_MARK = "x-agent-gateway-component"


def component(name: str) -> WithJsonSchema:
    """A field's schema in the document: a reference to the component schema ``name``, one the
    served document defines without a model (``Annotated[str | None, component("Projection")]``)."""
    return WithJsonSchema({_COMPONENT_MARK: name})


def _resolve_components(value: Any) -> Any:
    if isinstance(value, dict):
        if _COMPONENT_MARK in value:
            rest = {k: v for k, v in value.items() if k != _COMPONENT_MARK}
            return {"$ref": COMPONENT_REF.format(model=value[_COMPONENT_MARK]), **rest}
        return {k: _resolve_components(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve_components(v) for v in value]
    return value


def json_schema(model: type[BaseModel], mode: Literal["validation", "serialization"] = "validation") -> dict[str, Any]:
    """``model``'s JSON Schema as the document writes it (references to ``components/schemas``)."""
    schema = model.model_json_schema(ref_template=COMPONENT_REF, schema_generator=_OpenApiSchema, mode=mode)
    schema = _resolve_components(schema)
    # A model may adjust its own schema once generated (``adjust_openapi_schema(schema)``), e.g. to
    # refer to a component of the document no model declares: pydantic resolves every $ref itself.
    adjust = getattr(model, "adjust_openapi_schema", None)
    if adjust is not None:
        adjust(schema)
    return schema


def model_schemas(
    model: type[BaseModel], mode: Literal["validation", "serialization"] = "validation"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``model``'s JSON Schema as a reference, and the component schemas it needs by name."""
    schema = json_schema(model, mode)
    components: dict[str, Any] = dict(schema.pop("$defs", {}))
    components[model.__name__] = schema
    return {"$ref": COMPONENT_REF.format(model=model.__name__)}, components


# How a refusal names a field from pydantic's location of the error (``("messages", 0, "content")``).
FieldPath = Callable[[Sequence[int | str]], str]


def dotted(location: Sequence[int | str]) -> str:
    """``messages.0.content``: the gateway's own form (``field`` of its 400s)."""
    return ".".join(str(part) for part in location)


def json_path(location: Sequence[int | str]) -> str:
    """``messages[0].content``: the form of JSON paths and of OpenAI's ``param``. A segment written
    ``<name>`` is a tagged union's member (pydantic puts a member's tag in the location; tag the
    members so: ``Tag("<user>")``) and is left out: it names no field of the JSON."""
    out = ""
    for part in location:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not (part.startswith("<") and part.endswith(">")):
            out += f".{part}" if out else part
    return out


def _phrase(error: Mapping[str, Any]) -> str:
    """What is wrong with one field, in the words of the gateway's earlier messages."""
    kind, ctx = error["type"], error.get("ctx") or {}
    phrases = {
        "missing": "is required",
        "string_type": "must be a string",
        "string_too_short": "must be a non-empty string",
        "string_too_long": f"must be at most {ctx.get('max_length')} characters",
        "int_type": "must be an integer",
        "bool_type": "must be a boolean",
        "float_type": "must be a number",
        "list_type": "must be a list",
        "too_short": f"must hold at least {ctx.get('min_length')} item(s)",
        "too_long": f"must hold at most {ctx.get('max_length')} item(s)",
        "dict_type": "must be an object",
        "model_type": "must be an object",
        "model_attributes_type": "must be an object",
        "literal_error": f"must be one of {ctx.get('expected')}",
        "enum": f"must be one of {ctx.get('expected')}",
    }
    phrase = phrases.get(kind)
    if phrase is not None:
        return phrase
    message = str(error["msg"])  # a custom error's message is already a phrase
    return message[:1].lower() + message[1:]


REFUSAL = "api_refusal"


def refuse(code: str, message: str, **extra: Any) -> PydanticCustomError:
    """A validator's refusal with the route's own error code and whole message (``400 code``,
    ``extra`` in the error object), for the refusals a route had before it was declared."""
    return PydanticCustomError(REFUSAL, "{message}", {"message": message, "code": code, "extra": extra})


def problem(exc: ValidationError, what: str = "the body", field_path: FieldPath | None = None) -> ApiError:
    """The ``400`` of a refused body, query or path: a validator's own refusal (:func:`refuse`), or
    ``invalid_request`` naming the first bad field (also in ``field``; written by ``field_path``,
    :func:`dotted` by default), or all its unknown fields."""
    name = field_path or dotted
    errors = exc.errors(include_url=False, include_input=False)
    for error in errors:
        if error["type"] == "extra_forbidden":
            continue
        if error["type"] == REFUSAL:
            ctx = error["ctx"]
            return ApiError(400, ctx["code"], ctx["message"], **ctx["extra"])
        location = name(error["loc"])
        if not location:  # the whole value: not an object at all
            return ApiError(400, "invalid_request", f"{what} must be a JSON object")
        return ApiError(400, "invalid_request", f"{location} {_phrase(error)}", field=location)
    unknown = sorted(name(error["loc"]) for error in errors)
    noun = "query parameter(s)" if what == "the query" else "field(s)"
    return ApiError(400, "invalid_request", f"unknown {noun}: {', '.join(unknown)[:MAX_UNKNOWN_LISTED]}")


def parse_model(model: type[M], value: Any, what: str = "the body", field_path: FieldPath | None = None) -> M:
    """``value`` (parsed JSON) as ``model``, or ``400 invalid_request`` naming the bad field."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise problem(exc, what, field_path) from None


@dataclass(frozen=True)
class RouteResponse:
    """One status of an operation: its description and body model (JSON), and anything else
    the document says of it as OpenAPI (other media types, headers, links). A media type of
    ``content`` may be given as a model (``{"text/event-stream": Frame}``): its schema by
    reference, as for ``model``."""

    description: str
    model: type[BaseModel] | None = None
    content: Mapping[str, Mapping[str, Any] | type[BaseModel]] = field(default_factory=dict)
    headers: Mapping[str, Any] = field(default_factory=dict)
    links: Mapping[str, Any] = field(default_factory=dict)

    def openapi_response(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The OpenAPI response object, and the component schemas it refers to by name."""
        item: dict[str, Any] = {"description": self.description}
        components: dict[str, Any] = {}
        content: dict[str, Any] = {}
        if self.model is not None:
            ref, components = model_schemas(self.model, "serialization")
            content["application/json"] = {"schema": ref}
        for media_type, given in self.content.items():
            if isinstance(given, type):  # a model: its schema, by reference
                ref, needed = model_schemas(given, "serialization")
                merge_components(components, needed, f"response {self.description!r}")
                given = {"schema": ref}
            content[media_type] = given
        if content:
            item["content"] = content
        if self.headers:
            item["headers"] = dict(self.headers)
        if self.links:
            item["links"] = dict(self.links)
        return item, components


@dataclass(frozen=True)
class Route(Generic[B, Q, P]):
    """One HTTP route, declared once (see the module's docstring).

    ``path`` is aiohttp's (``{name}``, or ``{name:regex}``); the document writes it ``{name}``.
    ``body``, ``query`` and ``params`` (the path's variables, named as in ``path``) are pydantic
    models (forbid extra fields to refuse unknown ones); ``headers``, header parameters as OpenAPI
    writes them (what the handler reads of them);
    ``responses`` by status; ``errors`` are statuses described by the core's shared error
    responses (``400``, ``404``, ...). ``error_shape`` (plugins), when given, returns the JSON
    error body of every refusal on this path (another protocol's). ``openapi`` adds or overrides
    operation keys the models do not give (``security``, a ``requestBody`` description, ...)."""

    method: str
    path: str
    summary: str
    operation_id: str | None = None
    description: str | None = None
    tags: tuple[str, ...] = ()
    body: type[B] | None = None
    body_required: bool = True
    query: type[Q] | None = None
    query_descriptions: Mapping[str, str] = field(default_factory=dict)
    params: type[P] | None = None
    headers: tuple[Mapping[str, Any], ...] = ()
    responses: Mapping[int | str, RouteResponse] = field(default_factory=dict)
    errors: tuple[int, ...] = ()
    error_shape: ErrorShape | None = None
    field_path: FieldPath | None = None
    openapi: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", self.method.upper())
        unknown = [status for status in self.errors if status not in ERROR_RESPONSES]
        if unknown:
            raise PluginError(f"route {self.method} {self.path}: no shared error response for {unknown}")

    # -- the handler's half ---------------------------------------------------------------------------
    def parse_body(self, body: Any) -> B:
        """``body`` (parsed JSON) as the declared model, or ``400 invalid_request`` naming the field."""
        if self.body is None:
            raise TypeError(f"route {self.method} {self.path} declares no body")
        return parse_model(self.body, body, field_path=self.field_path)

    async def read_body(self, request: web.Request) -> B:
        """The request's JSON body (``agent_gateway.read_json``'s checks) as the declared model."""
        from agent_gateway.errors import read_json

        return self.parse_body(await read_json(request))

    def parse_query(self, request: web.Request) -> Q:
        """The query string as the declared model; an undeclared parameter is refused (a misspelt
        one must not be silently ignored)."""
        if self.query is None:
            raise TypeError(f"route {self.method} {self.path} declares no query")
        values = dict(request.query) if request.rel_url.raw_query_string else {}
        return parse_model(self.query, values, "the query", self.field_path)

    def parse_path(self, request: web.Request) -> P:
        """The path's variables as the declared model, or ``400`` (the model's refusal)."""
        if self.params is None:
            raise TypeError(f"route {self.method} {self.path} declares no path variables")
        return parse_model(self.params, dict(request.match_info), "the path", self.field_path)

    # -- the document's half --------------------------------------------------------------------------
    @property
    def openapi_path(self) -> str:
        """The path as the document writes it (``{name:regex}`` becomes ``{name}``)."""
        return openapi_path(self.path)

    def _parameters(self, model: type[BaseModel] | None, where: str) -> list[dict[str, Any]]:
        if model is None:
            return []
        schema = json_schema(model)
        required = set(schema.get("required", ()))
        parameters = []
        for name, prop in schema.get("properties", {}).items():
            prop = parameter_schema(prop)
            description = self.query_descriptions.get(name) or prop.pop("description", None)
            parameter: dict[str, Any] = {"name": name, "in": where, "schema": prop}
            if name in required or where == "path":
                parameter["required"] = True
            if description:
                parameter["description"] = description
            parameters.append(parameter)
        return parameters

    def openapi_operation(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The OpenAPI operation object, and the component schemas it refers to by name."""
        components: dict[str, Any] = {}
        operation: dict[str, Any] = {}
        if self.operation_id:
            operation["operationId"] = self.operation_id
        operation["summary"] = self.summary
        if self.description:
            operation["description"] = self.description
        if self.tags:
            operation["tags"] = list(self.tags)
        parameters = [*self._parameters(self.params, "path"), *self._parameters(self.query, "query")]
        parameters += [dict(header) for header in self.headers]
        if parameters:
            operation["parameters"] = parameters
        if self.body is not None:
            ref, needed = model_schemas(self.body)
            merge_components(components, needed, f"route {self.method} {self.path}")
            operation["requestBody"] = {
                "required": self.body_required,
                "content": {"application/json": {"schema": ref}},
            }
        responses: dict[str, Any] = {}
        for status, response in self.responses.items():
            responses[str(status)], needed = response.openapi_response()
            merge_components(components, needed, f"route {self.method} {self.path}")
        for status in self.errors:
            responses[str(status)] = {"$ref": f"#/components/responses/{ERROR_RESPONSES[status]}"}
        operation["responses"] = responses or {"default": {"description": "See the route's documentation."}}
        operation.update(self.openapi)
        return operation, components


def parameter_schema(prop: Mapping[str, Any]) -> dict[str, Any]:
    """A parameter's schema from its model field's: a query parameter is text or absent, never
    null, so an optional field's ``null`` alternative and ``None`` default are left out."""
    out = dict(prop)
    alternatives = out.get("anyOf")
    if isinstance(alternatives, list):
        kept = [item for item in alternatives if item != {"type": "null"}]
        if len(kept) < len(alternatives):
            del out["anyOf"]
            out = {**kept[0], **out} if len(kept) == 1 else {**out, "anyOf": kept}
    if "default" in out and out["default"] is None:
        del out["default"]
    return out


def merge_components(into: dict[str, Any], schemas: Mapping[str, Any], where: str) -> None:
    """Add component schemas to a document's; a different schema under a taken name is an error."""
    for name, schema in schemas.items():
        if name in into and into[name] != schema:
            raise PluginError(f"{where}: the component schema {name!r} is already declared differently")
        into[name] = schema


MAX_MODELS_WALKED = 10_000  # annotations looked at per route: a declaration has a few dozen models


def _models_in(annotation: Any, found: dict[str, type[BaseModel]], where: str, budget: list[int]) -> None:
    """Every model class ``annotation`` reaches (its fields', list items', union members', ...)."""
    budget[0] -= 1
    if budget[0] < 0:
        return
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        taken = found.get(annotation.__name__)
        if taken is annotation:
            return
        if taken is not None:
            raise PluginError(f"{where}: two different models are named {annotation.__name__!r}")
        found[annotation.__name__] = annotation
        for model_field in annotation.model_fields.values():
            _models_in(model_field.annotation, found, where, budget)
        return
    for argument in get_args(annotation):
        _models_in(argument, found, where, budget)


def model_names(route: Route[Any, Any, Any]) -> dict[str, type[BaseModel]]:
    """The component schema names ``route``'s document will use, and the model of each: found
    from the model classes alone, without building a JSON Schema (cheap, at start-up). Two
    different models under one name are a :class:`PluginError`."""
    found: dict[str, type[BaseModel]] = {}
    roots: list[Any] = [route.body, route.query, route.params]
    for response in route.responses.values():
        roots.append(response.model)
        roots.extend(given for given in response.content.values() if isinstance(given, type))
    budget = [MAX_MODELS_WALKED]
    for root in roots:
        if root is not None:
            _models_in(root, found, f"route {route.method} {route.path}", budget)
    return found


def declared_paths(routes: Iterable[Route[Any, Any, Any]]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The OpenAPI path items and component schemas of ``routes``."""
    paths: dict[str, dict[str, Any]] = {}
    components: dict[str, Any] = {}
    for route in routes:
        operation, needed = route.openapi_operation()
        merge_components(components, needed, f"route {route.method} {route.path}")
        paths.setdefault(route.openapi_path, {})[route.method.lower()] = operation
    return paths, components
