"""LangGraph's prebuilt ReAct agent on langchain-openai's ChatOpenAI, with a tool."""

import sys

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent


@tool
def lookup(key: str) -> str:
    """Look a key up in the table."""
    return f"{key} is owned by Mai."


agent = create_react_agent(ChatOpenAI(model="gpt-4o-mini", max_tokens=48), [lookup])
try:
    state = agent.invoke({"messages": [("user", sys.stdin.read())]}, {"recursion_limit": 6})
    print(state["messages"][-1].content)
except GraphRecursionError:         # the model kept calling tools
    print("gave up: recursion limit")
