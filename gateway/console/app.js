// Agent Gateway console: a client of the public /v1 API only (no build step; the Markdown,
// sanitizing and highlighting libraries are ES modules shipped in ./vendor, see its README).
//
// A conversation is the session detail (GET /v1/sessions/{id}: one transcript per run) kept
// current by each active run's `?projection=transcript` stream: each patch's ops are applied with
// the same rules as gateway/transcript.py apply_op. A run's transcript remembers the last seq it
// holds (`lastSeq`), so a reload or a dropped stream resumes after it (Last-Event-ID): no gap, no
// duplicated text.

import { Marked } from "./vendor/marked/marked.esm.js";
import DOMPurify from "./vendor/dompurify/purify.es.mjs";
import hljs from "./vendor/highlight.js/highlight.min.js";

const TERMINAL = new Set(["completed", "failed", "cancelled", "interrupted"]);
const TOKEN_KEY = "agent-gateway.token";
const RECONNECT_MAX_TRIES = 300; // about ten minutes of retries (2 s apart at most), then it stops
const RECONNECT_DELAY_MS = [250, 500, 1000, 1000, 2000];

const $ = (id) => document.getElementById(id);
const el = (tag, props = {}, ...children) => {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== undefined && value !== null) node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined && child !== false) node.append(child);
  }
  return node;
};

const state = {
  agents: [],
  agentId: null,
  sessionId: null,
  detail: null, // the session detail: {session, binding, runs: [{receipt, transcript}]}
  follows: new Map(), // hostRunId -> {hostRunId, controller}: every active run's own stream
  connected: true,
  searchSeq: 0,
  openSeq: 0,
  editOf: null, // the run whose question is being edited in the composer
};

const STATUS_LABELS = {
  idle: "Idle", pending: "Starting", queued: "Queued", running: "Running",
  awaiting_permission: "Waiting for your permission", completed: "Completed", failed: "Failed",
  cancelled: "Cancelled", interrupted: "Interrupted",
};
const statusLabel = (status) => STATUS_LABELS[status] || status;

// -- Markdown: marked (CommonMark + GFM tables) -> DOMPurify (every node) -> the page -------------

const escapeHtml = (text) =>
  text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

const markdown = new Marked({
  gfm: true,
  renderer: {
    // Highlighted here, as HTML text, so the code goes through DOMPurify with everything else.
    code({ text, lang }) {
      const language = (lang || "").trim().split(/\s+/)[0].toLowerCase();
      const known = Boolean(language) && Boolean(hljs.getLanguage(language));
      const body = known ? hljs.highlight(text, { language, ignoreIllegals: true }).value : escapeHtml(text);
      return `<pre data-lang="${escapeHtml(language)}"><code class="hljs${known ? ` language-${escapeHtml(language)}` : ""}">${body}</code></pre>\n`;
    },
  },
});

// An answer is the agent's text: raw HTML in it is sanitized away, never trusted. No form controls
// and no ids or names (they would shadow the page's own elements), no styles.
const PURIFY = {
  RETURN_DOM_FRAGMENT: true,
  FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "option", "iframe", "frame", "object", "embed", "dialog"],
  FORBID_ATTR: ["style", "id", "name", "form", "formaction", "autofocus"],
};
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  // Links open in a new tab without a handle on this page (DOMPurify already refused javascript:).
  if (node.tagName === "A" && node.hasAttribute("href") && !node.getAttribute("href").startsWith("#")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

function renderMarkdown(text) {
  const fragment = DOMPurify.sanitize(markdown.parse(text), PURIFY);
  for (const pre of fragment.querySelectorAll("pre")) {
    const code = pre.querySelector("code") || pre;
    const language = pre.dataset.lang || "";
    pre.removeAttribute("data-lang");
    const block = el("div", { class: "codeblock" },
      el("div", { class: "code-head" }, el("span", { class: "lang" }, language || "code"),
        copyButton(() => code.textContent, "Copy code")));
    pre.replaceWith(block);
    block.append(pre);
  }
  return fragment;
}

async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    // no Clipboard API here (a page not served from localhost or https): the old way
  }
  const area = el("textarea", { readonly: "", class: "offscreen", "aria-hidden": "true" });
  area.value = text;
  document.body.append(area);
  area.select();
  let copied = false;
  try { copied = document.execCommand("copy"); } catch { copied = false; }
  area.remove();
  return copied;
}

function copyButton(getText, label = "Copy") {
  return el("button", {
    type: "button", class: "small copy", title: label, "aria-label": label,
    onclick: async (event) => {
      const button = event.currentTarget;
      const copied = await copyText(getText());
      button.textContent = copied ? "Copied" : "Copy failed";
      button.dataset.copied = String(copied);
      setTimeout(() => { button.textContent = "Copy"; }, 2000); // the label only: nothing waits on it
    },
  }, "Copy");
}

// -- the API -------------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

let tokenPrompt = null;

function askForToken(reason) {
  // One prompt at a time; every caller waiting on a 401 retries once it is answered.
  if (tokenPrompt) return tokenPrompt;
  tokenPrompt = new Promise((resolve) => {
    const dialog = $("token-dialog");
    $("token-error").textContent = reason || "";
    $("token").value = "";
    dialog.addEventListener(
      "close",
      () => {
        const token = $("token").value.trim();
        if (token) sessionStorage.setItem(TOKEN_KEY, token);
        tokenPrompt = null;
        resolve();
      },
      { once: true },
    );
    dialog.showModal();
  });
  return tokenPrompt;
}

function headers(extra = {}) {
  const result = { "X-Agent-Gateway-Client": "console", ...extra };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) result.Authorization = `Bearer ${token}`;
  return result;
}

async function api(method, path, body, { raw = false, signal } = {}) {
  for (let attempt = 0; attempt < 5; attempt++) {
    const init = { method, headers: headers(), signal };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    if (response.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      await askForToken(attempt ? "That token was not accepted." : "");
      continue;
    }
    if (!response.ok) {
      let code = "http_error";
      let message = `${response.status} ${response.statusText}`;
      try {
        const error = (await response.json()).error;
        code = error.code;
        message = error.message;
      } catch {
        // not the JSON error shape: keep the status line
      }
      throw new ApiError(response.status, code, message);
    }
    if (raw) return response;
    return response.status === 204 ? null : response.json();
  }
  throw new ApiError(401, "unauthorized", "no accepted token");
}

function showError(error) {
  $("error").textContent = error ? (error.message || String(error)) : "";
}

// -- the transcript (the rules of gateway/transcript.py apply_op) -------------------------------

function emptyTranscript(hostRunId) {
  return {
    hostRunId, agentId: null, question: null, status: "pending", terminal: null,
    answer: { text: "", final: false }, thoughts: { text: "", chunks: 0 }, tools: [], plan: null,
    permissions: [], citations: [], files: [], sessionMode: null, agentSessionId: null,
    modeHistory: [], replayed: { events: 0, messages: 0 }, usage: null, lastSeq: 0,
  };
}

function applyOp(t, op) {
  switch (op.op) {
    case "answer.append": t.answer.text += op.text; break;
    case "answer.final":
      if (op.text !== null && op.text !== undefined) t.answer.text = op.text;
      t.answer.final = true;
      break;
    case "thought.append": t.thoughts.text += op.text; t.thoughts.chunks += 1; break;
    case "tool.upsert": {
      const found = t.tools.find((c) => c.toolCallId === op.card.toolCallId);
      if (found) Object.assign(found, op.card);
      else t.tools.push({ ...op.card, firstSeq: op.card.seq });
      break;
    }
    case "citation.add":
      if (!t.citations.some((c) => c.url === op.citation.url && c.markdown === op.citation.markdown)) {
        t.citations.push({ ...op.citation });
      }
      break;
    case "plan.set": t.plan = { entries: op.entries }; break;
    case "permission.upsert": {
      const found = t.permissions.find((c) => c.requestId === op.card.requestId);
      if (found) Object.assign(found, op.card);
      else t.permissions.push({ ...op.card });
      break;
    }
    case "files.add": for (const change of op.changes) t.files.push({ ...change, seq: op.seq }); break;
    case "mode.set":
      t.sessionMode = op.mode;
      if (op.agentSessionId) t.agentSessionId = op.agentSessionId;
      t.modeHistory.push({ mode: op.mode, agentSessionId: op.agentSessionId, seq: op.seq });
      break;
    case "usage.set": t.usage = { ...(t.usage || {}), ...op.usage }; break;
    case "run.begin":
      t.hostRunId = t.hostRunId || op.hostRunId;
      t.agentId = t.agentId || op.agentId;
      break;
    case "status.set": if (t.terminal === null) t.status = op.status; break;
    case "run.end":
      if (t.terminal === null) {
        t.status = op.status;
        t.terminal = { status: op.status, reason: op.reason, synthetic: op.synthetic };
      }
      break;
    case "replay.note":
      t.replayed.events += 1;
      if (op.message) t.replayed.messages += 1;
      break;
    default: break; // an op this page does not know: nothing to show
  }
}

// -- rendering -----------------------------------------------------------------------------------

const isTerminal = (t) => t.terminal !== null || TERMINAL.has(t.status);

function citationLink(citation) {
  const markdown = citation.markdown || "";
  const match = /^\[([^\]]+)\]\(([^)\s]+)\)/.exec(markdown.trim());
  const label = citation.title || (match && match[1]) || citation.path || citation.url || markdown;
  const href = citation.url || (match && match[2]) || null;
  const safe = href && /^(https?:|\/|#)/i.test(href) ? href : null;
  return safe ? el("a", { href: safe, target: "_blank", rel: "noopener noreferrer" }, label) : el("span", {}, label);
}

function toolCard(card) {
  const receipt = card.receiptId || card.auditId;
  const locations = Array.isArray(card.locations)
    ? card.locations.map((l) => (l && l.path) || "").filter(Boolean).join(", ")
    : "";
  return el(
    "div",
    { class: "card tool", dataset: { toolCallId: card.toolCallId, status: card.status || "" } },
    el("div", { class: "head" }, el("span", { class: "label" }, "Tool"), ` ${card.title || card.tool || card.kind || "tool"} `,
      el("span", { class: "chip" }, card.status || "pending")),
    locations ? el("div", { class: "muted" }, locations) : null,
    card.path ? el("div", { class: "muted" }, card.path) : null,
    card.error ? el("div", { class: "error" }, typeof card.error === "string" ? card.error : JSON.stringify(card.error)) : null,
    receipt
      ? el("a", { class: "receipt", href: "#", onclick: (e) => { e.preventDefault(); showReceipts(card); } }, `receipt ${receipt}`)
      : null,
  );
}

function permissionCard(run, card) {
  const options = Array.isArray(card.options) ? card.options : [];
  const decided = card.status === "resolved";
  const terminal = isTerminal(run.transcript);
  return el(
    "div",
    { class: "card permission", dataset: { requestId: card.requestId || "", status: card.status || "" } },
    el("div", { class: "head" }, `Permission: ${card.title || card.kind || "the agent asks"}`),
    decided
      ? el("div", { class: "decision" }, `Decision: ${card.optionId || card.outcome || "—"}${card.by ? ` (by ${card.by})` : ""}`)
      : terminal
        ? el("div", { class: "muted" }, "not answered (the run ended)")
        : el("div", {}, options.map((option) => el(
          "button",
          {
            type: "button",
            class: /reject|deny/i.test(option.kind || option.optionId || "") ? "danger" : "",
            onclick: (e) => answerPermission(run, card, option.optionId, e.currentTarget),
          },
          option.name || option.optionId,
        ))),
  );
}

function renderRun(run) {
  const t = run.transcript;
  const node = el("article", { class: "run", dataset: { hostRunId: run.receipt.hostRunId, status: t.status } });
  const parentId = run.receipt.parentRunId;
  const parent = parentId && state.detail ? state.detail.runs.find((r) => r.receipt.hostRunId === parentId) : null;
  if (parent) {
    const regenerated = parent.transcript.question === t.question;
    node.dataset.origin = regenerated ? "regenerated" : "edited";
    node.append(el("div", { class: "origin" }, regenerated ? "↻ Regenerated: the same question asked again" : "✎ Edited and sent again"));
  }
  if (t.question) {
    node.append(el("div", { class: "bubble user" }, t.question));
    node.append(el("div", { class: "msg-actions user-actions" }, copyButton(() => t.question, "Copy your message"),
      isTerminal(t) ? el("button", { type: "button", class: "small edit", onclick: () => startEdit(run) }, "Edit") : null));
  }
  if (t.thoughts.chunks > 0) {
    const open = run.thoughtsOpen ? { open: "" } : {};
    const details = el("details", { class: "thoughts", ...open },
      el("summary", {}, `Thoughts (${t.thoughts.chunks} chunk${t.thoughts.chunks === 1 ? "" : "s"})`), el("pre", {}, t.thoughts.text));
    details.addEventListener("toggle", () => { run.thoughtsOpen = details.open; });
    node.append(details);
  }
  if (t.plan && t.plan.entries.length) {
    node.append(el("div", { class: "card plan" }, el("div", { class: "head" }, "Plan"),
      el("ol", {}, t.plan.entries.map((entry) => el("li", { dataset: { status: entry.status || "" } },
        entry.content || entry.title || JSON.stringify(entry))))));
  }
  for (const card of t.tools) node.append(toolCard(card));
  for (const card of t.permissions) node.append(permissionCard(run, card));
  // Rendered again only when the text changed: a finished answer keeps its nodes (and selection).
  if (!run.view || run.view.text !== t.answer.text) {
    run.view = { text: t.answer.text, node: el("div", { class: "bubble assistant markdown" }, renderMarkdown(t.answer.text)) };
  }
  run.view.node.dataset.final = String(t.answer.final);
  node.append(run.view.node);
  if (t.answer.text && isTerminal(t)) {
    node.append(el("div", { class: "msg-actions" }, copyButton(() => t.answer.text, "Copy the answer"),
      t.question ? el("button", { type: "button", class: "small regenerate", onclick: () => regenerate(run) }, "Regenerate") : null));
  }
  if (t.citations.length) {
    node.append(el("div", { class: "citations notice" }, "Sources: ", t.citations.map(citationLink)));
  }
  for (const change of t.files) {
    node.append(el("div", { class: "notice files-changed" }, `File ${change.kind || change.type || "changed"}: ${change.path}`));
  }
  if (t.replayed.events) {
    node.append(el("div", { class: "notice" }, `${t.replayed.events} replayed event(s) of the agent's history (not new output)`));
  }
  const label = t.terminal
    ? `${statusLabel(t.terminal.status)}${t.terminal.reason ? ` — ${t.terminal.reason}` : ""}${t.terminal.synthetic ? " (ended by the gateway)" : ""}`
    : statusLabel(t.status);
  node.append(el("div", { class: "run-status", dataset: { status: t.status } }, label));
  return node;
}

let renderQueued = false;

function render() {
  // Coalesce bursts (thousands of deltas) into one paint per frame.
  if (renderQueued) return;
  renderQueued = true;
  requestAnimationFrame(() => {
    renderQueued = false;
    renderNow();
  });
}

function renderNow() {
  const box = $("conversation");
  const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  const detail = state.detail;
  box.replaceChildren(...(detail ? detail.runs.map(renderRun) : [el("p", { class: "muted" }, "Start a conversation below.")]));
  if (atBottom) box.scrollTop = box.scrollHeight;
  renderHeader();
}

function renderHeader() {
  const detail = state.detail;
  const last = detail && detail.runs.length ? detail.runs[detail.runs.length - 1] : null;
  const summary = detail ? detail.session : null;
  const binding = detail ? detail.binding : null;
  const agent = state.agents.find((a) => a.agentId === ((last && last.receipt.agentId) || state.agentId));
  $("h-runtime").textContent = agent ? `${agent.displayName} (${agent.agentId})` : (last ? last.receipt.agentId : "–");
  $("h-profile").textContent = (summary && (summary.profile || summary.model)) || "default";
  $("h-session").textContent = state.sessionId || "–";
  const agentSession = (last && last.transcript.agentSessionId) || (binding && binding.agentSessionId);
  $("h-agent-session").textContent = agentSession || "–";
  const mode = (last && last.transcript.sessionMode) || (binding && binding.sessionMode);
  $("h-mode").textContent = mode || "no mode";
  $("h-mode").dataset.mode = mode || "";
  const status = last ? last.transcript.status : "idle";
  $("h-status").textContent = statusLabel(status);
  $("h-status").dataset.status = status;
  $("h-title").textContent = (summary && summary.title) || (last && last.transcript.question) || "New conversation";
  const pinned = Boolean(summary && summary.pinned);
  $("pin").textContent = pinned ? "Unpin" : "Pin";
  $("pin").setAttribute("aria-pressed", String(pinned));
  // "output in progress": only while the last run is followed, active, and its output is streaming.
  const following = last && state.follows.has(last.receipt.hostRunId);
  const streaming = following && !isTerminal(last.transcript) &&
    (last.transcript.answer.text.length > 0 || last.transcript.thoughts.chunks > 0);
  $("h-busy").hidden = !streaming;
  $("h-conn").hidden = state.connected;
  $("cancel").hidden = !(last && !isTerminal(last.transcript));
  // Nothing to act on (a new conversation, a deleted one): the session's actions are off.
  for (const id of ["pin", "rename", "export-json", "export-md", "delete"]) $(id).disabled = !summary;
}

// -- following a run's stream --------------------------------------------------------------------

function parseSse(buffer, onFrame) {
  // Returns what is left of `buffer` after the complete frames in it.
  let index;
  while ((index = buffer.indexOf("\n\n")) >= 0) {
    const block = buffer.slice(0, index);
    buffer = buffer.slice(index + 2);
    const frame = { id: null, event: "message", data: [] };
    for (const line of block.split("\n")) {
      if (!line || line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "id") frame.id = value;
      else if (field === "event") frame.event = value;
      else if (field === "data") frame.data.push(value);
    }
    if (frame.data.length || frame.id) onFrame(frame);
  }
  return buffer;
}

function stopFollowing() {
  for (const mine of state.follows.values()) mine.controller.abort();
  state.follows.clear();
  state.connected = true;
}

// The stream proper: fetch (not EventSource) so the token goes in a header, Last-Event-ID too.
// Answers whether any new frame arrived.
async function readStream(run, mine) {
  const t = run.transcript;
  const init = { headers: headers({ "Last-Event-ID": String(t.lastSeq) }), signal: mine.controller.signal };
  const response = await fetch(`/v1/runs/${encodeURIComponent(mine.hostRunId)}/stream?projection=transcript`, init);
  if (response.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    await askForToken("");
    return false;
  }
  if (!response.ok) {
    let message = `${response.status}`;
    try { message = (await response.json()).error.message; } catch { /* keep the status */ }
    throw new ApiError(response.status, "stream_error", message);
  }
  state.connected = true;
  render();
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let progressed = false;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer = parseSse((buffer + value).replace(/\r\n?/g, "\n"), (frame) => {
      const seq = frame.id ? Number(frame.id) : 0;
      if (seq && seq <= t.lastSeq) return; // already applied (never apply an event twice)
      if (frame.data.length) {
        const patch = JSON.parse(frame.data.join("\n"));
        for (const op of patch.ops || []) applyOp(t, op);
      }
      if (seq) t.lastSeq = seq;
      progressed = true;
    });
    render();
  }
  return progressed;
}

// Each active run follows its own stream (a run sent while the previous one is finishing does not
// take the previous one's stream away, so both reach their end).
async function followRun(run) {
  const hostRunId = run.receipt.hostRunId;
  if (state.follows.has(hostRunId)) return;
  const mine = { hostRunId, controller: new AbortController() };
  state.follows.set(hostRunId, mine);
  render();
  let tries = 0;
  while (state.follows.get(hostRunId) === mine && !isTerminal(run.transcript) && tries < RECONNECT_MAX_TRIES) {
    try {
      if (await readStream(run, mine)) tries = 0;
    } catch (error) {
      if (mine.controller.signal.aborted) return;
      if (error instanceof ApiError && error.status < 500) {
        showError(error);
        break;
      }
      tries += 1;
      state.connected = false;
      render();
      await new Promise((resolve) => setTimeout(resolve, RECONNECT_DELAY_MS[Math.min(tries, RECONNECT_DELAY_MS.length - 1)]));
      continue;
    }
    if (!isTerminal(run.transcript)) {
      // The stream ended without the terminal event (the gateway is stopping): resume shortly.
      tries += 1;
      await new Promise((resolve) => setTimeout(resolve, RECONNECT_DELAY_MS[Math.min(tries, RECONNECT_DELAY_MS.length - 1)]));
    }
  }
  if (state.follows.get(hostRunId) === mine) {
    state.follows.delete(hostRunId);
    if (!state.follows.size) state.connected = true;
    render();
    refreshSessions();
  }
}

// -- sessions ------------------------------------------------------------------------------------

async function refreshSessions() {
  const query = $("search").value.trim();
  const mine = ++state.searchSeq;
  let page;
  try {
    page = await api("GET", `/v1/sessions?limit=100${query ? `&q=${encodeURIComponent(query)}` : ""}`);
  } catch (error) {
    showError(error);
    return;
  }
  if (mine !== state.searchSeq) return; // a newer search answered first
  const item = (s) => {
    const node = el(
      "li",
      { class: `session${s.sessionId === state.sessionId ? " current" : ""}`, dataset: { sessionId: s.sessionId, pinned: String(Boolean(s.pinned)) }, onclick: () => goToSession(s.sessionId) },
      el("div", { class: "title" }, s.title || s.sessionId),
      el("button", {
        type: "button", class: "pin-toggle", "aria-pressed": String(Boolean(s.pinned)),
        "aria-label": s.pinned ? "Unpin" : "Pin", title: s.pinned ? "Unpin" : "Pin to the top",
        onclick: (event) => { event.stopPropagation(); setPinned(s.sessionId, !s.pinned); },
      }, s.pinned ? "★" : "☆"),
      el("div", { class: "meta" }, `${s.agentName || s.agentId} · ${s.messageCount} msg · ${statusLabel(s.lastStatus || "")}${s.activeRun ? " · active" : ""}`),
    );
    if (s.snippet) {
      const snippet = el("div", { class: "snippet" });
      snippet.innerHTML = s.snippet; // the gateway HTML-escapes it; only <mark> is markup
      node.append(snippet);
    }
    return node;
  };
  // A search is ranked: one list. Otherwise pinned first (the gateway's order), then by day.
  const groups = new Map();
  for (const s of page.sessions) {
    const name = query ? "Results" : s.pinned ? "Pinned" : dayGroup(s.updatedAt);
    if (!groups.has(name)) groups.set(name, []);
    groups.get(name).push(s);
  }
  $("sessions").replaceChildren(...[...groups].map(([name, sessions]) => el("section", { class: "group", dataset: { group: name } },
    el("h3", {}, name), el("ul", {}, sessions.map(item)))));
  $("sessions-empty").hidden = page.sessions.length > 0;
}

function dayGroup(iso) {
  // Today, Yesterday or Earlier, in the browser's time zone.
  const day = (date) => new Date(date.getFullYear(), date.getMonth(), date.getDate()).getTime();
  const when = new Date(iso);
  if (Number.isNaN(when.getTime())) return "Earlier";
  const days = Math.round((day(new Date()) - day(when)) / 86_400_000);
  return days <= 0 ? "Today" : days === 1 ? "Yesterday" : "Earlier";
}

async function setPinned(sessionId, pinned) {
  // Pinning lives in the gateway's session index (PATCH pinned): every device of the actor sees it.
  try {
    const answer = await api("PATCH", `/v1/sessions/${encodeURIComponent(sessionId)}`, { pinned });
    if (state.detail && sessionId === state.sessionId) state.detail.session = answer.session;
    render();
    await refreshSessions();
  } catch (error) {
    showError(error);
  }
}

function sessionFromHash() {
  const match = /^#session=(.+)$/.exec(location.hash);
  return match ? decodeURIComponent(match[1]) : null;
}

function goToSession(sessionId) {
  // Through the URL, so Back and Forward move between sessions (hashchange opens it).
  if (phone.matches) setSidebar(false);
  if (sessionFromHash() === sessionId) openSession(sessionId);
  else location.hash = `session=${encodeURIComponent(sessionId)}`;
}

async function openSession(sessionId, { quiet = false } = {}) {
  stopFollowing();
  stopEditing();
  const ticket = ++state.openSeq;
  state.sessionId = sessionId;
  history.replaceState(null, "", `#session=${encodeURIComponent(sessionId)}`);
  showError(null);
  let detail = null;
  try {
    detail = await api("GET", `/v1/sessions/${encodeURIComponent(sessionId)}`);
  } catch (error) {
    if (!(quiet && error.status === 404)) showError(error);
  }
  if (ticket !== state.openSeq) return; // another session was opened meanwhile
  state.detail = detail;
  for (const item of document.querySelectorAll(".session")) {
    item.classList.toggle("current", item.dataset.sessionId === sessionId);
  }
  if (state.detail) {
    const last = state.detail.runs[state.detail.runs.length - 1];
    const lastAgent = last && state.agents.find((a) => a.agentId === last.receipt.agentId);
    if (lastAgent && !(lastAgent.availability && lastAgent.availability.available === false)) selectAgent(lastAgent.agentId);
  }
  renderNow();
  await resumeActiveRun();
}

async function resumeActiveRun() {
  // The page (re)opened or became visible: follow the session's active run, if any.
  if (!state.sessionId || !state.detail) return;
  let active;
  try {
    active = await api("GET", `/v1/sessions/${encodeURIComponent(state.sessionId)}/active-run`);
  } catch {
    return;
  }
  // Every run not yet ended follows its own stream (one still queued behind the active one too).
  for (const run of state.detail.runs) if (!isTerminal(run.transcript)) followRun(run);
  if (!active.run) return;
  let run = state.detail.runs.find((r) => r.receipt.hostRunId === active.run.hostRunId);
  if (!run) {
    run = { receipt: active.run, transcript: emptyTranscript(active.run.hostRunId) };
    state.detail.runs.push(run);
  }
  followRun(run);
}

function newConversation() {
  stopFollowing();
  stopEditing();
  state.openSeq += 1;
  if (phone.matches) setSidebar(false);
  state.sessionId = `console-${crypto.randomUUID()}`;
  state.detail = null;
  history.replaceState(null, "", "#");
  for (const item of document.querySelectorAll(".session")) item.classList.remove("current");
  renderNow();
  $("h-session").textContent = state.sessionId;
  $("message").focus();
}

async function send(event) {
  event.preventDefault();
  const text = $("message").value;
  if (!text.trim()) return;
  if (await sendMessage(text, state.editOf)) {
    $("message").value = "";
    stopEditing();
  }
}

// Regenerate and edit-and-resend are new runs of the same session naming the run they redo
// (parentRunId): the transcript keeps both.
function regenerate(run) {
  sendMessage(run.transcript.question, run);
}

function startEdit(run) {
  state.editOf = run;
  $("message").value = run.transcript.question;
  $("editing").hidden = false;
  $("message").focus();
}

function stopEditing() {
  state.editOf = null;
  $("editing").hidden = true;
}

async function sendMessage(text, parentRun = null) {
  showError(null);
  if (!state.sessionId) newConversation();
  const body = { requestId: crypto.randomUUID(), agentId: state.agentId, sessionId: state.sessionId, message: text };
  if (parentRun) body.parentRunId = parentRun.receipt.hostRunId;
  $("send").disabled = true;
  try {
    const receipt = await api("POST", "/v1/runs", body);
    const transcript = emptyTranscript(receipt.hostRunId);
    transcript.question = text;
    transcript.agentId = receipt.agentId;
    if (!state.detail) {
      state.detail = { session: null, binding: null, runs: [] };
    }
    const run = { receipt, transcript };
    state.detail.runs.push(run);
    history.replaceState(null, "", `#session=${encodeURIComponent(state.sessionId)}`);
    renderNow();
    followRun(run).then(() => refreshSummary());
    refreshSummary(); // the session is indexed once its run is admitted: rename/export/delete apply
    refreshSessions();
    return true;
  } catch (error) {
    showError(error);
    return false;
  } finally {
    $("send").disabled = false;
  }
}

async function refreshSummary() {
  // The header's summary and binding (agent session id, profile) once a run ends.
  if (!state.sessionId || !state.detail) return;
  try {
    const fresh = await api("GET", `/v1/sessions/${encodeURIComponent(state.sessionId)}`);
    state.detail.session = fresh.session;
    state.detail.binding = fresh.binding;
    render();
  } catch {
    // the session was deleted meanwhile: keep what is shown
  }
}

async function answerPermission(run, card, optionId, button) {
  button.disabled = true;
  try {
    await api("POST", `/v1/runs/${encodeURIComponent(run.receipt.hostRunId)}/permissions/${encodeURIComponent(card.requestId)}`, { optionId });
  } catch (error) {
    showError(error);
    button.disabled = false;
  }
}

async function showReceipts(card) {
  const run = state.detail.runs.find((r) => r.transcript.tools.includes(card));
  if (!run) return;
  try {
    const receipts = await api("GET", `/v1/runs/${encodeURIComponent(run.receipt.hostRunId)}/receipts`);
    const blob = new Blob([JSON.stringify(receipts, null, 2)], { type: "application/json" });
    window.open(URL.createObjectURL(blob), "_blank", "noopener");
  } catch (error) {
    showError(error);
  }
}

async function exportSession(format) {
  try {
    const response = await api("GET", `/v1/sessions/${encodeURIComponent(state.sessionId)}/export?format=${format}`, undefined, { raw: true });
    const blob = await response.blob();
    const link = el("a", { href: URL.createObjectURL(blob), download: `${state.sessionId}.${format === "json" ? "json" : "md"}` });
    document.body.append(link);
    link.click();
    link.remove();
  } catch (error) {
    showError(error);
  }
}

async function renameSession() {
  const current = state.detail && state.detail.session ? state.detail.session.title : "";
  const title = prompt("New title (empty: the default title)", current || "");
  if (title === null) return;
  try {
    const answer = await api("PATCH", `/v1/sessions/${encodeURIComponent(state.sessionId)}`, { title });
    state.detail.session = answer.session;
    render();
    await refreshSessions();
  } catch (error) {
    showError(error);
  }
}

async function deleteSession() {
  if (!confirm("Delete this conversation's history from the gateway? (The agent's own store is not touched.)")) return;
  try {
    await api("DELETE", `/v1/sessions/${encodeURIComponent(state.sessionId)}`);
    newConversation();
    await refreshSessions();
  } catch (error) {
    showError(error);
  }
}

// -- agents and their settings -------------------------------------------------------------------

function selectAgent(agentId) {
  state.agentId = agentId;
  $("agent").value = agentId;
  renderSettings();
}

function renderSettings() {
  const agent = state.agents.find((a) => a.agentId === state.agentId);
  const form = $("settings-form");
  $("settings-note").textContent = "";
  if (!agent) {
    form.replaceChildren();
    return;
  }
  const row = (field) => {
    const id = `field-${field.key}`;
    let input;
    if (field.kind === "boolean") {
      input = el("input", { type: "checkbox", id });
      input.checked = Boolean(field.value);
    } else if (field.kind === "select") {
      input = el("select", { id }, (field.options || []).map((o) => el("option", { value: o }, o)));
      input.value = field.value ?? field.default ?? "";
    } else if (field.kind === "integer") {
      input = el("input", { type: "number", step: "1", id });
      input.value = field.value ?? "";
    } else if (field.kind === "string_list") {
      input = el("input", { type: "text", id, placeholder: (field.options || []).join(", ") });
      input.value = (field.value || []).join(", ");
    } else {
      input = el("input", { type: field.secret ? "password" : "text", id, placeholder: field.secret && field.isSet ? "(set)" : "" });
      input.value = field.secret ? "" : (field.value ?? "");
    }
    input.dataset.key = field.key;
    input.dataset.kind = field.kind;
    input.dataset.secret = String(Boolean(field.secret));
    input.dataset.original = JSON.stringify(field.secret ? null : (field.value ?? null));
    return el("label", { for: id, title: field.description || field.key }, input.type === "checkbox" ? input : null,
      ` ${field.label || field.key} `, input.type === "checkbox" ? null : input);
  };
  const groups = [
    ["Common (every agent)", (agent.fields || []).filter((f) => f.scope === "ai.common")],
    [`This agent (${agent.displayName || agent.agentId})`, (agent.fields || []).filter((f) => f.scope !== "ai.common")],
  ];
  form.replaceChildren(...groups.filter(([, fields]) => fields.length).map(([title, fields]) =>
    el("fieldset", {}, el("legend", {}, title), fields.map(row))));
}

async function saveSettings() {
  // Only what the user changed: an untouched field keeps following its default.
  const values = {};
  for (const input of $("settings-form").querySelectorAll("[data-key]")) {
    const { key, kind, secret, original } = input.dataset;
    let value;
    if (kind === "boolean") value = input.checked;
    else if (kind === "integer") value = input.value === "" ? null : Number(input.value);
    else if (kind === "string_list") value = input.value.split(",").map((v) => v.trim()).filter(Boolean);
    else if (secret === "true" && input.value === "") continue; // a secret left empty is unchanged
    else value = input.value === "" ? null : input.value;
    const unchanged = JSON.stringify(value) === original || (value === null && original === '""');
    if (!unchanged) values[key] = value;
  }
  if (!Object.keys(values).length) {
    $("settings-note").textContent = "nothing changed";
    return;
  }
  try {
    await api("PUT", "/v1/preferences", { values });
    await loadAgents();
    $("settings-note").textContent = "saved";
  } catch (error) {
    $("settings-note").textContent = error.message;
  }
}

async function loadAgents() {
  const answer = await api("GET", "/v1/agents");
  state.agents = answer.agents;
  const select = $("agent");
  // An agent that cannot run here stays listed, disabled, with what to install or set.
  const usable = (a) => !a.availability || a.availability.available !== false;
  select.replaceChildren(...state.agents.map((a) => {
    const name = a.displayName || a.agentId;
    if (usable(a)) return el("option", { value: a.agentId }, name);
    const reason = a.availability.reason || "unavailable";
    return el("option", { value: a.agentId, disabled: "", title: reason }, `${name} (unavailable: ${reason})`);
  }));
  const available = state.agents.filter(usable);
  const chosen = state.agents.find((a) => a.agentId === state.agentId);
  const preferred = (chosen && usable(chosen) ? chosen : available.find((a) => a.isDefault) || available[0] || {}).agentId;
  if (preferred) selectAgent(preferred);
}

// -- layout --------------------------------------------------------------------------------------

// Below this width the sidebar slides over the conversation (style.css has the same query).
const phone = window.matchMedia("(max-width: 760px)");

function setSidebar(open) {
  document.body.dataset.sidebar = open ? "open" : "closed";
  $("toggle-sidebar").setAttribute("aria-expanded", String(open));
}

// -- start ---------------------------------------------------------------------------------------

async function start() {
  $("composer").addEventListener("submit", send);
  $("message").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("composer").requestSubmit();
  });
  $("new-chat").addEventListener("click", newConversation);
  setSidebar(!phone.matches);
  phone.addEventListener("change", () => setSidebar(!phone.matches));
  $("toggle-sidebar").addEventListener("click", () => setSidebar(document.body.dataset.sidebar !== "open"));
  $("close-sidebar").addEventListener("click", () => setSidebar(false));
  $("scrim").addEventListener("click", () => setSidebar(false));
  $("pin").addEventListener("click", () => {
    const summary = state.detail && state.detail.session;
    if (summary) setPinned(state.sessionId, !summary.pinned);
  });
  $("edit-cancel").addEventListener("click", () => { stopEditing(); $("message").value = ""; });
  window.addEventListener("hashchange", () => {
    // #session=<id> typed, pasted or reached with Back: show that session.
    const sessionId = sessionFromHash();
    if (sessionId && sessionId !== state.sessionId) openSession(sessionId, { quiet: true });
    else if (!sessionId && state.detail) newConversation();
  });
  $("agent").addEventListener("change", (e) => selectAgent(e.target.value));
  $("settings-save").addEventListener("click", saveSettings);
  $("rename").addEventListener("click", renameSession);
  $("delete").addEventListener("click", deleteSession);
  $("export-json").addEventListener("click", () => exportSession("json"));
  $("export-md").addEventListener("click", () => exportSession("markdown"));
  $("cancel").addEventListener("click", async () => {
    const last = state.detail && state.detail.runs[state.detail.runs.length - 1];
    if (last) await api("POST", `/v1/runs/${encodeURIComponent(last.receipt.hostRunId)}/cancel`).catch(showError);
  });
  let searchTimer = null;
  $("search").addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(refreshSessions, 200);
  });
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") resumeActiveRun();
  });
  try {
    await loadAgents();
  } catch (error) {
    showError(error);
  }
  await refreshSessions();
  const sessionId = sessionFromHash();
  if (sessionId) await openSession(sessionId, { quiet: true });
  else newConversation();
  document.body.dataset.ready = "true";
}

start();
