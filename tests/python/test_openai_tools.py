#!/usr/bin/python3
"""Tool calling through the OpenAI-compatible HTTP API with the official `openai` client.

The demo model does not call tools by itself, so the server here is scripted_openai_server: the
router's HTTP API (the demo model's tokenizer and chat format, the real scheduler) over a fake
step runner whose every reply is a given text. What is checked is what the server and the
client make of a known reply: the parse into `tool_calls`, the streamed deltas as the client
puts them together, and a conversation sent back with the calls and their results.

Needs the `openai` package (scripts/setup_python.sh BUILD_DIR/venv); without it the test says
so and exits 77 (CTest's skip). $STRATA_BIN_DIR is where scripted_openai_server is (CTest sets
it; default: build/bin).
"""

import json
import os
import subprocess
import sys
import unittest

try:
    import openai
except ImportError as missing:
    sys.exit(print(f"SKIP: {missing}; run scripts/setup_python.sh BUILD_DIR/venv") or 77)

BIN_DIR = os.environ.get("STRATA_BIN_DIR") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "bin")
MODEL = "strata-demo"

TWO_CALLS = ('Checking both.\n<tool_call>\n{"name": "get_weather", "arguments": '
             '{"city": "Zürich", "days": 2}}\n</tool_call>\n<tool_call>\n'
             '{"name": "get_time", "arguments": {}}\n</tool_call>')

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "The time now",
                                      "parameters": {"type": "object", "properties": {}}}},
]

MESSAGES = [{"role": "user", "content": "Weather in Zürich for two days, and the time?"}]


class ScriptedServer:
    """scripted_openai_server REPLY; stop() closes its standard input."""

    def __init__(self, reply):
        self.proc = subprocess.Popen([os.path.join(BIN_DIR, "scripted_openai_server"), reply],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("LISTENING "):
            self.stop()
            raise RuntimeError(f"scripted_openai_server did not start: {line!r}")
        port = int(line.split()[1])
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                                    timeout=60, max_retries=0)

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(30)
        self.proc.stdout.close()


class ToolCallsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = ScriptedServer(TWO_CALLS)
        cls.client = cls.server.client

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def create(self, **extra):
        return self.client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS,
                                                   temperature=0, max_tokens=200, **extra)

    def check_calls(self, calls):
        self.assertEqual(len(calls), 2, calls)
        self.assertEqual([c.type for c in calls], ["function", "function"])
        self.assertEqual(calls[0].function.name, "get_weather")
        self.assertEqual(json.loads(calls[0].function.arguments), {"city": "Zürich", "days": 2})
        self.assertEqual(calls[1].function.name, "get_time")
        self.assertEqual(json.loads(calls[1].function.arguments), {})
        self.assertTrue(all(c.id.startswith("call_") for c in calls))
        self.assertNotEqual(calls[0].id, calls[1].id)

    def test_whole_reply(self):
        c = self.create()
        choice = c.choices[0]
        self.assertEqual(choice.finish_reason, "tool_calls")
        self.assertEqual(choice.message.content, "Checking both.")
        self.check_calls(choice.message.tool_calls)

    def test_stream_deltas(self):
        content = ""
        calls = {}
        finish = None
        for chunk in self.create(stream=True):
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for d in delta.tool_calls or []:
                if d.index not in calls:
                    # A call's first delta names it.
                    self.assertTrue(d.id and d.type == "function" and d.function.name, d)
                    calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
                calls[d.index]["arguments"] += d.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        self.assertEqual(content, "Checking both.")
        self.assertEqual(finish, "tool_calls")
        self.assertEqual(sorted(calls), [0, 1])
        self.assertEqual(calls[0]["name"], "get_weather")
        self.assertEqual(json.loads(calls[0]["arguments"]), {"city": "Zürich", "days": 2})
        self.assertEqual(calls[1]["name"], "get_time")

    def test_stream_helper_puts_the_calls_together(self):
        # The client's own accumulation of streamed deltas.
        with self.client.chat.completions.stream(model=MODEL, messages=MESSAGES, tools=TOOLS,
                                                 temperature=0, max_tokens=200) as stream:
            for _ in stream:
                pass
            final = stream.get_final_completion()
        self.assertEqual(final.choices[0].finish_reason, "tool_calls")
        self.check_calls(final.choices[0].message.tool_calls)

    def test_conversation_with_calls_and_results(self):
        first = self.create().choices[0].message
        messages = MESSAGES + [first.model_dump(exclude_none=True)] + [
            {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "-2C, snow"},
            {"role": "tool", "tool_call_id": first.tool_calls[1].id, "content": "09:41"}]
        again = self.client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                                    temperature=0, max_tokens=200)
        self.assertEqual(again.choices[0].finish_reason, "tool_calls")
        # The calls and results are in the prompt.
        self.assertGreater(again.usage.prompt_tokens, self.create().usage.prompt_tokens + 40)

    def test_parallel_tool_calls_false_and_named_choice(self):
        one = self.create(parallel_tool_calls=False).choices[0]
        self.assertEqual([c.function.name for c in one.message.tool_calls], ["get_weather"])
        # The named function's call is started for the model; this script's reply does not end
        # it well, so that block comes back as text, and the reply's last block (a whole call
        # of get_time) as the one call.
        named = self.create(tool_choice={"type": "function", "function": {"name": "get_time"}})
        self.assertTrue(named.choices[0].message.content.startswith(
            '<tool_call>\n{"name": "get_time", "arguments": Checking both.'))
        self.assertEqual([c.function.name for c in named.choices[0].message.tool_calls],
                         ["get_time"])

    def test_errors_name_the_field(self):
        with self.assertRaises(openai.BadRequestError) as caught:
            self.create(tool_choice={"type": "function", "function": {"name": "nope"}})
        self.assertEqual(caught.exception.body["param"], "tool_choice")
        with self.assertRaises(openai.BadRequestError) as caught:
            self.client.chat.completions.create(
                model=MODEL, messages=MESSAGES, tools=[{"type": "function", "function": {}}])
        self.assertEqual(caught.exception.body["param"], "tools[0].function.name")


class NamedChoiceTest(unittest.TestCase):
    def test_forced_name_and_model_arguments(self):
        server = ScriptedServer('{"city": "Oslo"}}\n</tool_call>')
        try:
            c = server.client.chat.completions.create(
                model=MODEL, messages=MESSAGES, tools=TOOLS, temperature=0, max_tokens=50,
                tool_choice={"type": "function", "function": {"name": "get_weather"}})
            choice = c.choices[0]
            self.assertEqual(choice.finish_reason, "tool_calls")
            self.assertIsNone(choice.message.content)
            self.assertEqual(len(choice.message.tool_calls), 1)
            self.assertEqual(choice.message.tool_calls[0].function.name, "get_weather")
            self.assertEqual(json.loads(choice.message.tool_calls[0].function.arguments),
                             {"city": "Oslo"})
        finally:
            server.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
