"""langchain-openai's with_structured_output at its default (a strict json_schema response_format)."""

import sys

from langchain_openai import ChatOpenAI
from pydantic import BaseModel


class Owner(BaseModel):
    name: str
    sure: bool


model = ChatOpenAI(model="gpt-4o-mini", max_tokens=48).with_structured_output(Owner)
try:
    print(model.invoke(sys.stdin.read()))
except ValueError as exc:           # a reply cut by max_tokens does not parse
    print(f"gave up: {exc}")
