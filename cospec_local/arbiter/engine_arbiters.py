"""The arbiters an Engine decides with, mixed into it: the built-in rules made from their
settings, and the learned arbiters loaded once per engine and kept (a LoRA arbiter holds a
llama.cpp context of its own), with the block length a learned arbiter was trained on."""
from __future__ import annotations

import os
import warnings

from .. import _cospec
from ..errors import ArbiterDraftError, ArbiterError, ArbiterSettingsWarning, from_native
from ..params import DEFAULTS, GenerationParams
from .callbacks import onnx_head
from .catalog import AUTO, NAMED_ARBITERS, Arbiter, another_draft_fix, missing_arbiter_hint, resolve_arbiter_path, resolve_auto

# Arbiters whose files record what they were trained under (enum cospec_arbiter_kind).
LEARNED_KINDS = (_cospec.ARBITER_FEATURES, _cospec.ARBITER_LORA)


class ArbiterCacheMixin:
    """An Engine's arbiters: `arbiter()` and the generation's choice by its settings."""

    def _init_arbiters(self) -> None:
        # Learned arbiters loaded for this engine, by (path, threshold, head, gate).
        self._learned: dict[tuple, Arbiter] = {}
        self._warned: set[tuple] = set()  # (arbiter, draft_max) pairs already warned about

    def _reset_arbiters(self) -> None:
        """Forget the cached prompt prefix of the learned arbiters loaded here."""
        for arbiter in self._learned.values():
            arbiter.reset()

    def arbiter(self, spec="target", *, threshold: float | None = None, head: str = "native",
                gate: bool = DEFAULTS.arbiter_gate) -> Arbiter:
        """The native arbiter for `spec`: "target", "fly" (FLy's defaults), "aasd", an Arbiter object, or a
        learned arbiter's name or folder, loaded for this engine's draft (once; later calls reuse it).
        head="onnx" runs a learned arbiter's head under ONNX Runtime instead of natively; gate=False
        lets it decide on every prompt, its domain gate off."""
        return self._arbiter(GenerationParams(arbiter=spec, arbiter_threshold=threshold, arbiter_head=head,
                                              arbiter_gate=gate))[0]

    def arbiter_for(self, params: GenerationParams) -> Arbiter:
        """The arbiter a generation with these settings uses (arbiter, threshold, head, gate), loaded now:
        a bad one fails here, before any output."""
        return self._arbiter(params)[0]

    def arbiter_name(self, params: GenerationParams) -> str:
        """The name a generation's result gives its arbiter (a bundled one's name, e.g. demo-lora for
        auto on the demo pair, rather than its file's), loading it as arbiter_for does."""
        return self._arbiter(params)[1]

    def unload_arbiter(self, spec) -> None:
        """Free the learned arbiters loaded here from `spec` (a name or folder), e.g. one that a
        training run is about to rewrite; the next use loads it again."""
        folder = os.path.abspath(resolve_arbiter_path(spec))
        for key in [k for k in self._learned if k[0] == folder]:
            self._learned.pop(key).close()

    def _arbiter(self, params: GenerationParams) -> tuple[Arbiter, str]:
        spec = params.arbiter
        if isinstance(spec, Arbiter):
            return spec, spec.name
        if spec == AUTO:
            spec = resolve_auto(self.draft_path)
        if spec in (None, "target"):
            return Arbiter.target(), "target"
        if spec in ("fly", "aasd"):  # the training-free rules, from their settings
            try:
                rule = (Arbiter.fly(params.fly_window, params.fly_entropy, params.fly_top_k) if spec == "fly"
                        else Arbiter.aasd(params.aasd_alpha, params.aasd_beta))
            except _cospec.CospecError as exc:
                raise from_native(exc) from None
            return rule, spec
        path = resolve_arbiter_path(spec)
        threshold = -1.0 if params.arbiter_threshold is None else params.arbiter_threshold
        key = (os.path.abspath(path), threshold, params.arbiter_head, params.arbiter_gate)
        if key not in self._learned:
            if (hint := missing_arbiter_hint(spec, self.draft_path)) is not None:
                raise ArbiterError(hint)
            head = onnx_head(path) if params.arbiter_head == "onnx" else None
            try:
                self._learned[key] = Arbiter.load(self._native, os.fspath(path), threshold, head,
                                                  use_gate=params.arbiter_gate)
            except _cospec.CospecError as exc:
                error = from_native(exc)
                if isinstance(error, ArbiterDraftError):
                    raise ArbiterDraftError(f"{error}\n{another_draft_fix(self.draft_path)}", error.status,
                                            error.status_name) from None
                raise error from None
        arbiter = self._learned[key]
        return arbiter, str(spec) if str(spec) in NAMED_ARBITERS else arbiter.name

    @staticmethod
    def _trained_block_length(arbiter: Arbiter, params: GenerationParams) -> GenerationParams:
        """A call that leaves --draft-max at its default drafts a learned arbiter's blocks up to the
        length its states were drafted with (arbiter.gguf's draft_max)."""
        trained = arbiter.meta("draft_max") if arbiter.kind in LEARNED_KINDS else None
        if trained is None or params.draft_max != DEFAULTS.draft_max or int(trained) == params.draft_max:
            return params
        return params.updated(draft_max=int(trained))

    def _warn_if_trained_otherwise(self, arbiter: Arbiter, name: str, params: GenerationParams) -> None:
        """Once per arbiter and block length: a learned arbiter run with another --draft-max than
        the one its training states were drafted with (its accuracy moved by 1-2 points at 16
        against 8 on the demo pair)."""
        trained = arbiter.meta("draft_max") if arbiter.kind in LEARNED_KINDS else None
        if trained is None or int(trained) == params.draft_max or (name, params.draft_max) in self._warned:
            return
        self._warned.add((name, params.draft_max))
        warnings.warn(f"arbiter {name} was trained on blocks of up to {int(trained)} draft tokens; with --draft-max "
                      f"{params.draft_max} it decides on blocks it never saw (its accuracy may move; "
                      f"--draft-max {int(trained)} is what it learned)", ArbiterSettingsWarning, stacklevel=4)
