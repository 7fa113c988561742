"""``python -m contrib.fake_acp_agents --behaviour NAME``."""

from __future__ import annotations

from contrib.fake_acp_agents.agent import main

if __name__ == "__main__":
    main()
