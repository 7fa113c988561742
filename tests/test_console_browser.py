"""The web console in a real browser: Playwright for Python driving the system Chromium
(`/usr/bin/chromium`, Debian package `chromium`; the test command installs it).

Each test starts a real `agent-gateway serve` process (chat-only on the scriptable fake upstream,
the fake ACP agent through an `[acp_agents.fake]` table) and opens its console at `/`. Every wait
is Playwright's auto-wait / `expect` with a bounded timeout, never a sleep.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from agent_gateway import Turn, TurnOutcome, hookimpl
from agent_gateway.runtime import RuntimePolicy
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._auth import AUDIENCE, ISSUER, claims, public_pem, rsa_key, sign
from tests._harness import FAKE_ACP_AGENT, GatewayProcess, start_gateway_process

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
WAIT_MS = 30_000
expect.set_options(timeout=WAIT_MS)  # every expect below waits at most this long
CHROMIUM_INSTALLED = Path(CHROMIUM).exists()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    assert CHROMIUM_INSTALLED, f"{CHROMIUM} is missing: install the Debian package chromium (test-all.sh does)"
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def start_gateway(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """start(upstream=..., acp=[...behaviour args], port=...) -> GatewayProcess; the same data
    directory each time, so a second start is a restart."""
    started: list[GatewayProcess] = []

    async def start(
        upstream: str = "", acp: Sequence[str] = (), port: int = 0, toml: str = "", acp_table: str = ""
    ) -> GatewayProcess:
        config = tmp_path / "gateway.toml"
        if acp:
            command = json.dumps([sys.executable, FAKE_ACP_AGENT, *acp])
            toml += f"\n[acp_agents.fake]\ncommand = {command}\n{acp_table}"
        config.write_text(toml, encoding="utf-8")
        env = {"AGENT_GATEWAY__CHAT_ONLY__BASE_URL": upstream or "http://127.0.0.1:9/v1"}
        env["AGENT_GATEWAY__CHAT_ONLY__MODEL"] = "m"
        args = ["--config", str(config), *(["--port", str(port)] if port else [])]
        gateway = await start_gateway_process(
            tmp_path / "data", tmp_path / f"gateway-{len(started)}.log", env=env, args=args
        )
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        with contextlib.suppress(ProcessLookupError):
            await gateway.stop()


DESKTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}


async def open_console(browser: Browser, url: str, viewport: dict[str, int] = DESKTOP, **options: Any) -> Page:
    page = await browser.new_page(viewport=viewport, **options)  # type: ignore[arg-type]
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.set_default_timeout(WAIT_MS)
    await page.goto(url + "/")
    await expect(page.locator("body[data-ready=true]")).to_have_count(1)
    assert errors == []
    return page


async def send(page: Page, text: str, agent: str = "chat-only") -> None:
    await page.select_option("#agent", agent)
    await page.fill("#message", text)
    await page.click("#send")


async def api(url: str, method: str, path: str, body: Any = None, token: str = "") -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        async with http.request(method, url + path, json=body, headers=headers) as response:
            assert response.status < 300, await response.text()
            return await response.json()


async def test_the_second_turn_only_says_yes_and_the_answer_uses_the_first(
    browser: Browser, fake_llm: FakeOpenAI, start_gateway: Any
) -> None:
    fake_llm.add("Shall I paint the fence blue?")
    fake_llm.default = lambda body: (
        "Painting the fence blue now."
        if any("fence" in str(m.get("content")) for m in body["messages"])
        else "I do not know what you mean."
    )
    gateway = await start_gateway(fake_llm.base_url)
    page = await open_console(browser, gateway.url)
    await send(page, "The fence looks dull.")
    await expect(page.locator(".bubble.assistant").nth(0)).to_have_text("Shall I paint the fence blue?")
    await expect(page.locator("#h-status")).to_have_attribute("data-status", "completed")
    await send(page, "可以")
    await expect(page.locator(".bubble.assistant").nth(1)).to_have_text("Painting the fence blue now.")
    second = fake_llm.requests[1]["messages"]
    contents = [str(m.get("content")) for m in second]
    assert "The fence looks dull." in " ".join(contents)
    assert "Shall I paint the fence blue?" in " ".join(contents)
    assert contents[-1] == "可以"
    await expect(page.locator(".bubble.user")).to_have_text(["The fence looks dull.", "可以"])
    await expect(page.locator("#h-busy")).to_be_hidden()


async def test_3000_thought_deltas_then_the_end_clear_the_busy_state(
    browser: Browser, fake_llm: FakeOpenAI, start_gateway: Any
) -> None:
    thoughts = "".join(chr(ord("a") + i % 26) for i in range(3000))
    fake_llm.default = Reply(reasoning=thoughts, text="All thought through.", chunk_size=1)
    gateway = await start_gateway(fake_llm.base_url)
    page = await open_console(browser, gateway.url)
    await send(page, "think hard")
    # 3,000 one-character frames go through the upstream, the journal, the stream and the page:
    # on a loaded 2-core machine that alone can take longer than one ordinary wait.
    await expect(page.locator(".bubble.assistant")).to_have_text("All thought through.", timeout=4 * WAIT_MS)
    await expect(page.locator("#h-status")).to_have_attribute("data-status", "completed")
    await expect(page.locator("#h-busy")).to_be_hidden()
    await expect(page.locator("#cancel")).to_be_hidden()
    # Thoughts are folded, never in the answer, and none was lost.
    await expect(page.locator("details.thoughts")).not_to_have_attribute("open", "")
    await expect(page.locator("details.thoughts pre")).to_have_text(thoughts)
    run_id = await page.locator("article.run").get_attribute("data-host-run-id")
    receipt = await api(gateway.url, "GET", f"/v1/runs/{run_id}")
    assert receipt["status"] == "completed"


async def test_a_load_with_replay_after_a_restart_shows_no_duplicated_bubbles(
    browser: Browser, tmp_path: Path, start_gateway: Any
) -> None:
    state = tmp_path / "agent-state"
    agent = ["--behaviour", "replay", "--state-dir", str(state)]
    # the agent keeps its sessions there: a folder it may write from its sandbox
    writable = f'sandbox_writable = ["{state}"]\n'
    first = await start_gateway(acp=agent, acp_table=writable)
    page = await open_console(browser, first.url)
    await send(page, "first question", agent="fake")
    await expect(page.locator(".bubble.assistant")).to_have_text(["echo: first question"])
    await expect(page.locator("#h-status")).to_have_attribute("data-status", "completed")
    session_url = page.url
    await first.stop()
    second = await start_gateway(acp=agent, acp_table=writable)
    await page.goto(second.url + "/" + session_url.split("/", 3)[3])
    await expect(page.locator(".bubble.assistant")).to_have_text(["echo: first question"])
    await send(page, "second question", agent="fake")
    await expect(page.locator("#h-mode")).to_have_text("loaded")
    await expect(page.locator("#h-status")).to_have_attribute("data-status", "completed")
    await expect(page.locator(".bubble.user")).to_have_text(["first question", "second question"])
    await expect(page.locator(".bubble.assistant")).to_have_text(["echo: first question", "echo: second question"])
    await page.reload()
    await expect(page.locator(".bubble.assistant")).to_have_text(["echo: first question", "echo: second question"])
    await expect(page.locator("#h-mode")).to_have_text("loaded")


async def test_a_permission_is_answered_from_the_page(browser: Browser, start_gateway: Any) -> None:
    gateway = await start_gateway(acp=["--behaviour", "permission"])
    page = await open_console(browser, gateway.url)
    await send(page, "write the file", agent="fake")
    card = page.locator(".card.permission")
    await expect(page.locator("#h-status")).to_have_attribute("data-status", "awaiting_permission")
    await card.get_by_role("button", name="allow", exact=False).first.click()
    await expect(card.locator(".decision")).to_contain_text("allow_once")
    await expect(page.locator(".bubble.assistant")).to_have_text("permission: allow_once")
    await expect(page.locator(".card.tool")).to_have_count(1)
    await expect(page.locator("#h-status")).to_have_attribute("data-status", "completed")


async def test_sessions_list_detail_search_export_rename_delete(
    browser: Browser, fake_llm: FakeOpenAI, start_gateway: Any
) -> None:
    fake_llm.default = lambda body: f"About {body['messages'][-1]['content']}."
    gateway = await start_gateway(fake_llm.base_url)
    page = await open_console(browser, gateway.url)
    await send(page, "giraffes in the savanna")
    await expect(page.locator(".bubble.assistant")).to_have_text("About giraffes in the savanna.")
    await page.click("#new-chat")
    await send(page, "penguins on the ice")
    await expect(page.locator(".bubble.assistant")).to_have_text("About penguins on the ice.")
    sessions = page.locator("#sessions .session")
    await expect(sessions).to_have_count(2)
    # search with snippets
    await page.fill("#search", "giraff")
    await expect(sessions).to_have_count(1)
    await expect(sessions.locator(".snippet mark").first).to_contain_text("giraff", ignore_case=True)
    # detail
    await sessions.first.click()
    await expect(page.locator(".bubble.user")).to_have_text(["giraffes in the savanna"])
    session_id = await page.locator("#h-session").text_content()
    # export (a download of the JSON export)
    async with page.expect_download() as download_info:
        await page.click("#export-json")
    saved = await (await download_info.value).path()
    exported = json.loads(saved.read_bytes())
    assert exported["session"]["sessionId"] == session_id
    assert exported["runs"][0]["transcript"]["answer"]["text"] == "About giraffes in the savanna."
    # rename
    page.once("dialog", lambda dialog: dialog.accept("Tall animals"))
    await page.click("#rename")
    await page.fill("#search", "")
    await expect(sessions.filter(has_text="Tall animals")).to_have_count(1)
    # delete
    page.once("dialog", lambda dialog: dialog.accept())
    await page.click("#delete")
    await expect(sessions).to_have_count(1)
    await expect(sessions.first).to_contain_text("penguins on the ice")
    listed = await api(gateway.url, "GET", "/v1/sessions")
    assert [s["title"] for s in listed["sessions"]] == ["penguins on the ice"]


async def test_a_reload_mid_stream_loses_and_doubles_no_text(
    browser: Browser, fake_llm: FakeOpenAI, start_gateway: Any
) -> None:
    answer = " ".join(f"w{i}" for i in range(400))
    fake_llm.default = Reply(text=answer, chunk_size=4, delay=0.02)  # ~10 s of streaming: reloaded long before the end
    gateway = await start_gateway(fake_llm.base_url)
    page = await open_console(browser, gateway.url)
    await send(page, "count")
    await expect(page.locator("#h-busy")).to_be_visible()
    await expect(page.locator(".bubble.assistant")).to_contain_text("w20 ")
    await page.reload()
    await expect(page.locator("body[data-ready=true]")).to_have_count(1)
    await expect(page.locator("#h-busy")).to_be_visible()  # found the active run and follows it
    await expect(page.locator("#h-status")).to_have_attribute("data-status", "completed")
    await expect(page.locator(".bubble.assistant")).to_have_text(answer)
    await expect(page.locator("#h-busy")).to_be_hidden()
    await expect(page.locator("article.run")).to_have_count(1)


async def test_the_gateway_killed_and_restarted_under_an_open_page(
    browser: Browser, fake_llm: FakeOpenAI, start_gateway: Any
) -> None:
    fake_llm.add(Reply(text="never finished", hang=True))
    fake_llm.default = "Back in business."
    port = free_port()
    first = await start_gateway(fake_llm.base_url, port=port)
    page = await open_console(browser, first.url)
    await send(page, "start something long")
    await expect(page.locator("#h-busy")).to_be_visible()
    first.kill()
    assert await first.wait() != 0
    await expect(page.locator("#h-conn")).to_be_visible()  # the page knows it lost the stream
    second = await start_gateway(fake_llm.base_url, port=port)
    assert second.url == first.url
    await expect(page.locator("#h-status")).to_have_attribute("data-status", "interrupted")
    await expect(page.locator(".run-status")).to_contain_text("Interrupted")
    await expect(page.locator("#h-busy")).to_be_hidden()
    await expect(page.locator("#h-conn")).to_be_hidden()
    await send(page, "and now?")
    await expect(page.locator(".bubble.assistant").nth(1)).to_have_text("Back in business.")
    await expect(page.locator("#h-status")).to_have_attribute("data-status", "completed")


async def test_the_settings_form_comes_from_the_descriptor_and_saves_preferences(
    browser: Browser, fake_llm: FakeOpenAI, start_gateway: Any
) -> None:
    gateway = await start_gateway(fake_llm.base_url)
    page = await open_console(browser, gateway.url)
    descriptor = await api(gateway.url, "GET", "/v1/agents/chat-only")
    await page.click("#settings summary")
    inputs = page.locator("#settings-form [data-key]")
    await expect(inputs).to_have_count(len(descriptor["fields"]))
    await page.fill("[data-key='ai.agent.chat-only.model']", "bigger-model")
    await page.click("#settings-save")
    await expect(page.locator("#settings-note")).to_have_text("saved")
    saved = await api(gateway.url, "GET", "/v1/preferences")
    assert saved["values"] == {"ai.agent.chat-only.model": "bigger-model"}  # only what changed
    await send(page, "which model?")
    await expect(page.locator("#h-status")).to_have_attribute("data-status", "completed")
    assert fake_llm.requests[-1]["model"] == "bigger-model"


async def test_a_gateway_with_tokens_prompts_for_one(
    browser: Browser, fake_llm: FakeOpenAI, start_gateway: Any
) -> None:
    gateway = await start_gateway(fake_llm.base_url, toml='[auth]\ntokens = {"tok-alice-0123456789abcdef" = "alice"}\n')
    page = await browser.new_page()
    page.set_default_timeout(WAIT_MS)
    await page.goto(gateway.url + "/")  # the page itself is public
    dialog = page.locator("#token-dialog")
    await expect(dialog).to_be_visible()
    await page.fill("#token", "wrong")
    await page.click("#token-ok")
    await expect(page.locator("#token-error")).to_have_text("That token was not accepted.")
    await page.fill("#token", "tok-alice-0123456789abcdef")
    await page.click("#token-ok")
    await expect(page.locator("body[data-ready=true]")).to_have_count(1)
    await send(page, "hello with a token")
    await expect(page.locator(".bubble.assistant")).to_have_text("echo: hello with a token")
    listed = await api(gateway.url, "GET", "/v1/sessions", token="tok-alice-0123456789abcdef")
    assert [s["title"] for s in listed["sessions"]] == ["hello with a token"]
    await page.reload()  # the token is kept for the tab (sessionStorage): no second prompt
    await expect(page.locator("body[data-ready=true]")).to_have_count(1)
    await expect(dialog).to_be_hidden()


async def test_the_console_takes_a_jwt_bearer(
    browser: Browser, fake_llm: FakeOpenAI, start_gateway: Any, tmp_path: Path
) -> None:
    """[auth_jwt] with the public key of a key made here: the console's token prompt takes a JWT
    (what an application's login hands its user), and a token of another issuer is refused."""
    key = rsa_key()
    (tmp_path / "public.pem").write_bytes(public_pem(key))
    toml = (
        f'[auth_jwt]\nenabled = true\nissuer = "{ISSUER}"\naudience = "{AUDIENCE}"\n'
        f'key_file = "{tmp_path / "public.pem"}"\nalgorithms = ["RS256"]\n'
    )
    gateway = await start_gateway(fake_llm.base_url, toml=toml)
    token = sign(key, None, **claims("ada"))
    page = await browser.new_page()
    page.set_default_timeout(WAIT_MS)
    await page.goto(gateway.url + "/")
    await expect(page.locator("#token-dialog")).to_be_visible()
    await page.fill("#token", sign(key, None, **{**claims("ada"), "iss": "https://elsewhere.test/"}))
    await page.click("#token-ok")
    await expect(page.locator("#token-error")).to_have_text("That token was not accepted.")
    await page.fill("#token", token)
    await page.click("#token-ok")
    await expect(page.locator("body[data-ready=true]")).to_have_count(1)
    await send(page, "hello with a jwt")
    await expect(page.locator(".bubble.assistant")).to_have_text("echo: hello with a jwt")
    listed = await api(gateway.url, "GET", "/v1/sessions", token=token)
    assert [s["title"] for s in listed["sessions"]] == ["hello with a jwt"]  # ada's own sessions


class ShowcaseRuntime:
    """One turn with every part of the transcript: a plan, a tool card with a receipt and a
    citation, a files.changed notice, thoughts and an answer."""

    agent_id = "showcase"
    display_name = "Showcase (tests)"
    provider = "tests"

    def __init__(self) -> None:
        self.policy = RuntimePolicy(context_carrier="none")

    def describe(self) -> dict[str, Any]:
        return {"capabilities": []}

    async def run_turn(self, turn: Turn) -> TurnOutcome:
        await turn.set_session_mode("new_session", {"agentSessionId": "agent-sess-7"})
        await turn.emit(
            "plan.updated",
            {
                "entries": [
                    {"content": "Read the guide", "status": "completed"},
                    {"content": "Write the notes", "status": "pending"},
                ]
            },
        )
        await turn.emit("thought.delta", {"text": "The guide is the best source."})
        await turn.emit(
            "tool.started", {"toolCallId": "call-1", "title": "Search the knowledge base", "kind": "search"}
        )
        await turn.emit(
            "tool.completed",
            {
                "toolCallId": "call-1",
                "status": "completed",
                "receiptId": "rcpt-42",
                "rawOutput": {
                    "citationMarkdown": "[Fence guide](https://example.org/fence)",
                    "citationUrl": "https://example.org/fence",
                    "title": "Fence guide",
                },
            },
        )
        await turn.emit("files.changed", {"changes": [{"path": "notes/fence.md", "kind": "modified"}]})
        await turn.emit("message.delta", {"text": "Two coats, "})
        await turn.emit("message.delta", {"text": "a day apart."})
        return TurnOutcome("completed", None)

    async def close(self) -> None:
        pass


class ShowcasePlugin:
    @hookimpl
    def register_runtimes(self, register: Any, config: Any) -> None:
        register(ShowcaseRuntime())


async def test_the_transcript_parts_render_on_both_backends(
    browser: Browser, make_gateway: Any, storage_kind: str
) -> None:
    client = await make_gateway(storage=storage_kind, extra_plugins=(ShowcasePlugin(),))
    url = str(client.make_url("")).rstrip("/")
    page = await open_console(browser, url)
    await send(page, "How do I paint the fence?", agent="showcase")
    await expect(page.locator("#h-status")).to_have_attribute("data-status", "completed")
    await expect(page.locator(".bubble.assistant")).to_have_text("Two coats, a day apart.")
    await expect(page.locator("details.thoughts")).to_contain_text("Thoughts (1 chunk)")
    await expect(page.locator(".card.plan li")).to_have_text(["Read the guide", "Write the notes"])
    tool = page.locator(".card.tool")
    await expect(tool).to_contain_text("Search the knowledge base")
    await expect(tool.locator(".receipt")).to_have_text("receipt rcpt-42")
    await expect(page.locator(".citations a")).to_have_attribute("href", "https://example.org/fence")
    await expect(page.locator(".citations a")).to_have_text("Fence guide")
    await expect(page.locator(".files-changed")).to_have_text("File modified: notes/fence.md")
    await expect(page.locator("#h-mode")).to_have_text("new_session")
    await expect(page.locator("#h-agent-session")).to_have_text("agent-sess-7")
    await expect(page.locator("#h-runtime")).to_have_text("Showcase (tests) (showcase)")
    # the same view from the stored history (the session detail), after a reload
    await page.reload()
    await expect(page.locator("body[data-ready=true]")).to_have_count(1)
    await expect(page.locator(".bubble.assistant")).to_have_text("Two coats, a day apart.")
    await expect(page.locator(".card.tool .receipt")).to_have_text("receipt rcpt-42")
    await expect(page.locator(".files-changed")).to_have_count(1)
    await page.fill("#search", "fence")
    await expect(page.locator("#sessions .session .snippet mark").first).to_be_visible()


async def test_an_unavailable_agent_is_shown_disabled_with_its_reason(
    browser: Browser, fake_llm: FakeOpenAI, start_gateway: Any
) -> None:
    gateway = await start_gateway(fake_llm.base_url, toml='[reasonix]\ncommand = ["no-such-binary-xyz", "acp"]\n')
    page = await open_console(browser, gateway.url)
    option = page.locator("#agent option[value='reasonix']")
    await expect(option).to_be_disabled()
    await expect(option).to_have_attribute("title", re.compile(r"npm install -g reasonix"))
    await expect(option).to_contain_text("unavailable: no-such-binary-xyz not found")
    await expect(page.locator("#agent option[value='chat-only']")).to_be_enabled()
    assert await page.locator("#agent").input_value() != "reasonix"


MARKDOWN_ANSWER = """# Fence plan

Use **two coats** of paint:

- sand the boards
- paint a day apart

| coat | colour |
|---|---|
| first | primer |
| second | blue |

```python
def coats(days: int) -> str:
    return "blue" * days
```

Read [the guide](https://example.org/fence).
"""
CODE = 'def coats(days: int) -> str:\n    return "blue" * days'
# Markdown an agent might be tricked into writing: every part must render inert.
XSS_ANSWER = """Careful <img src=x onerror="window.__xss = 1; alert(1)"> here.

[click me](javascript:window.__xss=2) and [data](data:text/html,<script>alert(3)</script>)

<script>window.__xss = 4</script>

<a href="https://example.org/" onclick="window.__xss = 5">a link</a>
<iframe src="javascript:window.__xss=6"></iframe>
<textarea id="message">not the composer</textarea>
<form action="https://evil.test/"><button>send</button></form>
"""


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
async def test_markdown_renders_with_highlighted_code_and_copy_buttons_and_xss_stays_inert(
    browser: Browser, fake_llm: FakeOpenAI, start_gateway: Any, viewport: dict[str, int]
) -> None:
    fake_llm.add(MARKDOWN_ANSWER)
    fake_llm.add(XSS_ANSWER)
    gateway = await start_gateway(fake_llm.base_url)
    page = await open_console(browser, gateway.url, viewport, permissions=["clipboard-read", "clipboard-write"])
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    phone = viewport is PHONE
    if phone:  # the sidebar starts folded away; the conversation keeps the width
        await expect(page.locator("#sidebar")).to_be_hidden()
        box = await page.locator("#conversation").bounding_box()
        assert box is not None and box["width"] >= 300
    await send(page, "How do I paint the fence?")
    answer = page.locator(".bubble.assistant").nth(0)
    await expect(answer.locator("h1")).to_have_text("Fence plan")
    await expect(answer.locator("strong")).to_have_text("two coats")
    await expect(answer.locator("ul li")).to_have_text(["sand the boards", "paint a day apart"])
    await expect(answer.locator("table th")).to_have_text(["coat", "colour"])
    await expect(answer.locator("table td")).to_have_text(["first", "primer", "second", "blue"])
    code = answer.locator(".codeblock pre code")
    await expect(code).to_have_text(CODE)
    await expect(code).to_have_class(re.compile(r"language-python"))
    await expect(code.locator(".hljs-keyword").first).to_have_text("def")
    await expect(answer.locator(".codeblock .lang")).to_have_text("python")
    link = answer.locator("a", has_text="the guide")
    await expect(link).to_have_attribute("href", "https://example.org/fence")
    await expect(link).to_have_attribute("target", "_blank")
    await expect(link).to_have_attribute("rel", "noopener noreferrer")
    # the code block's copy button copies the code; the message's, the answer as written
    await answer.locator(".codeblock .copy").click()
    await expect(answer.locator(".codeblock .copy")).to_have_text("Copied")
    assert await page.evaluate("navigator.clipboard.readText()") == CODE
    await page.locator("article.run").nth(0).locator(".msg-actions .copy").last.click()
    assert await page.evaluate("navigator.clipboard.readText()") == MARKDOWN_ANSWER
    if phone:
        # with a table and a code block in it, the message area keeps its width and the page scrolls
        # only vertically (wide content scrolls inside its own block)
        box = await page.locator("#conversation").bounding_box()
        assert box is not None and box["width"] >= 300
        assert await page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
        # the sidebar opens over the conversation and folds away when a session is chosen
        await page.click("#toggle-sidebar")
        await expect(page.locator("#sidebar")).to_be_visible()
        await expect(page.locator("#sessions .session")).to_have_count(1)
        await page.locator("#sessions .session .title").click()
        await expect(page.locator("#sidebar")).to_be_hidden()

    await send(page, "and the risky bits?")
    evil = page.locator(".bubble.assistant").nth(1)
    await expect(evil).to_contain_text("a link")
    await expect(page.locator("#h-status")).to_have_attribute("data-status", "completed")
    # the nodes are gone or defused: no script, frame, form control, handler, id or javascript: URL
    for selector in ("script", "iframe", "textarea", "form", "button:not(.copy)", "[onerror]", "[onclick]", "[id]"):
        await expect(evil.locator(selector)).to_have_count(0)
    hrefs = await evil.locator("a").evaluate_all("links => links.map(a => a.getAttribute('href'))")
    assert hrefs == [None, None, "https://example.org/"]
    await expect(evil.locator("a", has_text="click me")).not_to_have_attribute("href", re.compile("."))
    # the image failed to load (its error event has fired) and nothing ran
    await page.wait_for_function(
        "document.querySelectorAll('.bubble.assistant img').length === 1"
        " && document.querySelector('.bubble.assistant img').complete"
    )
    await evil.locator("a", has_text="click me").click()
    assert await page.evaluate("window.__xss") is None
    assert dialogs == []
    # the composer is still the page's own
    await page.fill("#message", "still mine")
    assert await page.locator("#message").input_value() == "still mine"
    assert await page.evaluate("document.getElementById('message').closest('#composer') !== null")


async def test_dark_mode_follows_the_system_setting(browser: Browser, fake_llm: FakeOpenAI, start_gateway: Any) -> None:
    gateway = await start_gateway(fake_llm.base_url)
    page = await open_console(browser, gateway.url, color_scheme="light")
    background = "getComputedStyle(document.body).backgroundColor"
    light = await page.evaluate(background)
    await page.emulate_media(color_scheme="dark")
    await page.wait_for_function(f"{background} !== {json.dumps(light)}")
    dark = await page.evaluate(background)
    assert light == "rgb(246, 247, 249)" and dark == "rgb(15, 18, 22)"


async def test_regenerate_and_edit_make_new_runs_and_the_transcript_keeps_both(
    browser: Browser, fake_llm: FakeOpenAI, start_gateway: Any
) -> None:
    answers = iter(["Blue.", "Green.", "Red, of course."])
    fake_llm.default = lambda body: next(answers)
    gateway = await start_gateway(fake_llm.base_url)
    page = await open_console(browser, gateway.url)
    # nothing to act on yet: the session's actions are off
    for button in ("#pin", "#rename", "#export-json", "#export-md", "#delete"):
        await expect(page.locator(button)).to_be_disabled()
    await expect(page.locator("#cancel")).to_be_hidden()
    await send(page, "Name a colour")
    runs = page.locator("article.run")
    await expect(runs.nth(0).locator(".bubble.assistant")).to_have_text("Blue.")
    await expect(page.locator("#delete")).to_be_enabled()
    await runs.nth(0).locator(".regenerate").click()
    await expect(runs).to_have_count(2)
    await expect(runs.nth(1)).to_have_attribute("data-origin", "regenerated")
    await expect(runs.nth(1).locator(".bubble.assistant")).to_have_text("Green.")
    await expect(page.locator(".bubble.assistant")).to_have_text(["Blue.", "Green."])
    await expect(page.locator(".bubble.user")).to_have_text(["Name a colour", "Name a colour"])
    # edit the first question: a third run, the edited text reaches the agent
    await runs.nth(0).locator(".edit").click()
    await expect(page.locator("#editing")).to_be_visible()
    await expect(page.locator("#message")).to_have_value("Name a colour")
    await page.fill("#message", "Name a warm colour")
    await page.click("#send")
    await expect(runs).to_have_count(3)
    await expect(runs.nth(2)).to_have_attribute("data-origin", "edited")
    await expect(runs.nth(2).locator(".bubble.assistant")).to_have_text("Red, of course.")
    await expect(page.locator("#editing")).to_be_hidden()
    assert fake_llm.requests[-1]["messages"][-1]["content"] == "Name a warm colour"
    ids = [await runs.nth(i).get_attribute("data-host-run-id") for i in range(3)]
    receipts = [await api(gateway.url, "GET", f"/v1/runs/{run_id}") for run_id in ids]
    assert [r["parentRunId"] for r in receipts] == [None, ids[0], ids[0]]
    # the same from the stored history
    await page.reload()
    await expect(page.locator(".bubble.assistant")).to_have_text(["Blue.", "Green.", "Red, of course."])
    await expect(runs.nth(1)).to_have_attribute("data-origin", "regenerated")
    await expect(runs.nth(2)).to_have_attribute("data-origin", "edited")


async def test_each_run_keeps_its_status_hash_navigation_grouping_and_pinning(
    browser: Browser, fake_llm: FakeOpenAI, start_gateway: Any
) -> None:
    slow = " ".join(f"w{i}" for i in range(120))
    fake_llm.add(Reply(text=slow, chunk_size=4, delay=0.02))
    fake_llm.default = lambda body: f"About {body['messages'][-1]['content']}."
    gateway = await start_gateway(fake_llm.base_url)
    page = await open_console(browser, gateway.url)
    await send(page, "count slowly")
    await expect(page.locator("#h-busy")).to_be_visible()
    await send(page, "then this")  # sent while the first run is still streaming
    runs = page.locator("article.run")
    await expect(runs).to_have_count(2)
    await expect(runs.nth(1).locator(".bubble.assistant")).to_have_text("About then this.")
    # the first run followed its own stream to its end, without a reload
    await expect(runs.nth(0).locator(".run-status")).to_have_text("Completed")
    await expect(runs.nth(0)).to_have_attribute("data-status", "completed")
    await expect(runs.nth(0).locator(".bubble.assistant")).to_have_text(slow)
    first_session = await page.locator("#h-session").text_content()
    await page.click("#new-chat")
    await send(page, "penguins")
    await expect(page.locator(".bubble.assistant")).to_have_text("About penguins.")
    second_url = page.url
    # #session= navigation: changing only the hash shows that session; Back returns
    await page.evaluate(f"location.hash = 'session=' + encodeURIComponent({json.dumps(first_session)})")
    await expect(page.locator(".bubble.user")).to_have_text(["count slowly", "then this"])
    await expect(page.locator("#h-session")).to_have_text(first_session or "")
    await page.go_back()
    await expect(page.locator(".bubble.user")).to_have_text(["penguins"])
    assert page.url == second_url
    # grouped by day; a pinned session goes to the top, stored by the gateway
    sessions = page.locator("#sessions .session")
    await expect(sessions).to_have_count(2)
    await expect(page.locator("#sessions h3")).to_have_text(["Today"])
    await page.locator(f"#sessions .session[data-session-id='{first_session}'] .pin-toggle").click()
    await expect(page.locator("#sessions h3")).to_have_text(["Pinned", "Today"])
    await expect(page.locator("#sessions [data-group='Pinned'] .session")).to_have_attribute(
        "data-session-id", first_session or ""
    )
    listed = await api(gateway.url, "GET", "/v1/sessions")
    assert {s["sessionId"]: s["pinned"] for s in listed["sessions"]}[first_session] is True
    # the header's Pin acts on the open session
    await page.click("#pin")
    await expect(page.locator("#pin")).to_have_text("Unpin")
    await expect(page.locator("#sessions [data-group='Pinned'] .session")).to_have_count(2)
    # ids sit behind the Details control
    await expect(page.locator("#h-session")).to_be_hidden()
    await page.click("#h-details summary")
    await expect(page.locator("#h-session")).to_be_visible()
