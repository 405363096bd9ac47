"""The interactive loop behind `cospec-local chat`."""
from __future__ import annotations

import os
import sys
from typing import Callable, TextIO

from .display import abstained_note, colored, draft_off_note, model_summary, stats_line
from ..arbiter.engine_arbiters import LEARNED_KINDS
from ..engine import Engine
from ..errors import ContextFullError, CospecError
from ..params import MODES, UNTIL_CONTEXT_ENDS, GenerationParams

HELP = """Commands:
  /? or /help        this help
  /clear             forget the conversation
  /show              the models, the arbiter and every setting
  /set NAME VALUE    change one (as /show names it, its flag's name, or Ollama's /set parameter
                     NAME VALUE): temp, top-k, top-p, min-p,
                     repeat-penalty, repeat-last-n, seed (a number, or random: a new one each reply),
                     max-tokens, draft-max, draft-p-min,
                     mode (speculative, target-only, draft-only), arbiter (target, fly, a learned
                     arbiter's name or folder), arbiter-threshold, fly-window, fly-entropy, aasd-alpha, aasd-beta,
                     adaptive-draft (on/off), sample-arbiter (on/off), color (on/off), system
  /save FILE         write the conversation (system message and turns) as JSON
  /load FILE         read a conversation written by /save
  /bye               leave
Multi-line input: end a line with \\ to go on, or put the text between triple quotes (\"\"\").
Ctrl-C stops a reply and keeps the conversation (at the prompt it clears the line); Ctrl-D or
/bye leaves.
When the conversation outgrows the context, the oldest turns are dropped (the system message stays)."""

def _on_off(value: str) -> bool:
    if value.lower() in ("on", "1", "true", "yes"):
        return True
    if value.lower() in ("off", "0", "false", "no"):
        return False
    raise ValueError(f"{value!r} is not on or off")


def _number(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a number") from None


def _whole(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a whole number") from None


def random_seed() -> int:
    """A fresh seed for a reply whose seed nobody set (llama-cli's and Ollama's habit)."""
    return int.from_bytes(os.urandom(8), "little") >> 1


# /set name -> (GenerationParams field, parser); /show's names (the fields) are accepted too.
SETTINGS = {
    "temp": ("temperature", _number),
    "top-k": ("top_k", _whole),
    "top-p": ("top_p", _number),
    "min-p": ("min_p", _number),
    "repeat-penalty": ("repeat_penalty", _number),
    "repeat-last-n": ("repeat_last_n", _whole),
    "seed": ("seed", _whole),
    "max-tokens": ("max_tokens", _whole),
    "draft-max": ("draft_max", _whole),
    "draft-p-min": ("draft_p_min", _number),
    "fly-window": ("fly_window", _whole),
    "fly-entropy": ("fly_entropy", _number),
    "aasd-alpha": ("aasd_alpha", _number),
    "aasd-beta": ("aasd_beta", _number),
    "arbiter-threshold": ("arbiter_threshold", _number),
    "adaptive-draft": ("adaptive_draft", _on_off),
    "sample-arbiter": ("sample_arbiter", _on_off),
    "arbiter-gate": ("arbiter_gate", _on_off),
    "arbiter": ("arbiter", str),
}
ALIASES = {field: name for name, (field, _) in SETTINGS.items()}  # temperature -> temp, top_k -> top-k, ...
ALIASES.update({field.replace("_", "-"): name for field, name in list(ALIASES.items())})
ALIASES["num_predict"] = "max-tokens"  # Ollama's name (`/set parameter num_predict 100`)


class ChatSession:
    def __init__(self, engine: Engine, settings: GenerationParams, system: str | None = None, color: bool = False,
                 read_line: Callable[[str], str] = input, out: TextIO = sys.stdout, seed_fixed: bool = True):
        """seed_fixed=False: each reply draws a new seed (shown by /show) unless /set seed fixes one."""
        self.engine = engine
        self.settings = settings
        self.seed_fixed = seed_fixed
        self.said_draft_off = False
        self.said: set[str] = set()
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

    def run(self, banner: str | None = None) -> None:
        if banner:
            self.say(banner)
        self.say('Type a message, /? for help, /bye to leave.')
        while True:
            try:
                text = self.read_message()
            except EOFError:
                self.say()
                return
            except KeyboardInterrupt:  # as Ollama: Ctrl-C drops the line being typed, never the conversation
                self.say("\nUse Ctrl-D or /bye to exit.")
                continue
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
        elif name == "/show":
            self.show()
        elif name == "/save":
            self.save(rest.strip())
        elif name == "/load":
            self.load(rest.strip())
        else:
            self.say(f"unknown command {name}; /? for help")
        return True

    def show(self) -> None:
        e = self.engine
        self.say(f"  target: {e.target_path}{model_summary(e.target_path)}")
        if e.has_draft:
            self.say(f"  draft:  {e.draft_path}{model_summary(e.draft_path)}")
        if self.settings.mode == "speculative":
            arbiter = e.arbiter_for(self.settings)
            keeps = f", keeps at P >= {arbiter.threshold:.3f}" if arbiter.kind in LEARNED_KINDS else ""
            self.say(f"  arbiter: {self.settings.arbiter} ({e.arbiter_name(self.settings)}{keeps})")
        self.say(f"  context: {e.n_ctx} tokens; conversation: {len(self.messages)} messages")
        self.set("")

    def save(self, path: str) -> None:
        import json

        if not path:
            self.say("usage: /save FILE")
            return
        try:
            with open(path, "w", encoding="utf-8") as f:
                json.dump({"system": self.system, "messages": self.messages}, f, ensure_ascii=False, indent=1)
        except OSError as exc:
            self.say(f"/save: {exc}")
            return
        self.say(f"(conversation saved to {path})")

    def load(self, path: str) -> None:
        import json

        if not path:
            self.say("usage: /load FILE")
            return
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
                raise ValueError("it holds no list of messages")
            messages = data["messages"]
            if not all(isinstance(m, dict) and m.get("role") in ("user", "assistant")
                       and isinstance(m.get("content"), str) for m in messages):
                raise ValueError("messages must be user/assistant turns with text content")
            system = data.get("system")
            if system is not None and not isinstance(system, str):
                raise ValueError("system must be text")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.say(f"/load: {path} is not a saved conversation ({exc})")
            return
        self.messages, self.system = list(messages), system
        self.say(f"(conversation loaded: {len(messages)} messages)")

    def set(self, args: str) -> None:
        if not args:
            for key, value in sorted(vars(self.settings).items()):
                if key == "seed" and not self.seed_fixed:
                    value = f"random (the last reply's: {value}; /set seed N fixes one)"
                self.say(f"  {key} = {value}")
            self.say(f"  color = {'on' if self.color else 'off'}\n  system = {self.system!r}")
            return
        name, _, value = args.partition(" ")
        value = value.strip()
        if name == "parameter":  # Ollama's spelling: /set parameter NAME VALUE
            name, _, value = value.partition(" ")
            value = value.strip()
            if name == "num_ctx":
                self.say("the context is fixed when the models load: start again with -c N")
                return
        name = ALIASES.get(name, name)
        if name == "seed" and value.lower() == "random":
            self.seed_fixed = False
            self.say("(seed set: a new one each reply)")
            return
        if name == "color":
            try:
                self.color = _on_off(value)
            except ValueError as exc:
                self.say(f"color: {exc}")
                return
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
                    self.engine.arbiter_for(changed)
            except (ValueError, CospecError, FileNotFoundError) as exc:
                self.say(f"{name}: {exc}")
                return
            self.settings = changed
            if key == "seed":
                self.seed_fixed = True
        else:
            self.say(f"unknown setting {name!r}; /? for help")
            return
        self.say(f"({name} set)")

    def note_draft_off(self, result) -> None:
        """Say once, in plain words, when the block-length tuner has all but switched the draft off:
        the stats line alone ("drafted 4, accepted 0") does not tell a user why nothing speeds up."""
        if result is not None and (note := abstained_note(result)) is not None and note not in self.said:
            self.said.add(note)  # once per arbiter
            self.say(note)
        if self.said_draft_off or result is None or (note := draft_off_note(result)) is None:
            return
        self.said_draft_off = True
        self.say(note)

    def conversation(self) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.messages

    def fitting_prompt(self) -> list[int]:
        """The rendered conversation, its oldest turns dropped (as llama-cli shifts its context) until
        it leaves room for a reply: max_tokens, at most half the context (-n -1: half). The system message stays."""
        asked = self.settings.max_tokens
        room = self.engine.n_ctx // 2 if asked == UNTIL_CONTEXT_ENDS else min(asked, self.engine.n_ctx // 2)
        prompt = self.engine.render_chat(self.conversation())
        dropped = 0
        while len(prompt) + room > self.engine.n_ctx and len(self.messages) > 1:
            del self.messages[:2 if len(self.messages) > 2 else 1]  # a user turn and its reply
            dropped += 1
            prompt = self.engine.render_chat(self.conversation())
        if dropped:
            self.say(f"(context full: the {dropped} oldest turn{'s' if dropped > 1 else ''} dropped)")
        return prompt

    def reply(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})
        pieces: list[str] = []
        color = self.color and self.out.isatty()  # no escape codes into a file or a pipe
        try:
            try:
                prompt = self.fitting_prompt()
            except ValueError as exc:  # template errors
                self.messages.pop()
                self.say(f"error: {exc}")
                return
            if not self.seed_fixed:
                self.settings = self.settings.updated(seed=random_seed())
            draft_prompt = self.engine.render_draft_chat(self.conversation())
            for event in self.engine.stream(prompt, self.settings, draft_prompt=draft_prompt):
                pieces.append(event.text)
                self.say(colored(event.text, event.provenance, color), end="")
            self.say()
            self.say(stats_line(self.engine.last_result))
            self.note_draft_off(self.engine.last_result)
        except KeyboardInterrupt:
            self.say("\n[reply stopped]")
            if self.engine.last_result is not None:
                self.say(stats_line(self.engine.last_result))
        except ContextFullError as exc:
            self.messages.pop()
            self.say(f"error: {exc}\n(the message alone does not fit the context: /clear, or a larger -c)")
            return
        except CospecError as exc:
            self.say(f"\nerror: {exc}")
        self.messages.append({"role": "assistant", "content": "".join(pieces)})
