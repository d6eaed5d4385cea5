#!/usr/bin/env python3
"""Writes expected/<template>.<case>.txt: each template of conversations.json rendered for each
case by jinja2 the way transformers' apply_chat_template renders (trim_blocks, lstrip_blocks,
loop controls, its tojson), with the messages as Strata's HTTP API hands them over (tool-call
arguments as objects, as vLLM does). A template that cannot add a string and an object (the
official DeepSeek ones write `'...' + arguments`) is rendered again with the arguments as JSON
text, as Strata does. chat_template_test compares Strata's renderer with these files.

Needs jinja2 (pip install jinja2); not part of the build."""

import copy
import json
import os

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                       extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def arguments_as_text(messages):
    messages = copy.deepcopy(messages)
    for m in messages:
        for call in m.get("tool_calls") or []:
            if isinstance(call["function"].get("arguments"), dict):
                call["function"]["arguments"] = json.dumps(call["function"]["arguments"],
                                                           ensure_ascii=False)
    return messages


def main():
    with open(os.path.join(HERE, "conversations.json"), encoding="utf-8") as f:
        spec = json.load(f)
    env = environment()
    for name, tokens in spec["templates"].items():
        with open(os.path.join(HERE, name), encoding="utf-8") as f:
            template = env.from_string(f.read())
        for case, c in spec["cases"].items():
            context = dict(c.get("variables", {}))
            if c.get("with_tools"):
                context["tools"] = spec["tools"]
            context.update(tokens)
            context["add_generation_prompt"] = c["add_generation_prompt"]
            try:
                out = template.render(messages=c["messages"], **context)
            except TypeError:
                out = template.render(messages=arguments_as_text(c["messages"]), **context)
            path = os.path.join(HERE, "expected", f"{name[:-len('.jinja')]}.{case}.txt")
            with open(path, "w", encoding="utf-8") as f:
                f.write(out)


if __name__ == "__main__":
    main()
