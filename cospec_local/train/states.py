"""Decision states: what a learned arbiter sees where it decides, as the training code keeps it.

A `DecisionState` is one block of a generation as the engine hands it to an arbiter: the prompt
and verified tokens before it, the draft block d_1..d_K, the target's tokens t_1..t_{K+1}, where
the two disagree, and the block's features (cospec_block_features, one row per draft position).
The collectors record them (collect.py, rollout.py) and the torch models score positions of them
(arbiter_model.make_batch).

A `LabelledState` is one line of collect.py's states.jsonl: a state, the position decided there,
and how each choice ended (the branch oracle, branch_oracle.py). Its JSON form is the one
states.jsonl has always had, so folders collected before these classes existed load as they are.

Torch-free: the rollout workers import it.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import _cospec

# Where the training side's generations draft from: the draft model alone. The states an arbiter
# learns from are the draft model's blocks, at the lengths of the arbiter's recorded cost model;
# n-gram blocks, whose lengths follow each machine's calibration, would make them differ by machine.
TRAINING_SOURCES = "draft"


@dataclass(frozen=True)
class DecisionState:
    context: list[int]            # the prompt and the verified tokens before the block
    draft: list[int]              # d_1..d_K
    target: list[int]             # t_1..t_{K+1}: the target's token after each draft prefix
    mismatch: list[int]           # 1 where the target does not accept the draft token
    features: list[list[float]]   # one row of cospec_block_features per draft position

    @classmethod
    def from_block(cls, block: dict) -> DecisionState:
        """The state of a block an arbiter is called with (copied: the engine reuses its arrays)."""
        return cls(context=block["context"].tolist(), draft=block["draft"].tolist(),
                   target=block["target"].tolist(), mismatch=block["mismatch"].astype(int).tolist(),
                   features=_cospec.block_features(block).tolist())

    def first_mismatch(self) -> int:
        return self.mismatch.index(1)

    def to_json(self) -> dict:
        return {"context": self.context, "draft": self.draft, "target": self.target, "mismatch": self.mismatch,
                "features": self.features}

    @classmethod
    def from_json(cls, row: dict) -> DecisionState:
        return cls(context=row["context"], draft=row["draft"], target=row["target"], mismatch=row["mismatch"],
                   features=row["features"])


def branch_label(keep_correct: bool, reject_correct: bool) -> int:
    """1 where only keeping the draft token ends right, 0 where only rejecting it does, -1 for ties
    (both right or both wrong: either decision gives the same answer, so the state teaches nothing
    about accuracy and the warm-up leaves it out of its loss)."""
    return -1 if keep_correct == reject_correct else int(keep_correct)


@dataclass(frozen=True)
class LabelledState:
    problem_id: str
    family: str
    split: str
    prompt_len: int
    state: DecisionState
    position: int                      # the decision's position in the block (a mismatch)
    keep_correct: bool                 # the answer with d_position kept, continued to the end, is right
    reject_correct: bool               # ... with t_position instead
    keep_completion: str | None = None  # plain collection: the keep branch's answer
    # collect --policy: what the policy did there, and where (index among the generated tokens)
    p_keep: float | None = None
    kept: bool | None = None
    token_index: int | None = None

    @property
    def label(self) -> int:
        return branch_label(self.keep_correct, self.reject_correct)

    def to_json(self) -> dict:
        state = self.state.to_json()  # keys in the order states.jsonl has always had them
        row = {"problem_id": self.problem_id, "family": self.family, "split": self.split,
               "prompt_len": self.prompt_len, **{k: state[k] for k in ("context", "draft", "target", "mismatch")},
               "position": self.position, "features": state["features"]}
        for name in ("p_keep", "kept", "token_index"):
            if getattr(self, name) is not None:
                row[name] = getattr(self, name)
        row.update(keep_correct=self.keep_correct, reject_correct=self.reject_correct, label=self.label)
        if self.keep_completion is not None:
            row["keep_completion"] = self.keep_completion
        return row

    @classmethod
    def from_json(cls, row: dict) -> LabelledState:
        return cls(problem_id=row["problem_id"], family=row["family"], split=row["split"],
                   prompt_len=row["prompt_len"], state=DecisionState.from_json(row), position=row["position"],
                   keep_correct=row["keep_correct"], reject_correct=row["reject_correct"],
                   keep_completion=row.get("keep_completion"), p_keep=row.get("p_keep"), kept=row.get("kept"),
                   token_index=row.get("token_index"))
