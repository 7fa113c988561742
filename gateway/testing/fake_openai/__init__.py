"""A scriptable fake OpenAI-compatible server for tests and demos."""

from agent_gateway.testing.fake_openai.server import FakeOpenAI, Reply, load_script

__all__ = ["FakeOpenAI", "Reply", "load_script"]
