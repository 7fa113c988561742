"""The LangGraph side of bench/bench_compare.py: one node calling an OpenAI-compatible model
(`OPENAI_BASE_URL`, the bench's fake upstream) through LangChain's ChatOpenAI, streamed as
LangGraph streams a chat model's tokens (`stream_mode="messages-tuple"`). Not part of the gateway.
"""

from langchain_openai import ChatOpenAI  # type: ignore[import-not-found]
from langgraph.graph import START, MessagesState, StateGraph  # type: ignore[import-not-found]

model = ChatOpenAI(model="m", streaming=True)


async def chat(state: MessagesState) -> dict:  # type: ignore[type-arg]
    return {"messages": [await model.ainvoke(state["messages"])]}


graph = StateGraph(MessagesState).add_node("chat", chat).add_edge(START, "chat").compile()
