"""Fake ACP agents for tests and demos, written with the official ACP Python SDK.

``python contrib/fake_acp_agents/agent.py --behaviour NAME`` runs one on stdio; see
:mod:`contrib.fake_acp_agents.agent` for the behaviours.
"""

from __future__ import annotations

from contrib.fake_acp_agents.agent import BEHAVIOURS, FakeAgent, main

__all__ = ["BEHAVIOURS", "FakeAgent", "main"]
