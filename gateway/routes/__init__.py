"""HTTP routes of the gateway, versioned under /v1, each API route declared once (agent_gateway.declare): its
handler validates with the declaration, and /openapi.json describes it (agent_gateway.api_document)."""
