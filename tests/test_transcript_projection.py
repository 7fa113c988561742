"""The transcript projection: folding a prefix, storing it as JSON, then folding the rest equals
folding the whole journal; the live patches give the same transcript; thoughts and replayed
history never reach the answer."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agent_gateway.models import Event
from agent_gateway.transcript import apply_op, empty_transcript, project_transcript, transcript_projection

TEXT = st.text(alphabet="abc 思考", max_size=6)
CALL = st.sampled_from(["c1", "c2", "c3"])
PAYLOADS: dict[str, Any] = {
    "message.delta": st.fixed_dictionaries({"text": TEXT}),
    "message.completed": st.one_of(st.just({}), st.fixed_dictionaries({"text": TEXT})),
    "thought.delta": st.fixed_dictionaries({"text": TEXT}),
    "tool.started": st.fixed_dictionaries({"toolCallId": CALL, "title": TEXT}),
    "tool.updated": st.fixed_dictionaries({"toolCallId": CALL, "status": st.just("in_progress")}),
    "tool.completed": st.fixed_dictionaries(
        {
            "toolCallId": CALL,
            "status": st.sampled_from(["completed", "failed"]),
            "rawOutput": st.fixed_dictionaries({"citationUrl": st.sampled_from(["u1", "u2"])}),
        }
    ),
    "plan.updated": st.fixed_dictionaries({"entries": st.lists(st.fixed_dictionaries({"content": TEXT}), max_size=2)}),
    "permission.requested": st.fixed_dictionaries({"requestId": st.sampled_from(["p1", "p2"]), "options": st.just([])}),
    "permission.resolved": st.fixed_dictionaries(
        {"requestId": st.sampled_from(["p1", "p2"]), "optionId": st.sampled_from(["allow", None])}
    ),
    "files.changed": st.fixed_dictionaries({"changes": st.lists(st.fixed_dictionaries({"path": TEXT}), max_size=2)}),
    "session.info.updated": st.fixed_dictionaries(
        {"sessionMode": st.sampled_from(["native_live", "loaded", "cold_resumed", "new_session"])}
    ),
    "run.started": st.just({}),
    "run.completed": st.just({"status": "completed"}),
    "run.interrupted": st.fixed_dictionaries({"synthetic": st.booleans()}),
    "replay.message": st.fixed_dictionaries({"role": st.just("assistant"), "text": TEXT}),
    "usage.updated": st.fixed_dictionaries({"used": st.integers(0, 9)}),
}
STEP = st.sampled_from(sorted(PAYLOADS)).flatmap(
    lambda kind: st.tuples(st.just(kind), PAYLOADS[kind], st.sampled_from(["agent", "adapter_replay", "tool"]))
)


def journal(steps: list[tuple[str, dict[str, Any], str]]) -> list[Event]:
    return [Event("run_x", seq, kind, source, payload) for seq, (kind, payload, source) in enumerate(steps, 1)]


@settings(max_examples=300, deadline=None)
@given(st.lists(STEP, max_size=40), st.integers(0, 40))
def test_prefix_then_rest_equals_whole(steps: list[tuple[str, dict[str, Any], str]], cut: int) -> None:
    events = journal(steps)
    whole = project_transcript(events)
    stored = json.loads(json.dumps(project_transcript(events[:cut])))  # a transcript kept as JSON
    assert project_transcript(events[cut:], stored) == whole
    # The live form: each event's patch, applied by a client, gives the same transcript.
    live = empty_transcript()
    for event in events:
        patch = transcript_projection(event)
        for op in json.loads(json.dumps(patch))["ops"] if patch else ():
            apply_op(live, op)
    live["lastSeq"] = whole["lastSeq"]
    assert live == whole
    # Only message deltas / finals outside a replay make the answer.
    answer_parts = [p.get("text", "") for k, p, s in steps if s != "adapter_replay" and k == "message.delta"]
    finals = [p for k, p, s in steps if s != "adapter_replay" and k == "message.completed" and "text" in p]
    if not finals:
        assert whole["answer"]["text"] == "".join(answer_parts)
    assert whole["replayed"]["events"] == sum(1 for _k, _p, s in steps if s == "adapter_replay")


def test_terminal_status_is_the_first_terminal_and_modes_are_status() -> None:
    events = journal(
        [
            ("session.info.updated", {"sessionMode": "loaded", "agentSessionId": "a1"}, "agent"),
            ("message.delta", {"text": "hi"}, "agent"),
            ("run.interrupted", {"synthetic": True, "reason": "gateway stopped"}, "gateway"),
            ("run.completed", {}, "gateway"),
        ]
    )
    transcript = project_transcript(events)
    assert transcript["status"] == "interrupted" and transcript["terminal"]["synthetic"] is True
    assert transcript["sessionMode"] == "loaded" and transcript["agentSessionId"] == "a1"
    assert transcript["answer"]["text"] == "hi"
