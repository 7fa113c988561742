"""Agent Gateway: a small aiohttp core between host applications and agent runtimes."""

__version__ = "0.1.0"
