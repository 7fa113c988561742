"""The provider's answer text in the caller's terms (``mapping.rewrite_answer``), on the shapes a
model writes its reference list in: LightRAG's ``### References`` / ``- [n] name``, a bold
heading, bare ``[n] name`` lines. The real-server cases are in tests/test_lightrag.py."""

from __future__ import annotations

from agent_gateway.plugins.lightrag.mapping import OTHER_WORKSPACE_LABEL, encode_source, rewrite_answer

A_WIDGET = encode_source("local:a", "notes/widget.md")
B_ZEBRA = encode_source("local:b", "research/zebra.md")
B_NAMES = {B_ZEBRA: "research/zebra.md"}


def test_reference_list_keeps_only_the_callers_documents_as_workspace_paths() -> None:
    answer = (
        f"Widgets are blue [2]; zebras are striped [1].\n\n### References\n\n- [1] {B_ZEBRA}\n- [2] {A_WIDGET}\n"
        "- [3] widget.md\n- [4] zebra.md\n- [5] `research/zebra.md`\n- [6] Some Title We Were Not Given\n"
        "\nHope this helps."
    )
    text = rewrite_answer(answer, "local:b", B_NAMES, [A_WIDGET])
    assert text == (
        "Widgets are blue [2]; zebras are striped [1].\n\n### References\n\n- [1] research/zebra.md\n"
        "- [4] research/zebra.md\n- [5] research/zebra.md\n\nHope this helps."
    )


def test_a_list_left_empty_goes_with_its_heading() -> None:
    answer = f"Widgets are blue.\n\n**References:**\n- [1] {A_WIDGET}\n- [2] widget.md\n"
    assert rewrite_answer(answer, "local:b", B_NAMES, [A_WIDGET]) == "Widgets are blue."


def test_bare_entries_and_inline_names_of_other_workspaces() -> None:
    answer = f"See {A_WIDGET} and {B_ZEBRA}.\n[1] widget.md\n[2] {B_ZEBRA}\n[3] not a file name, a sentence."
    text = rewrite_answer(answer, "local:b", B_NAMES, [])
    assert text == (
        f"See {OTHER_WORKSPACE_LABEL} and research/zebra.md.\n[2] research/zebra.md\n[3] not a file name, a sentence."
    )


def test_a_basename_shared_with_another_workspace_is_not_guessed() -> None:
    b_widget = encode_source("local:b", "docs/widget.md")
    answer = "### References\n- [1] widget.md\n- [2] docs/widget.md\n"
    text = rewrite_answer(answer, "local:b", {b_widget: "docs/widget.md"}, [A_WIDGET])
    assert text == "### References\n- [2] docs/widget.md\n"
