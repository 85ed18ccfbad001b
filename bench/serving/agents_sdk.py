"""The openai-agents SDK against a running `lanes serve` (e.g. `make serve`), on its default model
API (Responses): its default agent answers, then an agent with a function tool calls it
(`tool_choice` required for the first turn: the SDK resets it after the call), gets the result
back and answers. openai-agents is not a lanes dependency; in a separate environment:

    pip install openai-agents
    python bench/serving/agents_sdk.py PORT     # results/agents-check-cpu.txt has a run
"""

import json
import sys
import time
import urllib.request

from agents import (
    Agent,
    ModelSettings,
    Runner,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

port = sys.argv[1]
base = f"http://127.0.0.1:{port}/v1"
model = json.loads(urllib.request.urlopen(base + "/models").read())["data"][0]["id"]
set_default_openai_client(AsyncOpenAI(base_url=base, api_key="none"))
set_tracing_disabled(True)
settings = ModelSettings(temperature=0, max_tokens=80)

started = time.perf_counter()
agent = Agent(name="Assistant", instructions="You answer in one sentence.", model=model,
              model_settings=settings)  # fmt: skip
result = Runner.run_sync(agent, "What is the capital of France?")
print(f"default agent ({time.perf_counter() - started:.1f} s):", repr(result.final_output))


@function_tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return f"sunny, 21 C in {city}"


started = time.perf_counter()
tools = Agent(
    name="Weather",
    instructions="Use the tool, then answer in one sentence.",
    model=model,
    tools=[get_weather],
    model_settings=ModelSettings(temperature=0, max_tokens=120, tool_choice="required"),
)
result = Runner.run_sync(tools, "What is the weather in Paris?", max_turns=4)
called = [i.raw_item for i in result.new_items if i.type == "tool_call_item"]
print(
    f"tool agent ({time.perf_counter() - started:.1f} s): calls",
    [(c.name, c.arguments) for c in called],
)
print("final:", repr(result.final_output))
