#!/usr/bin/python3
"""Writes tests/data/tmpl/goldens.jsonl: what Jinja2 (Debian's python3-jinja2, configured exactly
as Hugging Face transformers configures it for chat templates) renders for
  - the chat templates in tests/data/tmpl/*.jinja over conversations designed here (multi-turn,
    system or not, tools and tool results, thinking on/off, reasoning_content, empty content,
    content as parts, unicode, very long) plus seeded random conversations, and
  - small feature templates (FEATURES below) covering the subset tmpl implements.
Each line: {"name", "template" (file stem) or "source", "vars", "now", "output" | "error"};
"error" is the exception message (raise_exception's is compared byte for byte by test_tmpl,
other errors only as "an error"). Run: /usr/bin/python3 scripts/tmpl-goldens.py [--seed N]
(apt-get install python3-jinja2). test_tmpl reads the file offline.
"""
import argparse
import copy
import json
import os
import random
import sys
from datetime import datetime, timezone

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data", "tmpl")
NOW = 1764000000  # 2025-11-24T16:00:00Z: strftime_now is pinned (the C side injects it too)


def make_env(now):
    """transformers.utils.chat_template_utils._compile_jinja_template, minus AssistantTracker
    (the {% generation %} tag only matters for return_assistant_tokens_mask)."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.fromtimestamp(now, tz=timezone.utc).strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(source, vars_, now=NOW):
    env = make_env(now)
    # a deep copy: Jinja2 can mutate what it is given (`x|indent` does `s += "\n"`, which
    # extends a list in place), and the record must hold the variables as they were
    vars_ = copy.deepcopy(vars_)
    try:
        return {"output": env.from_string(source).render(**vars_)}
    except jinja2.exceptions.TemplateError as e:
        return {"error": str(e), "kind": type(e).__name__}
    except Exception as e:  # TypeError, ValueError... from Python operations
        return {"error": "%s: %s" % (type(e).__name__, e), "kind": type(e).__name__}


SPECIAL = {
    "qwen3": {"eos_token": "<|im_end|>"},  # bos_token null: transformers does not pass it
    "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"},
    "llama3_1": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "gemma3": {"bos_token": "<bos>", "eos_token": "<eos>"},
    "deepseek_v3": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
    # written for these tests (see each file's opening comment), not vendor files
    "tools_llama_style": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "mistral_style": {"bos_token": "<s>", "eos_token": "</s>"},
    "harmony_style": {"bos_token": "<|startoftext|>", "eos_token": "<|return|>"},
}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Zürich"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web \"quoted\" \\ backslash",
        "parameters": {"type": "object", "properties": {
            "q": {"type": "string"}, "max_results": {"type": "integer", "default": 5},
            "ratio": {"type": "number", "default": 0.5}, "safe": {"type": "boolean"}}}}},
]

# U+0000 in a tool's description and enum values (nul_tools)
TOOLS_NUL = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the\x00weather",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City\x00name"},
            "unit": {"type": "string", "enum": ["c\x00", "f"]}},
            "required": ["city"]}}},
]

LONG = ("The quick brown fox jumps over the lazy dog. " * 400)  # ~18 KB


def conversations():
    u = lambda c: {"role": "user", "content": c}
    a = lambda c: {"role": "assistant", "content": c}
    s = lambda c: {"role": "system", "content": c}
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
    call_str = {"id": "call_2", "type": "function",
                "function": {"name": "search", "arguments": "{\"q\": \"kv cache\"}"}}
    yield "single_user", [u("Hello!")], {}
    yield "system_user", [s("You are a helpful assistant."), u("What is 2+2?")], {}
    yield "multi_turn", [s("Be brief."), u("Hi"), a("Hello! How can I help?"), u("Tell me a joke."),
                         a("Why did the chicken cross the road?"), u("Why?")], {}
    yield "no_system_multi", [u("Hi"), a("Hello"), u("Bye")], {}
    yield "no_gen_prompt", [u("Hi"), a("Hello")], {"add_generation_prompt": False}
    yield "empty_content", [u(""), a(""), u("")], {}
    yield "whitespace_content", [u("  padded  \n"), a("\n\nanswer\n"), u("\tq\t")], {}
    yield "unicode", [s("Réponds en français 🇫🇷"), u("日本語のテキスト and emoji 😀👍🏽, RTL: שלום"),
                      a("Ça va — «très bien» ✓"), u("zero\u200bwidth and e\u0301 combining")], {}
    yield "very_long", [s("You summarize."), u(LONG), a("Short summary."), u(LONG[:5000] + " again?")], {}
    yield "thinking_off", [u("Solve 12*13")], {"enable_thinking": False}
    yield "thinking_on", [u("Solve 12*13")], {"enable_thinking": True}
    yield "reasoning_content", [u("What is 7*6?"),
                                {"role": "assistant", "content": "42",
                                 "reasoning_content": "7 times 6 is 42."},
                                u("And 8*6?")], {}
    yield "think_in_content", [u("Q1"), a("<think>\nstep one\n</think>\n\nA1"), u("Q2"),
                               a("<think>\nmore\n</think>\n\nA2")], {}
    yield "tools_call_result", [s("You can use tools."), u("Weather in Paris?"),
                                {"role": "assistant", "content": "", "tool_calls": [call]},
                                {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
                                ], {"tools": TOOLS}
    yield "tools_two_results", [u("Weather in Paris and search kv cache"),
                                {"role": "assistant", "content": "Let me check.",
                                 "tool_calls": [call, call_str]},
                                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                                {"role": "tool", "tool_call_id": "call_2", "content": "results..."},
                                a("It is sunny, and here are results.")], {"tools": TOOLS}
    yield "tools_no_call", [u("Just say hi")], {"tools": TOOLS}
    yield "deepseek_tool_none_content", [u("Weather?"),
                                         {"role": "assistant", "content": None,
                                          "tool_calls": [{"type": "function",
                                                          "function": {"name": "get_weather",
                                                                       "arguments": "{\"city\": \"Oslo\"}"}}]},
                                         {"role": "tool", "content": "cold"},
                                         a("It is cold.")], {}
    yield "parts_content", [{"role": "system", "content": [{"type": "text", "text": "Sys part."}]},
                            {"role": "user", "content": [{"type": "text", "text": "Part one."},
                                                         {"type": "text", "text": "Part two."}]},
                            {"role": "assistant", "content": [{"type": "text", "text": "Reply."}]},
                            {"role": "user", "content": [{"type": "text", "text": "More."}]}], {}
    yield "not_alternating", [u("a"), u("b")], {}
    yield "assistant_first", [a("I start"), u("ok")], {}
    mcall = {"id": "abcDEF123", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Lyon"}}}
    yield "tool_ids_9", [s("Use tools."), u("Weather in Lyon?"),
                         {"role": "assistant", "content": None, "tool_calls": [mcall]},
                         {"role": "tool", "tool_call_id": "abcDEF123", "content": "rainy"},
                         a("Rainy."), u("Thanks")], {"tools": TOOLS}
    yield "thinking_field", [{"role": "developer", "content": "Answer tersely."}, u("2+2?"),
                             {"role": "assistant", "content": "", "thinking": "Add them.",
                              "tool_calls": [call]},
                             {"role": "tool", "content": "{\"temp\": 3}"},
                             {"role": "assistant", "content": "4", "thinking": "Done."}], \
        {"tools": TOOLS, "reasoning_effort": "high", "add_generation_prompt": False}
    yield "kwargs_date_identity", [u("What day is it?")], \
        {"date_string": "01 Jan 2025", "model_identity": "You are Kv.", "tools_in_user_message": False,
         "tools": TOOLS}
    yield "ipython_mapping", [u("run"), {"role": "assistant", "content": None, "tool_calls": [call]},
                              {"role": "ipython", "content": {"result": [1, 2], "ok": True}}], {"tools": TOOLS}
    yield "special_chars", [u("{{ not a tag }} {% neither %} <|im_end|> \\n literal"),
                            a("quote ' and \" and \\")], {}
    # U+0000 in every place text reaches a template (vLLM passes it through, the tokenizer
    # takes it like any other character): contents, parts, tools, tool calls, kwargs
    yield "nul_content", [s("sys\x00tem"), u("a\x00b"), a("\x00"), u("\x00\x00 end \x00")], {}
    yield "nul_parts", [{"role": "user", "content": [{"type": "text", "text": "x\x00y"},
                                                     {"type": "text", "text": "\x00"}]}], {}
    # the same conversation as vLLM hands it to templates that take a string (parts joined
    # with "\n"): test_chat picks this one or nul_parts by the template's content format
    yield "nul_parts_joined", [u("x\x00y\n\x00")], {}
    yield "nul_tools", [u("Weather in Par\x00is?"),
                        {"role": "assistant", "content": "",
                         "tool_calls": [{"id": "nulCall09", "type": "function",
                                         "function": {"name": "get_weather",
                                                      "arguments": {"city": "Par\x00is"}}}]},
                        {"role": "tool", "tool_call_id": "nulCall09", "content": "su\x00nny"}], \
        {"tools": TOOLS_NUL}
    yield "nul_kwargs", [u("What day?")], \
        {"date_string": "01\x00Jan 2025", "model_identity": "You are \x00Kv.",
         "enable_thinking": False}


def random_conversation(rng):
    words = ["alpha", "beta", "γάμμα", "δέλτα", "数据", "缓存", "🙂", "route", "token", "prefix",
             "\n", "  ", "\t", "<tag>", "'", "\"", "\\", "end"]

    def text(lo, hi):
        return " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))

    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": text(1, 20)})
    turns = rng.randint(1, 6)
    for t in range(turns):
        msgs.append({"role": "user", "content": text(0, 40)})
        if t < turns - 1 or rng.random() < 0.3:
            m = {"role": "assistant", "content": text(0, 40)}
            if rng.random() < 0.3:
                m["reasoning_content"] = text(1, 10)
            msgs.append(m)
    kw = {}
    if rng.random() < 0.5:
        kw["enable_thinking"] = rng.random() < 0.5
    if rng.random() < 0.3:
        kw["add_generation_prompt"] = False
    return msgs, kw


# Feature templates: (name, source, vars). Outputs come from Jinja2, not from here.
FEATURES = [
    ("ws_trim_lstrip", "a\n  {% if true %}\n    x\n  {% endif %}\nb", {}),
    ("ws_minus", "a  {%- if true -%}  x  {%- endif -%}  b", {}),
    ("ws_plus", "a\n  {%+ if true %}\nx{% endif +%}\nb", {}),
    ("ws_var_minus", "a \n {{- 'x' -}} \n b", {}),
    ("ws_comment", "a\n  {# c #}\nb {#- c -#} c", {}),
    ("ws_trailing_newline", "x\n", {}),
    ("ws_crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\n", {}),
    ("raw", "{% raw %}{{ x }}{% if %}{% endraw %}|{%- raw -%}  y  {%- endraw -%}|", {}),
    ("for_loop_vars", "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
                      "{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
     {"xs": ["a", "b", "c"]}),
    ("for_else", "{% for x in xs %}{{ x }}{% else %}empty{% endfor %}", {"xs": []}),
    ("for_filter", "{% for x in xs if x > 1 %}{{ x }}{{ loop.index }}{% endfor %}", {"xs": [1, 2, 3]}),
    ("for_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("for_dict", "{% for k in d %}{{ k }}{% endfor %}", {"d": {"z": 1, "y": 2}}),
    ("for_string", "{% for c in 'héllo' %}[{{ c }}]{% endfor %}", {}),
    ("for_prev_next", "{% for x in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}", {}),
    ("for_cycle", "{% for x in range(5) %}{{ loop.cycle('a', 'b') }}{% endfor %}", {}),
    ("break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}"
                       "{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("loop_scope", "{% set x = 0 %}{% for i in range(3) %}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}", {}),
    ("namespace", "{% set ns = namespace(c=0, s='') %}{% for i in range(4) %}{% set ns.c = ns.c + i %}"
                  "{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.c }} {{ ns.s }}", {}),
    ("reverse_slice", "{{ xs[::-1] }} {{ xs[1:] }} {{ xs[:-1] }} {{ xs[::2] }} {{ 'abcdef'[1:4] }} "
                      "{{ 'héllo'[::-1] }} {{ xs[-1] }} {{ xs[10:] }}", {"xs": [1, 2, 3, 4, 5]}),
    ("if_elif", "{% for x in [1,2,3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %}{% endfor %}", {}),
    ("set_block", "{% set b %}  inner {{ 1 + 1 }}\n{% endset %}[{{ b }}]", {}),
    ("set_block_filter", "{% set b | upper | trim %}  inner  {% endset %}[{{ b }}]", {}),
    ("set_tuple", "{% set a, b = 1, 'x' %}{{ a }}{{ b }}", {}),
    ("macro", "{% macro m(a, b='d', c=none) %}<{{ a }}|{{ b }}|{{ c }}>{% endmacro %}"
              "{{ m(1) }}{{ m(1, 2) }}{{ m(1, c=3) }}{{ m(a='k') }}", {}),
    ("macro_varargs", "{% macro m(a) %}{{ a }}{{ varargs }}{% endmacro %}{{ m(1, 2, 3) }}", {}),
    ("macro_too_many", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", {}),
    ("call_block", "{% macro wrap(t) %}<{{ t }}>{{ caller() }}</{{ t }}>{% endmacro %}"
                   "{% call wrap('b') %}body {{ 1 }}{% endcall %}", {}),
    ("call_block_args", "{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}"
                        "{% call(item) each([1,2]) %}[{{ item }}]{% endcall %}", {}),
    ("filter_block", "{% filter upper %}hello {{ 'world' }}{% endfilter %}", {}),
    ("with", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a }}", {}),
    ("ops_arith", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} "
                  "{{ 2 ** 10 }} {{ 7 / 2 }} {{ 1 / 3 }} {{ 2 ** -1 }} {{ 1.5 + 1 }} {{ -3 }} {{ 10 - 2 - 3 }}", {}),
    ("ops_str", "{{ 'a' + 'b' }} {{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ [1] + [2] }}", {}),
    ("ops_compare", "{{ 1 < 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 5 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} "
                    "{{ true == 1 }} {{ [1,2] == [1,2] }} {{ 'x' != 'y' }} {{ 2 >= 2 }} {{ none == none }}", {}),
    ("ops_logic", "{{ true and 'x' }} {{ false or 'y' }} {{ not 0 }} {{ 0 or none }} {{ '' and 1 }} "
                  "{{ not true or true }}", {}),
    ("ops_in", "{{ 'a' in 'cat' }} {{ 1 in [1,2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} "
               "{{ 3 not in [1] }} {{ '' in 'x' }}", {}),
    ("condexpr", "{{ 'y' if true else 'n' }} {{ 'y' if false else 'n' }} [{{ 'y' if false }}]", {}),
    ("literals", "{{ [1, 'a', none, true, 1.5, {'k': (1, 2)}] }} {{ (1,) }} {{ () }} {{ {} }} "
                 "{{ 1_000 }} {{ 1e3 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e-5 }} {{ 123456789.125 }}", {}),
    ("string_escapes", "{{ 'a\\nb\\tc\\\\d\\'e\\\"f\\x41\\u00e9\\U0001F600\\101\\q' }}|{{ \"it's\" }}|"
                       "{{ 'adj' 'acent' }}", {}),
    ("repr_strings", "{{ ['it\\'s', \"q\\\"\", 'both\\'\"', 'nl\\n', 'tab\\t', 'bs\\\\', 'ü'] }}", {}),
    ("str_methods", "{{ s.startswith('He') }} {{ s.endswith('!') }} {{ s.split(' ') }} {{ s.split() }} "
                    "{{ s.split(' ', 1) }} {{ s.rsplit(' ', 1) }} {{ s.upper() }} {{ s.lower() }} "
                    "{{ s.replace('l', 'L') }} {{ s.replace('l', 'L', 1) }} {{ s.title() }} "
                    "{{ s.find('o') }} {{ s.rfind('o') }} {{ s.count('l') }} {{ '-'.join(['a','b']) }} "
                    "{{ s.startswith(('x', 'H')) }} {{ 'a b'.capitalize() }}", {"s": "Hello, World wide!"}),
    ("str_strip", "[{{ s.strip() }}][{{ s.lstrip() }}][{{ s.rstrip() }}][{{ 'xxhixx'.strip('x') }}]"
                  "[{{ '\\n\\nA\\n'.lstrip('\\n') }}][{{ 'a\\u3000'.strip() }}]", {"s": "  \t hi \n "}),
    ("str_split_edge", "{{ ''.split() }} {{ ''.split(',') }} {{ ',a,,b,'.split(',') }} {{ '  a  b  '.split(None, 1) }} "
                       "{{ 'a b c'.rsplit(None, 1) }}", {}),
    ("dict_methods", "{{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }} {{ d.get('a') }} "
                     "{{ d.get('z') }} {{ d.get('z', 5) }} {{ d['a'] }} {{ d.a }} [{{ d.z }}]", {"d": {"a": 1, "b": [2]}}),
    ("append_refused", "{% set xs = [] %}{{ xs.append(1) }}", {}),
    ("tests", "{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ n is none }} {{ s is string }} "
              "{{ 1 is number }} {{ 1.5 is float }} {{ 1 is integer }} {{ true is boolean }} {{ d is mapping }} "
              "{{ xs is iterable }} {{ s is iterable }} {{ xs is sequence }} {{ 4 is even }} {{ 3 is odd }} "
              "{{ 9 is divisibleby 3 }} {{ 9 is divisibleby(2) }} {{ 1 is eq 1 }} {{ 'a' is in 'abc' }} "
              "{{ true is true }} {{ false is false }} {{ n is sameas none }} {{ 1 is not string }} "
              "{{ 'ab' is lower }} {{ 'AB' is upper }} {{ 2 is gt 1 }} {{ 2 is lt 1 }} {{ range is callable }}",
     {"x": 1, "n": None, "s": "str", "d": {}, "xs": [1]}),
    ("undefined", "[{{ u }}][{{ u | default('dflt') }}][{{ u | length }}][{{ u is defined }}]"
                  "[{% for x in u %}x{% endfor %}][{{ 'k' in u }}][{{ u ~ 'c' }}][{{ not u }}][{{ d.missing }}]"
                  "[{{ d.missing is defined }}]", {"d": {}}),
    ("undefined_attr_error", "{{ u.attr }}", {}),
    ("undefined_add_error", "{{ u + 1 }}", {}),
    ("filters_basic", "[{{ '  x  ' | trim }}][{{ [1,2,3] | length }}][{{ 'héllo' | length }}][{{ [1,2] | join(', ') }}]"
                      "[{{ [1,2] | first }}][{{ [1,2] | last }}][{{ 'ab' | list }}][{{ 'abc' | upper }}][{{ 'ABC' | lower }}]"
                      "[{{ 'a-b' | replace('-', '+') }}][{{ 42 | string }}][{{ '42' | int + 1 }}][{{ 'x' | int }}]"
                      "[{{ 3.7 | int }}][{{ '1.5' | float }}][{{ '<b>' | safe }}][{{ [3,1,3,2,1] | unique | list }}]"
                      "[{{ 'hello world' | title }}][{{ 'hello' | capitalize }}][{{ -3 | abs }}][{{ [1,2] | reverse | list }}]"
                      "[{{ [3,1,2] | sort }}][{{ [3,1,2] | sort(reverse=true) }}][{{ [1,2,3] | sum }}][{{ [4,2] | min }}][{{ [4,2] | max }}]"
                      "[{{ 'ab' | count }}][{{ none | default('n') }}][{{ '' | default('e', true) }}][{{ 0 | d('z', boolean=true) }}]", {}),
    ("filters_map_select", "{{ users | map(attribute='name') | list }} {{ users | selectattr('admin') | map(attribute='name') | join(',') }} "
                           "{{ users | rejectattr('admin') | list | length }} {{ [1,2,3,4] | select('even') | list }} "
                           "{{ [1,2,3,4] | reject('odd') | list }} {{ users | selectattr('name', 'equalto', 'b') | list | length }} "
                           "{{ ['a','B'] | map('upper') | list }} {{ [0,1,'',None,'x'] | select | list }} "
                           "{{ users | map(attribute='age', default=0) | list }}",
     {"users": [{"name": "a", "admin": True, "age": 3}, {"name": "b", "admin": False}]}),
    ("filters_items_dictsort", "{{ d | items | list }} {{ d | dictsort }} {{ d | dictsort(by='value') }} "
                               "{{ d | dictsort(reverse=true) }}", {"d": {"b": 2, "a": 3, "C": 1}}),
    ("filter_indent", "[{{ 'a\\nb\\n\\nc' | indent }}][{{ 'a\\nb' | indent(2, true) }}][{{ 'a\\n\\nb' | indent(2, blank=true) }}]"
                      "[{{ 'x\\ny' | indent('> ') }}]", {}),
    ("tojson", "{{ v | tojson }}|{{ v | tojson(indent=2) }}|{{ 'é\"\\n\\u0001\\u007f</script>' | tojson }}|"
               "{{ [] | tojson(indent=2) }}|{{ {} | tojson }}|{{ 1.0 | tojson }}|{{ none | tojson }}",
     {"v": {"b": [1, 2.5, True, None, "s"], "a": {"nested": {}, "list": []}, "ü": "ß"}}),
    ("tojson_undefined", "{{ u | tojson }}", {}),
    ("print_types", "{{ none }} {{ true }} {{ false }} {{ 1.0 }} {{ 10 / 4 }} {{ {'a': [1, 'x']} }} {{ (1, 'a') }}", {}),
    ("globals", "{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(5, 0, -2) | list }} "
                "{{ dict(a=1, b='x') }} {{ strftime_now('%Y-%m-%d %H:%M %d %b %Y') }}", {}),
    ("raise", "{% if true %}{{ raise_exception('Custom message: ' ~ 42) }}{% endif %}", {}),
    ("range_too_big", "{{ range(200000) | length }}", {}),
    ("getitem_attr", "{{ m['role'] }} {{ m.role }} {{ m.content[0].text }} {{ xs.0 }} {{ xs[-1] }} "
                     "[{{ xs[5] }}] {{ 'abc'[1] }} {{ 'abc'[-1] }}",
     {"m": {"role": "user", "content": [{"text": "t"}]}, "xs": [10, 20]}),
    ("precedence", "{{ '1' + 2 | string }} {{ -1 | abs }} {{ xs | length - 1 }} {{ not true == false }} "
                   "{{ 'a' ~ 'b' | upper }} {{ 2 * 3 ** 2 }} {{ (xs | length) > 1 and xs[0] == 1 }}", {"xs": [1, 2]}),
    ("nested_loops", "{% for i in range(3) %}{% for j in range(i) %}{{ loop.index }}/{{ i }} {% endfor %}{% endfor %}", {}),
    ("type_error", "{{ 'a' + 1 }}", {}),
    ("compare_error", "{{ 1 < 'a' }}", {}),
    ("int_div_zero", "{{ 1 // 0 }}", {}),
    ("none_iter", "{% for x in n %}{% endfor %}", {"n": None}),
    ("content_parts_loop", "{% for message in messages %}{% for part in message['content'] %}{{ part.text }}"
                           "{% endfor %}{% endfor %}", {"messages": [{"content": [{"text": "a"}, {"text": "b"}]}]}),
    ("bool_int_arith", "{{ true + 1 }} {{ 3 * false }} {{ 5 - 1.5 }} {{ 2 ** 62 }}", {}),
    ("set_in_if_leaks", "{% if true %}{% set v = 'in' %}{% endif %}{{ v }}", {}),
    ("macro_scope", "{% set g = 'global' %}{% macro m() %}{{ g }}{% endmacro %}{{ m() }}", {}),
    ("dict_literal_order", "{{ {'z': 1, 'a': 2, 'z': 3} }}", {}),
    ("loop_in_macro_break", "{% macro m(xs) %}{% for x in xs %}{% if x > 1 %}{% break %}{% endif %}{{ x }}{% endfor %}{% endmacro %}"
                            "{{ m([1,2,3]) }}{{ m([0]) }}", {}),
    ("multiline_tag", "{{\n  'a' ~\n  'b'\n}}{%\n if true\n%}c{% endif %}", {}),
    ("nested_loop_outer", "{% for a in 'xy' %}{% set outer = loop %}{% for b in 'pq' %}{{ outer.index }}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{% endfor %}", {}),
    ("macro_late_binding", "{% set x = 1 %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 2 %}{{ m() }}", {}),
    ("macro_namespace", "{% set ns = namespace(n=0) %}{% macro bump() %}{% set ns.n = ns.n + 1 %}{% endmacro %}{{ bump() }}{{ bump() }}{{ ns.n }}", {}),
    ("undefined_filters", "[{{ u|trim }}][{{ u|upper }}][{{ u|join(',') }}][{{ u|first }}][{{ u|list }}][{{ u|string }}][{{ u|items|list }}][{{ u|sum }}][{{ u|min }}][{{ u|replace('a', 'b') }}]", {}),
    ("undefined_int", "{{ u|int }}", {}),
    ("undefined_indent", "{{ u|indent }}", {}),
    ("none_length", "{{ none|length }}", {}),
    ("leading_ws_tag", "  {% if true %}x{% endif %}\n  {%- if true %}y{% endif %}", {}),
    ("two_trailing_newlines", "x\n\n", {}),
    ("slice_none", "{{ xs[none:2] }} {{ xs[1:none] }} {{ xs[::none] }} {{ xs[-100:100] }} {{ xs[3:1:-1] }} {{ xs[::-2] }}", {"xs": [0, 1, 2, 3, 4]}),
    ("pow_unary", "{{ -2 ** 2 }} {{ 2 ** 3 ** 2 }} {{ 2 ** 0.5 }} {{ 1e308 * 10 }} {{ -(1e308 * 10) }}", {}),
    ("arith_more", "{{ 10 // 3.0 }} {{ 7 % -3 }} {{ -7.5 // 2 }} {{ 5.5 % 2 }} {{ 3 / 1 }} {{ 0.5 * 4 }} {{ 1 - 0.9 }}", {}),
    ("cond_chain", "{% for x in [1,2,3] %}{{ 'a' if x == 1 else 'b' if x == 2 else 'c' }}{% endfor %} {{ (u | default(none)) is none }}", {}),
    ("tojson_more", "{{ [1, [2, 3], {'a': []}] | tojson }}|{{ {'a': [1, {'b': 2}]} | tojson(indent=0) }}|{{ {'a': 1} | tojson(indent=none) }}|{{ 'x' | tojson | safe }}", {}),
    ("selectattr_tests", "{{ ms | selectattr('content', 'defined') | list | length }} {{ ms | rejectattr('content', 'none') | map(attribute='role') | join }} "
                         "{{ [1, 2, 5] | select('in', [1, 5]) | list }} {{ [1, 5, 9] | select('gt', 4) | list }} {{ ms | selectattr('role', 'eq', 'user') | list | length }}",
     {"ms": [{"role": "user", "content": "a"}, {"role": "assistant", "content": None}, {"role": "tool"}]}),
    ("replace_empty", "{{ 'abc' | replace('', '-') }} {{ 'aaa'.replace('a', 'b', 2) }} {{ '  x  ' | trim('x ') }} {{ ' a b '.split(' ') }}", {}),
    ("chained_methods", "{{ '  Hello World  '.strip().lower().split(' ') }} {{ m['content'][0]['text'].upper() }}", {"m": {"content": [{"text": "hi"}]}}),
    ("caller_undefined", "{{ caller is defined }}{% macro m() %}{{ caller is defined }}{% endmacro %}{{ m() }}", {}),
    ("loop_length_filtered", "{% for x in range(10) if x is odd %}{{ loop.length }}{{ loop.last }}{% endfor %}", {}),
    ("ws_mixed", "{%- for i in range(3) -%}\n  {{ i }}\n{%- endfor %}\n{% if true %}  a  {% endif %}  \n  b", {}),
    ("ws_var_lines", "a\n  {{ 'x' }}\n  {% set y = 1 %}\n  b {# c #} d\n    {#- x #}\ne", {}),
    ("dict_iteration_order", "{% for k, v in d | dictsort %}{{ k }}{{ v }}{% endfor %} {% for k in d.keys() %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": 2, "c": 3}}),
    ("string_compare", "{{ 'abc' < 'abd' }} {{ 'Z' < 'a' }} {{ 'é' > 'z' }} {{ [1, 2] < [1, 3] }} {{ 'a' == 'a' }}", {}),
    ("is_tests_more", "{{ u is not defined }} {{ none is none }} {{ 'x' is not none }} {{ 3 is divisibleby(3) }} {{ 1.5 is number }} "
                      "{{ true is number }} {{ true is integer }} {{ d is iterable }} {{ 5 is iterable }} {{ 'a' is sequence }} {{ d.x is undefined }}", {"d": {}}),
    ("map_string", "{{ [1, 2, 3] | map('string') | join('-') }} {{ ['a', 'b'] | map('upper') | join }} {{ [' a ', 'b '] | map('trim') | list }}", {}),
    ("set_outer_in_loop_for_else", "{% for x in [] %}{% else %}{% set z = 'e' %}{{ z }}{% endfor %}[{{ z }}]", {}),
    ("join_attr", "{{ users | join(', ', attribute='name') }} {{ [1, none, 'x'] | join('|') }}", {"users": [{"name": "a"}, {"name": "b"}]}),
    ("int_float_filters", "{{ '  12 ' | int }} {{ '0x1A' | int }} {{ '1e3' | float }} {{ 'abc' | float }} {{ true | int }} {{ '3.9' | int }} {{ 7 | float }} {{ '1_000' | int }} {{ '1_0' | float }} {{ '_1' | int }} {{ '1__0' | int }} {{ '' | int }} {{ ' ' | int(5) }}", {}),
    ("first_last_string", "{{ 'abc' | first }}{{ 'abc' | last }}{{ range(3) | reverse | list }}{{ [] | first }}", {}),
    ("unique_case", "{{ ['a', 'A', 'b', 'B', 'a'] | unique | list }} {{ ['a', 'A'] | unique(case_sensitive=true) | list }}", {}),
    ("str_find_count", "{{ 'héllo wörld'.find('w') }} {{ 'aaa'.count('a') }} {{ 'abc'.find('z') }} {{ 'abcabc'.rfind('b') }} {{ 'x'.count('') }}", {}),
    ("dict_get_default", "{{ d.get('a', 'z') }} {{ d.get('b', 'z') }} {{ d.get('c') is none }} {{ d['b'] is none }}", {"d": {"a": 1, "b": None}}),
    ("loop_index_in_filter_head", "{% for x in xs if x.keep %}{{ loop.index }}:{{ x.v }} {% endfor %}", {"xs": [{"keep": True, "v": 1}, {"keep": False, "v": 2}, {"keep": True, "v": 3}]}),
    ("recursion_macro", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * (fact(n - 1) | int) }}{% endif %}{% endmacro %}{{ fact(10) }}", {}),
    ("tojson_options", "{{ v | tojson(sort_keys=true) }}|{{ v | tojson(separators=(',', ':')) }}|{{ v | tojson(indent=2, separators=(', ', ': ')) }}|"
                       "{{ v | tojson(ensure_ascii=true) }}|{{ v | tojson(true) }}|{{ v | tojson(false, 1, none, true) }}",
     {"v": {"b": [1, {"z": 1, "y": "é😀"}], "a": "ß", "c": {}}}),
    ("undefined_in_container", "{{ [u, 1] }} {{ {'a': u} }} {{ (u,) }}", {}),
    ("percent_format", "{{ '%s-%d|%5s|%-4d|%.2f|%r|%x|%%|%05d|%+d|%s' % ('a', 3.9, 'é', 7, 2.345, 'q', 255, 42, 5, [1]) }}"
                       "{{ '%.1s|%3.1f|%X|%o|%i' % ('ab', 2.25, 255, 8, -3) }}{{ '%x' % -255 }}{{ '<%s>' % u }}{{ 'n=%d' % n }}", {"n": 4}),
    ("percent_format_errors", "{{ 'x' % 1 }}", {}),
    ("percent_format_too_few", "{{ '%s %s' % 1 }}", {}),
    ("falsy_map_select", "[{{ none | map('string') | list }}][{{ '' | select | list }}][{{ 0 | selectattr('a') | list }}]", {}),
    ("odd_even_floats", "{{ 2.5 is odd }} {{ 3.0 is odd }} {{ 4.0 is divisibleby 2 }} {{ true is odd }} {{ -3 is odd }} {{ 7 is divisibleby(-7) }}", {}),
    ("unhashable", "{{ [[1], [1]] | unique | list }}", {}),
    ("unhashable_in", "{{ [1] in {'a': 1} }}", {}),
    ("markup", "{{ '<' + ('x'|safe) }} {{ '<' ~ ('x'|safe) }} {{ ('x'|safe) + '<' }} {{ ['<'|safe, 'a'] }} {{ ('<a>'|safe)|upper }} "
               "{{ ('<%s>'|safe) % '&' }} {{ ('a'|safe) == 'a' }} {{ ('a'|safe) is string }} {{ ['a'|safe]|join(',') }} "
               "{{ [(' b '|safe)|trim, (' c '|safe).strip()] }} {{ ('q'|safe)|tojson }} {{ (5|safe) + '&' }}", {}),
    ("mod_sign_mapping", "{{ 1 % -0.5 }} {{ -1 % 0.5 }} {{ 0.0 % 2 }} {{ 'x' % u }} {{ 'x' % [1] }} {{ 'x' % {'a': 1} }} {{ 'x%s' % [1] }}", {}),
    ("case_unicode", "{{ 'héllo wörld ß'|upper }}|{{ 'ÀÉÎÕÜ ĞİŞ Ÿ'|lower }}|{{ 'ΟΔΟΣ ΣΑΣ Σ'|lower }}|{{ 'привет мир'|title }}|"
                     "{{ 'éCOLE'|capitalize }}|{{ 'straße'|title }}|{{ 'a中b x-y (z) they\\'re'|title }}|{{ 'a中b they\\'re'.title() }}|"
                     "{{ 'Ωμέγα Ϊ'|upper }}|{{ 'ĳ ŉ ſ ı'|upper }}|{{ 'Việt Nam ỨNG'|lower }}|{{ 'Ａｂｃ'|upper }}|{{ 'Արմ'|upper }}|"
                     "{{ 'straße'.upper() }}|{{ 'ÉCOLE'.lower() }}|{{ 'ärger' is lower }}|{{ 'ÄRGER' is upper }}|{{ 'ß' is lower }}", {}),
    ("format_filter", "{{ '%s=%d' | format('a', 3) }} {{ '%s' | format({'k': [1]}) }} {{ '%.2f%%' | format(12.345) }} "
                      "{% for k in d %}{{ k }}=\"{{ '%s' | format(d[k]) }}\"{% if not loop.last %}, {% endif %}{% endfor %}",
     {"d": {"city": "Paris", "n": 2, "ok": True, "l": [1, "x"]}}),
    ("float_print", "{{ 1e100 }} {{ -0.0 }} {{ 3.0 * 1.1 }} {{ 100.0 }} {{ 0.0001 }} {{ 1e15 + 0.5 }}", {}),
    # U+0000 in values and literals: strings are (pointer, length) everywhere in tmpl
    ("nul_strings", "[{{ s }}][{{ s | length }}][{{ s | tojson }}][{{ [s, 'l\\x00'] }}][{{ s.split() }}]"
                    "[{{ s.split('\\x00') }}][{{ s.strip() }}][{{ s | trim }}][{{ s.upper() }}][{{ s | title }}]"
                    "[{{ s.replace('\\x00', '0') }}][{{ '\\x00' in s }}][{{ s.find('\\x00') }}][{{ s.count('\\x00') }}]"
                    "[{{ s[1:4] }}][{{ s | list }}][{{ s | reverse }}][{{ s ~ '\\x00' }}][{{ '<%s>' % s }}]"
                    "[{{ s == ' a\\x00b \\x00' }}][{{ s.startswith(' a\\x00') }}][{{ s.endswith('\\x00') }}]"
                    "[{{ s | string | length }}][{{ s | indent(2) }}][{{ s.lstrip(' a') }}]",
     {"s": " a\x00b \x00"}),
    ("nul_numbers", "{{ '1\\x00' | int }} {{ '1.5\\x00' | float }} {{ '\\x002' | int(7) }} {{ n | int }}",
     {"n": "3\x00"}),
    ("nul_dicts", "{{ d | tojson }} {{ d | dictsort }} {{ d['a\\x00'] }} {{ d.get('a\\x00b') }} "
                  "{{ 'a\\x00' in d }} {{ d | tojson(separators=(',\\x00', ':')) }} {{ d.items() | list }}",
     {"d": {"a\x00b": 1, "a": 2, "a\x00": "v\x00"}}),
    ("nul_sort_compare", "{{ xs | sort }} {{ 'a' < 'a\\x00' }} {{ 'a\\x00' < 'a\\x01' }} {{ xs | unique | list }} "
                         "{{ xs | max }} {{ xs | join('\\x00') }}", {"xs": ["b", "a\x00", "a", "a\x00"]}),
    ("nul_format_error", "{{ '%\\x00d' % 1 }}", {}),
]


# Random feature templates: expressions and statements drawn from a small grammar over fixed
# variables, so the subset is exercised in combinations nobody wrote by hand. The grammar keeps
# to what both sides define the same way (small ints, ASCII case mapping, no printing of
# methods); whatever Jinja2 does with the result (output or error) is the golden.
RVARS = {"n": 3, "f": 2.5, "s": "Hello World", "e": "", "u8": "héllo wörld", "t": True,
         "z": None, "xs": [3, 1, 2], "ws": ["b", "a", "C"], "d": {"k": "v", "n": 2, "l": [1, 2]},
         "ms": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "x": 1},
                {"role": "tool", "content": None}]}


def random_template(rng, depth=0):
    def atom():
        c = rng.randrange(10)
        if c == 0:
            return str(rng.randrange(-5, 20))
        if c == 1:
            return rng.choice(["1.5", "0.25", "-2.0", "1e3", "3.0"])
        if c == 2:
            return rng.choice(["'a'", "\"b c\"", "''", "'x\\ny'", "'Ab'", "' pad '"])
        if c == 3:
            return rng.choice(["true", "false", "none"])
        if c == 4:
            return rng.choice(["[1, 2]", "['x', 'y']", "[]", "(1, 'a')", "{'a': 1}", "{}"])
        if c == 5:
            return rng.choice(["undef", "d.missing", "ms[5]"])
        return rng.choice(list(RVARS) + ["d.k", "d['n']", "ms[0].role", "ms[-1].content", "xs[1]",
                                         "ms[1]['x']", "d.l", "s[1:4]", "xs[::-1]", "ws|length"])

    def expr(k=0):
        if k > 2 or rng.random() < 0.35:
            return atom()
        c = rng.randrange(12)
        a, b = expr(k + 1), expr(k + 1)
        if c == 0:
            return "(%s %s %s)" % (a, rng.choice(["+", "-", "*", "//", "%", "/"]), b)
        if c == 1:
            return "(%s ~ %s)" % (a, b)
        if c == 2:
            return "(%s %s %s)" % (a, rng.choice(["==", "!=", "<", ">=", "in", "not in"]), b)
        if c == 3:
            return "(%s %s %s)" % (a, rng.choice(["and", "or"]), b)
        if c == 4:
            return "(not %s)" % a
        if c == 5:
            return "(%s if %s else %s)" % (a, b, expr(k + 1))
        if c == 6:
            return "(%s is %s)" % (a, rng.choice(["defined", "undefined", "none", "string", "number",
                                                  "integer", "mapping", "iterable", "sequence",
                                                  "odd", "even", "not none", "divisibleby 2",
                                                  "eq 3", "in [1, 2, 3]", "true", "boolean"]))
        if c == 7:
            return "(%s | %s)" % (a, rng.choice(["length", "string", "trim", "first", "last", "list",
                                                 "default('dflt')", "default(1, true)", "join('-')",
                                                 "tojson", "int", "float", "lower", "upper",
                                                 "reverse | list", "unique | list", "sort",
                                                 "items | list", "dictsort", "abs", "count",
                                                 "replace('l', 'L')", "indent(2)", "capitalize",
                                                 "select('odd') | list", "map('string') | join",
                                                 "selectattr('content') | list | length",
                                                 "map(attribute='role') | join(',')", "sum",
                                                 "min", "max", "title", "safe"]))
        if c == 8:
            return "%s.%s" % (rng.choice(["s", "e", "u8", "d.k", "ms[0].role", "' x y '", "'ΣΟΦΊΑ Über'"]),
                              rng.choice(["upper()", "lower()", "strip()", "split()", "split('l')",
                                          "startswith('H')", "endswith('d')", "replace('o', '0')",
                                          "title()", "find('o')", "count('l')", "lstrip('H')",
                                          "rsplit(' ', 1)", "capitalize()"]))
        if c == 9:
            return "%s.%s" % (rng.choice(["d", "ms[1]", "{'b': 1, 'a': 2}"]),
                              rng.choice(["keys() | list", "values() | list", "items() | list",
                                          "get('k')", "get('zz', 0)", "get('x')"]))
        if c == 10:
            return "[%s, %s]" % (a, b)
        # subscripts of variables only: Jinja2's optimizer folds constant subscripts through
        # its lenient getitem (a constant `(none)[::2]` prints '', a variable one raises)
        return "(%s)[%s]" % (rng.choice(list(RVARS) + ["d.l", "ms[0]", "d.k"]),
                             rng.choice(["0", "-1", "1:", ":1", "::2", "'k'", "a" if False else "1"]))

    def stmt(k=0):
        if k > 2 or rng.random() < 0.3:
            return "{{ %s }}" % expr()
        c = rng.randrange(11)
        if c == 7:
            return ("{%% macro wrap(t) %%}<{{ t }}>{{ caller(t) }}</{{ t }}>{%% endmacro %%}"
                    "{%% call(x) wrap(%s) %%}[{{ x }}]%s{%% endcall %%}" % (atom(), body(k + 1)))
        if c == 8:
            return "{%% with w = %s, w2 = %s %%}{{ w }}{{ w2 }}%s{%% endwith %%}" % (expr(), atom(), body(k + 1))
        if c == 9:
            return ("{%% for x in %s %%}{{ loop.previtem }}|{{ loop.nextitem }}|{{ loop.cycle('a', 'b') }}"
                    "|{{ loop.revindex }}{%% if loop.index is even %%}{%% continue %%}{%% endif %%}%s{%% endfor %%}"
                    % (rng.choice(["xs", "ws", "range(4)", "d.items() | list", "ms | map(attribute='role')"]),
                       body(k + 1)))
        if c == 10:
            return "{%% set blk %%}%s{%% endset %%}[{{ blk }}]{{ blk | length }}" % body(k + 1)
        if c == 0:
            return "{%% if %s %%}%s{%% elif %s %%}%s{%% else %%}%s{%% endif %%}" % (
                expr(), body(k + 1), expr(), body(k + 1), body(k + 1))
        if c == 1:
            it = rng.choice(["xs", "ws", "ms", "d", "s", "range(3)", "[]", "undef", "d.l", "ms[1:]"])
            flt = " if %s" % expr() if rng.random() < 0.2 else ""
            els = "{%% else %%}%s" % body(k + 1) if rng.random() < 0.3 else ""
            return "{%% for it in %s%s %%}{{ loop.index }}{{ loop.first }}{{ loop.last }}[{{ it }}]%s%s{%% endfor %%}" % (
                it, flt, body(k + 1), els)
        if c == 2:
            return "{%% set v%d = %s %%}{{ v%d }}" % (k, expr(), k)
        if c == 3:
            return "{%% set ns = namespace(a=%s) %%}{%% for i in range(2) %%}{%% set ns.a = ns.a ~ i %%}{%% endfor %%}{{ ns.a }}" % expr()
        if c == 4:
            return "{%% macro mm(p, q=%s) %%}<{{ p }}|{{ q }}>%s{%% endmacro %%}{{ mm(%s) }}{{ mm(%s, q=%s) }}" % (
                atom(), body(k + 1), expr(), expr(), atom())
        # filter blocks: string filters only (Jinja2 writes a block's filter result without
        # str(), so `{% filter length %}` fails there); no upper/lower: case mapping is
        # ASCII-only here (docs/chat-templates.md)
        if c == 5:
            return "{%% filter %s %%}%s{%% endfilter %%}" % (
                rng.choice(["trim", "replace('l', 'L')", "indent(2)"]), body(k + 1))
        return "{%% for a in range(4) %%}{%% if a == 2 %%}{%% break %%}{%% endif %%}%s{%% endfor %%}" % body(k + 1)

    def body(k):
        ws = rng.choice(["", " ", "\n", "\n  ", " - "])
        return ws.join(stmt(k) for _ in range(rng.randint(1, 3)))

    src = body(depth)
    # whitespace control sprinkled on the tags
    if rng.random() < 0.5:
        src = src.replace("{%", rng.choice(["{%-", "{%", "\n  {%"])).replace("%}", rng.choice(["-%}", "%}", "%}\n"]))
    return src


def write_corpus(d, rng):
    """fuzz_tmpl inputs: TEMPLATE '\\0' VARBYTES, from the real templates and the features."""
    os.makedirs(d, exist_ok=True)  # other files there (fuzzer finds, regress-*) are kept
    srcs = []
    for name in sorted(SPECIAL):
        with open(os.path.join(DATA, name + ".jinja"), "rb") as f:
            srcs.append((name, f.read()))
    for fname, source, _ in FEATURES:
        srcs.append(("feature-" + fname, source.encode()))
    for name, src in srcs:
        var = bytes(rng.randrange(256) for _ in range(rng.randrange(16, 200)))
        with open(os.path.join(d, name), "wb") as f:
            f.write(src + b"\0" + var)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=20261125)
    ap.add_argument("--random", type=int, default=40, help="random conversations per template")
    ap.add_argument("--random-templates", type=int, default=400, help="random feature templates")
    ap.add_argument("--out", default=os.path.join(DATA, "goldens.jsonl"))
    ap.add_argument("--corpus", default=os.path.join(HERE, "..", "tests", "fuzz", "corpus", "tmpl"),
                    help="also (re)writes the fuzz_tmpl seed corpus here")
    args = ap.parse_args()
    write_corpus(args.corpus, random.Random(args.seed))
    print("tmpl-goldens: jinja2 %s, seed %d" % (jinja2.__version__, args.seed), file=sys.stderr)
    rng = random.Random(args.seed)
    lines = []
    names = sorted(n for n in SPECIAL)
    for name in names:
        with open(os.path.join(DATA, name + ".jinja"), encoding="utf-8") as f:
            source = f.read()
        convs = list(conversations())
        for i in range(args.random):
            msgs, kw = random_conversation(rng)
            convs.append(("random_%d" % i, msgs, kw))
        for cname, msgs, kw in convs:
            vars_ = {"messages": msgs, "tools": kw.get("tools"), "documents": None,
                     "add_generation_prompt": kw.get("add_generation_prompt", True)}
            vars_.update(SPECIAL[name])
            for k, v in kw.items():
                if k not in ("tools", "add_generation_prompt"):
                    vars_[k] = v
            rec = {"name": "%s/%s" % (name, cname), "template": name, "vars": vars_, "now": NOW}
            rec.update(render(source, vars_))
            lines.append(rec)
    for fname, source, vars_ in FEATURES:
        rec = {"name": "feature/" + fname, "source": source, "vars": vars_, "now": NOW}
        rec.update(render(source, vars_))
        lines.append(rec)
    # random templates: most random expressions fail somewhere (undefined arithmetic, mixed
    # types), so keep every one that renders and errors only up to a quarter of the set
    trng = random.Random(args.seed + 1)
    kept = errs = tried = 0
    while kept < args.random_templates:
        source = random_template(trng)
        tried += 1
        res = render(source, RVARS)
        if "error" in res:
            if errs >= args.random_templates // 4:
                continue
            errs += 1
        rec = {"name": "random-template/%d" % kept, "source": source, "vars": RVARS, "now": NOW}
        rec.update(res)
        lines.append(rec)
        kept += 1
    print("tmpl-goldens: %d random templates kept of %d drawn (%d errors)" % (kept, tried, errs),
          file=sys.stderr)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(json.dumps({"seed": args.seed, "jinja2": jinja2.__version__}) + "\n")
        for rec in lines:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    errs = sum(1 for r in lines if "error" in r)
    print("tmpl-goldens: %d cases (%d expected errors) -> %s" % (len(lines), errs, args.out),
          file=sys.stderr)


if __name__ == "__main__":
    main()
