"""LangChain against a running `lanes serve` (e.g. `make serve`): with_structured_output (a
json_schema response_format) and a bind_tools agent loop (a required call, the tool's result sent
back, the next answer). LangChain is not a lanes dependency; in a separate environment:

    pip install langchain-openai
    python bench/serving/langchain.py PORT      # results/langchain-check-cpu.txt has a run
"""

import json
import sys
import urllib.request

from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

port = sys.argv[1]
base = f"http://127.0.0.1:{port}/v1"
model = json.loads(urllib.request.urlopen(base + "/models").read())["data"][0]["id"]
llm = ChatOpenAI(base_url=base, api_key="none", model=model, temperature=0, max_tokens=120)


class City(BaseModel):
    name: str = Field(max_length=20)
    country: str = Field(max_length=20)


print(
    "with_structured_output:",
    repr(llm.with_structured_output(City).invoke("Name a big city in France.")),
)


@tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return f"sunny, 21 C in {city}"


bound = llm.bind_tools([get_weather], tool_choice="required")
messages = [HumanMessage("What is the weather in Paris?")]
reply = bound.invoke(messages)
print("tool_calls:", reply.tool_calls)
messages.append(reply)
for call in reply.tool_calls:
    messages.append(ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"]))
final = llm.bind_tools([get_weather]).invoke(messages)
print("after the tool result:", repr(final.content), final.response_metadata.get("finish_reason"))
