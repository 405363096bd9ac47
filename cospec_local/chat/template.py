"""Chat template rendering for GGUF models.

Chat templates are Jinja2 source stored in the model file
(``tokenizer.chat_template``), so they are untrusted input. They are rendered
the way Hugging Face transformers renders them (immutable sandbox,
``trim_blocks``/``lstrip_blocks``, ``raise_exception``, ``tojson``,
``strftime_now``, loop controls), with extra limits on output size, on
sequence/number growth and on render time.
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import jinja2
from jinja2.compiler import CodeGenerator
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

log = logging.getLogger(__name__)

MAX_OUTPUT_CHARS = 1 << 20  # 1 MiB of text
MAX_RENDER_SECONDS = 1.0
MAX_INT_BITS = 4096

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Gemma's turn markers, as its instruction-tuned models' own template writes them (a system
# message opens the first user turn); for GGUFs that carry no template, as Gemma 3 270M's.
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% set system = messages[0]['content'] if messages and messages[0]['role'] == 'system' else '' %}"
    "{% for m in messages if m['role'] != 'system' %}"
    "{% set role = 'model' if m['role'] == 'assistant' else 'user' %}"
    "{{ '<start_of_turn>' + role + '\n' }}{% if loop.first and system %}{{ system | trim }}{{ '\n\n' }}{% endif %}"
    "{{ (m['content'] or '') | trim }}{{ '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
# Names a chat template option takes instead of Jinja text (as llama.cpp's --chat-template does).
NAMED_TEMPLATES = {"chatml": CHATML_TEMPLATE, "gemma": GEMMA_TEMPLATE}


def template_source(given: str) -> str:
    """The Jinja text of a template option: a named template's, or the text itself."""
    return NAMED_TEMPLATES.get(given.strip().lower(), given)

# Deadline (time.monotonic()) of the render running in the current context.
_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("_deadline", default=None)


class ChatTemplateError(ValueError):
    """The template or the messages cannot be rendered."""


def _check_deadline() -> None:
    deadline = _deadline.get()
    if deadline is not None and time.monotonic() > deadline:
        raise SecurityError("render time limit exceeded")


def _check_size(value: Any, limit: int) -> Any:
    if isinstance(value, (str, list, tuple)) and len(value) > limit:
        raise SecurityError(f"intermediate value longer than {limit}")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise SecurityError(f"integer wider than {MAX_INT_BITS} bits")
    return value


def _check_args(args: tuple, kwargs: dict, limit: int) -> None:
    """Refuse huge integer arguments: ``' '.center(10**10)``, ``|indent(10**10)``, ``'%0*d' % (10**10, 1)``."""
    for arg in (*args, *kwargs.values()):
        if isinstance(arg, int) and abs(arg) > limit:
            raise SecurityError(f"numeric argument {arg} is too large")


class _CodeGenerator(CodeGenerator):
    """Routes ``~`` concatenation through ``environment.checked`` (jinja has no hook for it)."""

    def visit_Concat(self, node, frame):
        self.write("environment.checked(")
        super().visit_Concat(node, frame)
        self.write(")")


class _Environment(ImmutableSandboxedEnvironment):
    """Immutable sandbox that also checks a render deadline on every call,
    filter, attribute and item access, and refuses arguments or ``*``, ``+``,
    ``**``, ``%``, ``~`` results that would be huge (before computing them where possible)."""

    intercepted_binops = frozenset({"*", "+", "**", "%"})
    code_generator_class = _CodeGenerator

    def __init__(self, max_output_chars: int):
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        self.max_output_chars = max_output_chars

    def guard_filter(self, name, func):
        skip = 2 if hasattr(func, "jinja_pass_arg") else 1  # context/environment, then the filtered value

        @functools.wraps(func)  # keeps jinja's pass_context/pass_environment mark
        def guarded(*args, **kwargs):
            _check_deadline()
            if name != "format" or "*" in str(args[skip - 1]):  # '%d'|format(big_number) is fine
                _check_args(args[skip:], kwargs, self.max_output_chars)
            return _check_size(func(*args, **kwargs), self.max_output_chars)
        return guarded

    def call(__self, __context, __obj, *args, **kwargs):  # dunder names: templates may pass self=...
        _check_deadline()
        if isinstance(getattr(__obj, "__self__", None), str):  # str methods: center, ljust, zfill, ...
            _check_args(args, kwargs, __self.max_output_chars)
        return _check_size(super().call(__context, __obj, *args, **kwargs), __self.max_output_chars)

    def checked(self, value):
        _check_deadline()
        return _check_size(value, self.max_output_chars)

    def getattr(self, obj, attribute):
        _check_deadline()
        return super().getattr(obj, attribute)

    def getitem(self, obj, argument):
        _check_deadline()
        return super().getitem(obj, argument)

    def call_binop(self, context, operator, left, right):
        _check_deadline()
        if operator == "*":
            seq, n = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > self.max_output_chars:
                raise SecurityError("sequence repetition result too large")
        if operator == "%" and isinstance(left, str) and "*" in left:  # width taken from the arguments
            _check_args(right if isinstance(right, tuple) else (right,), {}, self.max_output_chars)
        if operator == "**" and isinstance(left, int) and isinstance(right, int):
            if abs(left) > 1 and right * abs(left).bit_length() > MAX_INT_BITS:
                raise SecurityError("power result too large")
        return _check_size(super().call_binop(context, operator, left, right), self.max_output_chars)


def _raise_exception(message: Any) -> None:
    raise ChatTemplateError(f"chat template raised an exception: {message}")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _flatten_content(content: Any, index: int) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ChatTemplateError(f"messages[{index}].content must be a string, null or a list of parts, "
                                f"not {type(content).__name__}")
    texts = []
    for part in content:
        if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ChatTemplateError(f"messages[{index}].content: only {{'type': 'text', 'text': str}} "
                                    f"parts are supported, got {part!r:.80}")
        texts.append(part["text"])
    return "\n".join(texts)


def _validate_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list):
        raise ChatTemplateError(f"messages must be a list, not {type(messages).__name__}")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatTemplateError(f"messages[{i}] must be an object, not {type(message).__name__}")
        if not isinstance(message.get("role"), str):
            raise ChatTemplateError(f"messages[{i}].role must be a string")
        if "content" not in message:
            raise ChatTemplateError(f"messages[{i}] has no content")
        out.append({**message, "content": _flatten_content(message["content"], i)})
    return out


class ChatTemplate:
    """A compiled chat template.

    ``render`` builds the prompt text for a conversation. Every failure (bad
    messages, template syntax, sandbox violation, ``raise_exception``, limits
    exceeded) raises :class:`ChatTemplateError`.
    """

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", *,
                 max_output_chars: int = MAX_OUTPUT_CHARS, max_render_seconds: float = MAX_RENDER_SECONDS):
        if not isinstance(source, str):
            raise ChatTemplateError(f"chat template must be a string, not {type(source).__name__}")
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.max_output_chars = max_output_chars
        self.max_render_seconds = max_render_seconds
        env = _Environment(max_output_chars)
        env.filters["tojson"] = _tojson
        env.filters = {name: env.guard_filter(name, f) for name, f in env.filters.items()}
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"chat template syntax error at line {e.lineno}: {e.message}") from e
        except (RecursionError, MemoryError) as e:
            raise ChatTemplateError(f"chat template too complex to compile: {type(e).__name__}") from e
        except Exception as e:
            raise ChatTemplateError(f"chat template failed to compile: {type(e).__name__}: {e}") from e

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **extra: Any) -> str:
        msgs = _validate_messages(messages)
        variables = {"bos_token": self.bos_token, "eos_token": self.eos_token, "tools": None, "documents": None,
                     **extra, "messages": msgs, "add_generation_prompt": bool(add_generation_prompt)}
        token = _deadline.set(time.monotonic() + self.max_render_seconds)
        chunks: list[str] = []
        size = 0
        try:
            for chunk in self._template.generate(variables):
                size += len(chunk)
                if size > self.max_output_chars:
                    raise ChatTemplateError(f"rendered chat exceeds {self.max_output_chars} characters")
                _check_deadline()
                chunks.append(chunk)
        except ChatTemplateError:
            raise
        except SecurityError as e:
            raise ChatTemplateError(f"chat template refused by sandbox: {e}") from e
        except (RecursionError, MemoryError) as e:
            raise ChatTemplateError(f"chat template exhausted resources: {type(e).__name__}") from e
        except Exception as e:
            raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from e
        finally:
            _deadline.reset(token)
        return "".join(chunks)


def fallback_template(bos_token: str = "", eos_token: str = "", factory=None) -> ChatTemplate:
    """Plain ChatML, used when the model file carries no usable template."""
    return (factory or ChatTemplate)(CHATML_TEMPLATE, bos_token, eos_token)


def from_gguf_metadata(template_source: str | None, bos_token: str, eos_token: str, factory=None):
    """The model's own template, or ChatML when it has none or it does not compile; `factory`
    builds the template (default: in this process). When the model's template was set aside,
    the result's `fallback_reason` says why (the CLI tells the user once)."""
    make = factory or ChatTemplate
    if not template_source or not template_source.strip():
        return fallback_template(bos_token, eos_token, make)
    try:
        return make(template_source, bos_token, eos_token)
    except ChatTemplateError as e:
        log.warning("ignoring the model's chat template (%s); using ChatML", e)
        template = fallback_template(bos_token, eos_token, make)
        template.fallback_reason = str(e)
        return template


def serve_requests() -> None:
    """The isolated renderer's loop (template_process.py starts it in a child process with
    hard limits): one JSON request a line on stdin, one JSON answer a line on stdout."""
    import sys

    compiled: dict[tuple, ChatTemplate] = {}
    for line in sys.stdin.buffer:
        try:
            req = json.loads(line)
            key = (req["source"], req["bos"], req["eos"])
            if key not in compiled:
                compiled.clear()  # one model's template at a time is the normal case
                compiled[key] = ChatTemplate(*key)
            text = "" if req["compile_only"] else compiled[key].render(
                req["messages"], add_generation_prompt=req["add_generation_prompt"], tools=req.get("tools"))
            out = {"text": text}
        except ChatTemplateError as exc:
            out = {"error": str(exc)[:2000]}
        except MemoryError:
            compiled.clear()
            out = {"error": "chat template exhausted the renderer's memory"}
        except Exception as exc:  # noqa: BLE001 - a bad request must not end the renderer
            out = {"error": f"chat template renderer: {type(exc).__name__}: {str(exc)[:500]}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
