"""The server machinery, kept apart from the domain (runs, sessions, tools): a newcomer can skip it.

- :mod:`agent_gateway.server.http_server`: the aiohttp runner and site the launcher serves with
  (connection limits, JSON errors for malformed requests, handing an open stream off aiohttp);
- :mod:`agent_gateway.server.fairness`: requests before bulk work (``yield_slice``, ``WorkSlices``);
- :mod:`agent_gateway.server.allocator`: heap pages given back to the system after runs end;
- :mod:`agent_gateway.server.loop_monitor`: the event loop's lag, measured for ``/metrics``.
"""
