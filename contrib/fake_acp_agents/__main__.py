"""``python contrib/fake_acp_agents/agent.py --behaviour NAME``."""

from __future__ import annotations

from contrib.fake_acp_agents.agent import main

if __name__ == "__main__":
    main()
