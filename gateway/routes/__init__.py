"""HTTP routes of the gateway, versioned under /v1 and described in gateway/openapi.json."""
