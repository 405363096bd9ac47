"""The interactive loop behind `cospec-local chat`."""
from __future__ import annotations

import sys
from typing import Callable, TextIO

from .display import colored, stats_line
from .engine import Engine
from .errors import ContextFullError, CospecError
from .params import MODES, GenerationParams

HELP = """Commands:
  /? or /help        this help
  /clear             forget the conversation
  /set               show the settings
  /set NAME VALUE    change one: temp, top-k, top-p, seed, max-tokens, draft-max, draft-p-min,
                     mode (speculative, target-only, draft-only), arbiter (target, fly, a learned
                     arbiter's name or folder), arbiter-threshold, fly-window, fly-entropy,
                     adaptive-draft (on/off), sample-arbiter (on/off), color (on/off), system
  /bye               leave
Multi-line input: end a line with \\ to go on, or put the text between triple quotes (\"\"\").
Ctrl-C stops a reply and keeps the conversation; Ctrl-C at the prompt (or Ctrl-D) leaves."""

def _on_off(value: str) -> bool:
    return value.lower() in ("on", "1", "true", "yes")


# /set name -> (GenerationParams field, parser)
SETTINGS = {
    "temp": ("temperature", float),
    "top-k": ("top_k", int),
    "top-p": ("top_p", float),
    "seed": ("seed", int),
    "max-tokens": ("max_tokens", int),
    "draft-max": ("draft_max", int),
    "draft-p-min": ("draft_p_min", float),
    "fly-window": ("fly_window", int),
    "fly-entropy": ("fly_entropy", float),
    "arbiter-threshold": ("arbiter_threshold", float),
    "adaptive-draft": ("adaptive_draft", _on_off),
    "sample-arbiter": ("sample_arbiter", _on_off),
    "arbiter": ("arbiter", str),
}


class ChatSession:
    def __init__(self, engine: Engine, settings: GenerationParams, system: str | None = None, color: bool = False,
                 read_line: Callable[[str], str] = input, out: TextIO = sys.stdout):
        self.engine = engine
        self.settings = settings
        self.system = system
        self.color = color
        self.read_line = read_line
        self.out = out
        self.messages: list[dict] = []
        try:
            import readline  # noqa: F401  (line editing and history where available)
        except ImportError:
            pass

    def say(self, text: str = "", end: str = "\n") -> None:
        self.out.write(text + end)
        self.out.flush()

    def run(self) -> None:
        self.say('Type a message, /? for help, /bye to leave.')
        while True:
            try:
                text = self.read_message()
            except (EOFError, KeyboardInterrupt):
                self.say()
                return
            if not text.strip():
                continue
            if text.startswith("/"):
                if not self.command(text.strip()):
                    return
                continue
            self.reply(text)

    def read_message(self) -> str:
        line = self.read_line(">>> ")
        if line.lstrip().startswith('"""'):
            parts = [line.lstrip()[3:]]
            while not parts[-1].rstrip().endswith('"""') or (len(parts) == 1 and parts[0].strip() == ""):
                parts.append(self.read_line("... "))
            parts[-1] = parts[-1].rstrip()[:-3]
            return "\n".join(parts).strip("\n")
        parts = [line]
        while parts[-1].endswith("\\"):
            parts[-1] = parts[-1][:-1]
            parts.append(self.read_line("... "))
        return "\n".join(parts)

    def command(self, text: str) -> bool:
        """Run a /command; False means leave."""
        name, _, rest = text.partition(" ")
        if name in ("/bye", "/exit", "/quit"):
            return False
        if name in ("/?", "/help"):
            self.say(HELP)
        elif name == "/clear":
            self.messages.clear()
            self.say("(conversation cleared)")
        elif name == "/set":
            self.set(rest.strip())
        else:
            self.say(f"unknown command {name}; /? for help")
        return True

    def set(self, args: str) -> None:
        if not args:
            for key, value in sorted(vars(self.settings).items()):
                self.say(f"  {key} = {value}")
            self.say(f"  color = {'on' if self.color else 'off'}\n  system = {self.system!r}")
            return
        name, _, value = args.partition(" ")
        value = value.strip()
        if name == "color":
            self.color = _on_off(value)
        elif name == "system":
            self.system = value or None
        elif name == "mode":
            if value not in MODES:
                self.say(f"mode must be one of {', '.join(MODES)}")
                return
            if value != "target-only" and not self.engine.has_draft:
                self.say("this session was started without a draft model")
                return
            self.settings = self.settings.updated(mode=value)
        elif name in SETTINGS:
            key, parse = SETTINGS[name]
            try:
                changed = self.settings.updated(**{key: parse(value)})
                changed.validate()
                if key in ("arbiter", "arbiter_threshold") and changed.mode == "speculative":
                    self.engine.arbiter(changed.arbiter, threshold=changed.arbiter_threshold, head=changed.arbiter_head)
            except (ValueError, CospecError, FileNotFoundError) as exc:
                self.say(f"{name}: {exc}")
                return
            self.settings = changed
        else:
            self.say(f"unknown setting {name!r}; /? for help")
            return
        self.say(f"({name} set)")

    def conversation(self) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.messages

    def reply(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})
        pieces: list[str] = []
        try:
            try:
                prompt = self.engine.render_chat(self.conversation())
            except ValueError as exc:  # template errors
                self.messages.pop()
                self.say(f"error: {exc}")
                return
            for event in self.engine.stream(prompt, self.settings):
                pieces.append(event.text)
                self.say(colored(event.text, event.provenance, self.color), end="")
            self.say()
            self.say(stats_line(self.engine.last_result))
        except KeyboardInterrupt:
            self.say("\n[reply stopped]")
        except ContextFullError as exc:
            self.messages.pop()
            self.say(f"error: {exc}\n(the conversation no longer fits the context: /clear starts a new one)")
            return
        except CospecError as exc:
            self.say(f"\nerror: {exc}")
        self.messages.append({"role": "assistant", "content": "".join(pieces)})
