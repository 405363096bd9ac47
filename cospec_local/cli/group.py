"""The `cospec-local` click group: llama.cpp's multi-letter flags read whole, Ollama's verbs as aliases."""
from __future__ import annotations

import difflib
import re

import click


# A single dash and two or more letters: llama.cpp's multi-letter flags (-ngl, -sys, -cnv).
SINGLE_DASH_WORD = re.compile(r"-[A-Za-z][A-Za-z-]+\Z")


class WholeFlagCommand(click.Command):
    """A command that reads a single-dash flag of several letters whole, as llama.cpp does: one it
    does not know is refused by its whole name, where click would read a known short flag and a
    value (-sys as -s 'ys', -cnv as -c 'nv'). -n16 and -t2 still read as a flag and its value."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        known, takes_value = set(), set()
        for param in self.get_params(ctx):
            if isinstance(param, click.Option):
                known.update(param.opts + param.secondary_opts)
                if not param.is_flag and not param.count:
                    takes_value.update(param.opts)
        value_next = False
        for arg in args:
            if value_next:  # an option's value, e.g. -p "-abc"
                value_next = False
                continue
            if arg == "--":
                break
            if arg in takes_value:
                value_next = True
            elif SINGLE_DASH_WORD.match(arg) and arg not in known:
                if arg in LLAMA_FLAG_HINTS.get(self.name, {}):
                    raise click.UsageError(f"no option {arg} here: {LLAMA_FLAG_HINTS[self.name][arg]}", ctx=ctx)
                words = sorted(name for name in known if len(name) > 2)
                raise click.NoSuchOption(arg, possibilities=difflib.get_close_matches(arg, words, n=3, cutoff=0.6),
                                         ctx=ctx)
        return super().parse_args(ctx, args)


# llama-cli's flags whose behaviour is another command here.
LLAMA_FLAG_HINTS = {"generate": {"-cnv": "a conversation is `cospec-local chat` (it takes -sys, -n and the other flags)",
                                 "-no-cnv": "generate never converses (it is llama-cli's -no-cnv already)"}}


# Ollama's verbs without a command of their own here: what to use instead.
OLLAMA_HINTS = {"ps": "engines run inside the process that opened them; a server's are at GET /slots and /health",
                "pull": "models are GGUF files: pass a path with -m, or a named one (`cospec-local models`)",
                "show": "`cospec-local models` describes the named models; chat's /show the loaded ones"}


class WholeFlagGroup(click.Group):
    command_class = WholeFlagCommand

    def resolve_command(self, ctx, args):
        """Ollama's verbs as aliases: `list` is models; `run MODEL` is chat -m MODEL, and
        `run MODEL PROMPT` answers that one message (generate --chat) and exits."""
        if self.name == "main" and args:
            if args[0] == "list":
                args = ["models", *args[1:]]
            elif args[0] == "run":
                rest = list(args[1:])
                model = ["-m", rest.pop(0)] if rest and not rest[0].startswith("-") else []
                if rest and not rest[0].startswith("-"):
                    args = ["generate", *model, "--chat", "--no-display-prompt", "-p", rest.pop(0), *rest]
                else:
                    args = ["chat", *model, *rest]
            elif args[0] in OLLAMA_HINTS and args[0] not in self.commands:
                raise click.UsageError(f"no command {args[0]!r} here: {OLLAMA_HINTS[args[0]]}", ctx=ctx)
        return super().resolve_command(ctx, args)


WholeFlagGroup.group_class = WholeFlagGroup


@click.group(cls=WholeFlagGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cospec-local")
def main():
    """Collaborative speculative decoding: a draft model proposes, a target verifies,
    an arbiter decides where they disagree."""
