"""Take the console screenshots in docs/ (run by hand: `python contrib/dev/console_screenshots.py`).

Starts a fake OpenAI-compatible upstream and a real `agent-gateway serve` (chat-only plus the fake
ACP agent asking for a permission), drives the console in /usr/bin/chromium and writes
docs/console-conversation.png (Markdown with a table and highlighted code), docs/console-dark.png
(the same in dark mode), docs/console-phone.png (390 px wide), docs/console-permission.png,
docs/console-search.png and docs/console-settings.png.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path

from playwright.async_api import Page, async_playwright, expect

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agent_gateway.testing.fake_openai import FakeOpenAI, Reply  # noqa: E402
from tests._harness import FAKE_ACP_AGENT, start_gateway_process  # noqa: E402

DOCS = ROOT / "docs"
SHOPPING_LIST = """## Shopping list

| item | amount |
|---|---|
| **blue** outdoor paint | 2 L |
| brush, 5 cm | 1 |
| sandpaper, grit 120 | 4 sheets |

Paint needed for a fence of a given length (two coats):

```python
def litres(metres: float, height: float = 1.2, coats: int = 2) -> float:
    return metres * height * coats / 10  # about 10 m² per litre
```

More in [the paint maker's guide](https://example.org/fence).
"""
WAIT_MS = 20_000
expect.set_options(timeout=WAIT_MS)


async def send(page: Page, text: str, agent: str) -> None:
    await page.select_option("#agent", agent)
    await page.fill("#message", text)
    await page.click("#send")


async def main() -> None:
    fake = FakeOpenAI(
        [
            Reply(
                reasoning="The user asks about the fence. Blue weathers well; two coats are needed.",
                text="Paint the fence blue: two coats, a day apart. Shall I write the shopping list?",
            ),
            SHOPPING_LIST,
            "Tomatoes need 6–8 hours of sun and deep, infrequent watering.",
        ]
    )
    await fake.start()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "gateway.toml"
        command = json.dumps([sys.executable, FAKE_ACP_AGENT, "--behaviour", "permission"])
        config.write_text(f"[acp_agents.fake]\ncommand = {command}\n", encoding="utf-8")
        env = {"AGENT_GATEWAY__CHAT_ONLY__BASE_URL": fake.base_url, "AGENT_GATEWAY__CHAT_ONLY__MODEL": "m"}
        gateway = await start_gateway_process(
            Path(tmp) / "data", Path(tmp) / "gateway.log", env=env, args=["--config", str(config)]
        )
        try:
            async with async_playwright() as playwright:
                browser = await playwright.chromium.launch(executable_path="/usr/bin/chromium", headless=True)
                page = await browser.new_page(viewport={"width": 1280, "height": 860})
                page.set_default_timeout(WAIT_MS)
                await page.goto(gateway.url + "/")
                await expect(page.locator("body[data-ready=true]")).to_have_count(1)
                await send(page, "How should I paint the garden fence?", "chat-only")
                await expect(page.locator("#h-status")).to_have_attribute("data-status", "completed")
                await send(page, "Yes, please.", "chat-only")
                await expect(page.locator(".bubble.assistant").nth(1)).to_contain_text("Shopping list")
                await page.locator("details.thoughts summary").first.click()
                await expect(page.locator("details.thoughts[open]")).to_have_count(1)
                await page.locator(".codeblock").scroll_into_view_if_needed()
                await page.screenshot(path=str(DOCS / "console-conversation.png"))
                await page.emulate_media(color_scheme="dark")
                await page.screenshot(path=str(DOCS / "console-dark.png"))
                await page.emulate_media(color_scheme="light")

                phone = await browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=1)
                phone.set_default_timeout(WAIT_MS)
                await phone.goto(page.url)
                await expect(phone.locator(".codeblock")).to_have_count(1)
                await phone.locator(".codeblock").scroll_into_view_if_needed()
                await phone.screenshot(path=str(DOCS / "console-phone.png"))
                await phone.close()

                await page.click("#new-chat")
                await send(page, "Write notes/todo.md", "fake")
                await expect(page.locator(".card.permission button").first).to_be_visible()
                await page.screenshot(path=str(DOCS / "console-permission.png"))
                await page.locator(".card.permission button").first.click()
                await expect(page.locator("#h-status")).to_have_attribute("data-status", "completed")

                await page.click("#new-chat")
                await send(page, "When do tomatoes need water?", "chat-only")
                await expect(page.locator("#h-status")).to_have_attribute("data-status", "completed")
                await page.fill("#search", "fence")
                await expect(page.locator("#sessions .session")).to_have_count(1)
                await page.locator("#sessions .session").first.click()
                await expect(page.locator(".bubble.user").first).to_contain_text("fence")
                await page.screenshot(path=str(DOCS / "console-search.png"))

                await page.fill("#search", "")
                await page.click("#settings summary")
                await expect(page.locator("#settings-form label").first).to_be_visible()
                await page.screenshot(path=str(DOCS / "console-settings.png"))
                await browser.close()
        finally:
            await gateway.stop()
            await fake.stop()


if __name__ == "__main__":
    asyncio.run(main())
