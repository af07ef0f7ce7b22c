#!/usr/bin/env python3
"""Tokenizer folders saved by transformers itself, each holding the chat template(s) in one of
the places transformers reads them from, with what transformers renders from each. Made once,
never in CI (it needs transformers):

    /path/to/venv/bin/python scripts/reference/chat_template_folders.py \
        target/models/HuggingFaceTB/SmolLM2-135M-Instruct tests/fixtures/chat-templates

with transformers==5.17.0 (any 5.x saves the same files). For each folder of OUT it writes the
files `save_pretrained` wrote, except tokenizer.json when it is byte-identical to the model's
own (the tests then take the model's; the script checks that it is), and OUT/cases.json:

- how each folder was made, and what `AutoTokenizer.from_pretrained(folder).chat_template` is
  (a string, or a dict of named templates);
- for every conversation, what `apply_chat_template(..., tokenize=False)` renders from a fresh
  load of the folder, with and without tools and with template keyword arguments
  (`enable_thinking`, which vLLM passes through `chat_template_kwargs`), or the error
  transformers raises (a dict with no `default` and no tools).

Folders:
- `transformers5`: `save_pretrained` of the model's tokenizer, as every transformers 5.x does:
  the template in chat_template.jinja, none in tokenizer_config.json.
- `named`: a dict {default, tool_use}: chat_template.jinja and
  additional_chat_templates/tool_use.jinja.
- `extras-only`: a dict {tool_use, thinking} without `default`: additional_chat_templates/ only.
- `legacy-string`: `save_pretrained(save_jinja_files=False)` of one template: the
  `chat_template` string inside tokenizer_config.json (transformers <= 4.4x, and what
  `sous import gguf` writes).
- `legacy-list`: the same with the dict {default, tool_use}: a list of {name, template}.
- `jinja-over-config`: the legacy-string folder with the chat_template.jinja of another save
  copied beside it (a Hub repository updated by hand): transformers takes the file.
"""

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

import transformers
from transformers import AutoTokenizer

# A template that lists the tools before the conversation, in the shape tool-use templates
# have (the tools' JSON schemas through `tojson`).
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou may call these tools:\n"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}<|im_end|>\n{% endif %}"
    "{%- for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# A template that reads a keyword argument (Qwen3's `enable_thinking`, passed by vLLM from a
# request's `chat_template_kwargs`) and a special token.
THINKING_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{%- if add_generation_prompt %}assistant:{% if enable_thinking is defined and not enable_thinking %}"
    " <think>\n\n</think>\n{% else %} <think>\n{% endif %}{% endif %}"
)

# A second single template, for the folder whose file overrides its config.
OTHER_TEMPLATE = (
    "{%- for message in messages %}[{{ message['role'] | upper }}] {{ message['content'] }}\n{% endfor %}"
    "{%- if add_generation_prompt %}[ASSISTANT]{% endif %}"
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city, now.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "e.g. Paris"}},
            "required": ["city"],
        },
    },
}

CONVERSATIONS = [
    {"name": "user", "messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {
        "name": "multi-turn",
        "messages": [
            {"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "Capital of Italy?"},
            {"role": "assistant", "content": "Rome."},
            {"role": "user", "content": "And of Spain? «¿Madrid?»"},
        ],
    },
]

CALLS = [
    {"tools": None, "kwargs": {}},
    {"tools": [WEATHER], "kwargs": {}},
    {"tools": None, "kwargs": {"enable_thinking": False}},
]


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def describe(template):
    if template is None:
        return None
    if isinstance(template, str):
        return {"kind": "string", "sha256": hashlib.sha256(template.encode()).hexdigest()}
    return {"kind": "dict", "names": sorted(template)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("out")
    args = parser.parse_args()
    model = Path(args.model)
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    base = AutoTokenizer.from_pretrained(model)
    default_template = base.chat_template
    if not isinstance(default_template, str):
        sys.exit(f"{model}: expected one chat template, got {type(default_template)}")

    def save(name, template, **kwargs):
        tok = AutoTokenizer.from_pretrained(model)
        tok.chat_template = template
        folder = out / name
        tok.save_pretrained(folder, **kwargs)
        return folder

    made = {}
    save("transformers5", default_template)
    made["transformers5"] = "save_pretrained() of the model's tokenizer"
    save("named", {"default": default_template, "tool_use": TOOL_TEMPLATE})
    made["named"] = "save_pretrained() with chat_template = {default, tool_use}"
    save("extras-only", {"tool_use": TOOL_TEMPLATE, "thinking": THINKING_TEMPLATE})
    made["extras-only"] = "save_pretrained() with chat_template = {tool_use, thinking}"
    save("legacy-string", default_template, save_jinja_files=False)
    made["legacy-string"] = "save_pretrained(save_jinja_files=False) of the model's template"
    save("legacy-list", {"default": default_template, "tool_use": TOOL_TEMPLATE}, save_jinja_files=False)
    made["legacy-list"] = "save_pretrained(save_jinja_files=False) with chat_template = {default, tool_use}"
    save("thinking", THINKING_TEMPLATE)
    made["thinking"] = "save_pretrained() with a template that reads enable_thinking and bos_token"
    # A config template and a file template in one folder: the legacy save, then the
    # chat_template.jinja another (5.x) save of a different template wrote.
    other = save("other", OTHER_TEMPLATE)
    shutil.copytree(out / "legacy-string", out / "jinja-over-config")
    shutil.copy(other / "chat_template.jinja", out / "jinja-over-config" / "chat_template.jinja")
    shutil.rmtree(other)
    made["jinja-over-config"] = (
        "legacy-string, with the chat_template.jinja of a save_pretrained() of another template copied in"
    )

    model_tokenizer = sha256(model / "tokenizer.json")
    folders = {}
    for name in sorted(made):
        folder = out / name
        saved = folder / "tokenizer.json"
        if saved.exists() and sha256(saved) == model_tokenizer:
            saved.unlink()
            tokenizer_json = "the model's own (byte-identical, removed here)"
        else:
            tokenizer_json = "saved here (differs from the model's)"
        tok = AutoTokenizer.from_pretrained(folder if (folder / "tokenizer.json").exists() else _with_tokenizer(folder, model))
        cases = []
        for conversation in CONVERSATIONS:
            for call in CALLS:
                case = {"conversation": conversation["name"], "tools": call["tools"] is not None, "kwargs": call["kwargs"]}
                try:
                    case["rendered"] = tok.apply_chat_template(
                        conversation["messages"],
                        tools=call["tools"],
                        tokenize=False,
                        add_generation_prompt=True,
                        **call["kwargs"],
                    )
                except Exception as e:  # what transformers refuses is part of the reference
                    case["error"] = f"{type(e).__name__}: {e}"
                cases.append(case)
        folders[name] = {
            "made_by": made[name],
            "files": sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()),
            "tokenizer_json": tokenizer_json,
            "chat_template": describe(tok.chat_template),
            "cases": cases,
        }
    fixture = {
        "made_by": f"scripts/reference/chat_template_folders.py, transformers {transformers.__version__}",
        "model_tokenizer_json_sha256": model_tokenizer,
        "templates": {"tool_use": TOOL_TEMPLATE, "thinking": THINKING_TEMPLATE, "other": OTHER_TEMPLATE},
        "conversations": CONVERSATIONS,
        "weather_tool": WEATHER,
        "folders": folders,
    }
    (out / "cases.json").write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(folders)} folders -> {out}")


_SCRATCH = []


def _with_tokenizer(folder, model):
    """The folder with the model's tokenizer.json beside its files, in a scratch copy."""
    import tempfile

    scratch = Path(tempfile.mkdtemp())
    _SCRATCH.append(scratch)
    copy = scratch / folder.name
    shutil.copytree(folder, copy)
    shutil.copy(model / "tokenizer.json", copy / "tokenizer.json")
    return copy


if __name__ == "__main__":
    main()
