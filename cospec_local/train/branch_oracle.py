"""The branch oracle: what one arbiter decision was worth, found by trying both choices.

At a decision (a mismatch the walk reached) the answer is completed twice, once with the draft's
token d_i kept and once with the target's t_i, each continued to the end of the answer, and both
answers are scored; `states.branch_label` turns the two outcomes into the warm-up's label. What
continues a branch is the caller's choice:

- collect.py (plain speculative decoding's first mismatches): the lossless target arbiter
  continues the keep branch; the reject branch is the recorded run itself (greedy speculative
  decoding is lossless), so it is never generated again.
- RolloutWorker.policy_states (the states a policy meets, collect --policy): the policy, deciding
  by its threshold, continues both.
- RolloutWorker.branches (GRPO's credit=state): the policy continues each choice several times.

A continuation is a plain generation from the prompt's tokens, the tokens generated before the
decision and the chosen token: no engine support is needed. Runs the engine only: no torch here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..engine import Engine
from ..evaluation.task_eval import task_draft_prompt, task_prompt
from ..tasks import Problem, cut_at_stops, score
from .states import DecisionState

# (the prompt's tokens + the branch's answer so far, tokens left) -> the text generated after them
Continuation = Callable[[list[int], int], str]


@dataclass(frozen=True)
class Branch:
    answer: list[int]  # the generated tokens up to and including the chosen one
    text: str          # their text
    left: int          # tokens the answer may still have
    ended: bool        # the choice ended the answer: end of generation, no tokens left, or a stop string


class BranchOracle:
    """The branches of one problem's decisions. Each distinct answer is scored once: branches
    often end in the same answer, and code answers run in a sandbox."""

    def __init__(self, engine: Engine, problem: Problem, max_tokens: int, chat: bool = False):
        self.engine = engine
        self.problem = problem
        self.max_tokens = max_tokens
        self.prompt, self.stops = task_prompt(engine, problem, chat)
        self.draft_prompt = task_draft_prompt(engine, problem, chat)  # a draft of another vocabulary's own
        self._scores: dict[str, bool] = {}

    def text_of(self, tokens) -> str:
        """The text the engine streams for these tokens: their pieces, end-of-generation excluded.
        (Not detokenize: that drops the leading space of a first piece that starts with one.)"""
        pieces = b"".join(self.engine._native.token_to_piece(int(t)) for t in tokens if not self.engine.is_eog(int(t)))
        return pieces.decode("utf-8", errors="replace")

    def is_right(self, answer: str) -> bool:
        if answer not in self._scores:
            self._scores[answer] = bool(score(self.problem, answer))
        return self._scores[answer]

    def branch(self, state: DecisionState, position: int, keep: bool) -> Branch:
        """The answer with d_position (keep) or t_position chosen at `state`: the tokens generated
        before the block, the block's draft tokens up to the position (all accepted or kept, or the
        walk would not have reached it), then the choice."""
        token = state.draft[position] if keep else state.target[position]
        answer = state.context[len(self.prompt):] + state.draft[:position] + [token]
        text = self.text_of(answer)
        left = self.max_tokens - len(answer)
        # The engine ends a generation at a stop string: one completed by the chosen token ends the answer too.
        ended = self.engine.is_eog(token) or left <= 0 or cut_at_stops(text, self.stops) != text
        return Branch(answer, text, left, ended)

    def complete(self, state: DecisionState, position: int, keep: bool, continuation: Continuation) -> str:
        """The branch's whole answer: continued unless the choice ended it, up to the first stop
        string (one the join of the branch and its continuation completes, too)."""
        b = self.branch(state, position, keep)
        text = b.text if b.ended else b.text + continuation(self.prompt + b.answer, b.left)
        return cut_at_stops(text, self.stops)
