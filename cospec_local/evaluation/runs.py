"""Named configurations that `eval` and `bench` compare side by side: a decoding
mode plus, for speculative decoding, the arbiter that settles mismatches.

    target-only, draft-only     plain decoding with one model
    sps                         speculative, target arbiter (lossless)
    fly                         speculative, FLy's rule
    aasd                        speculative, AASD's conditional verification
    ngram                       speculative, the n-gram drafter alone (lossless; the REST row)
    head                        speculative, the head drafter alone (an EAGLE-3 head given as the draft,
                                or the target's MTP layers; lossless: the EAGLE-3 / MTP row)
    cospec                      speculative, the bundled learned arbiter made for this draft
    cospec:NAME_OR_PATH         speculative, that learned arbiter (e.g. cospec:demo-features)
    speculative:ARBITER         speculative with any arbiter (target, fly, a name or a folder)

A label names exactly one (mode, arbiter, draft sources), and records keep the arbiter's identity beside it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..arbiter.catalog import AUTO, bundled_arbiter_for, resolve_auto

# label: (mode, arbiter, draft sources (--spec-type; None: the eval's own))
ALIASES = {
    "target-only": ("target-only", None, None),
    "draft-only": ("draft-only", None, None),
    "sps": ("speculative", "target", None),
    "ngram": ("speculative", "target", "ngram"),
    "head": ("speculative", "target", "head"),
    "fly": ("speculative", "fly", None),
    "aasd": ("speculative", "aasd", None),
}


@dataclass(frozen=True)
class Run:
    label: str
    mode: str
    arbiter: str | None  # None in the plain modes
    spec_type: str | None = None  # None: the call's own draft sources

    def overrides(self) -> dict:
        """What this run sets on a generation's parameters."""
        return {"mode": self.mode, "arbiter": self.arbiter or "target",
                **({"spec_type": self.spec_type} if self.spec_type else {})}


def default_learned_arbiter(draft_path: str | os.PathLike | None) -> str:
    """The bundled learned arbiter trained for this draft (by its named model's file)."""
    name = bundled_arbiter_for(draft_path)
    if name is None:
        raise ValueError("no bundled learned arbiter fits this draft: name one as cospec:NAME_OR_FOLDER")
    return name


def parse_runs(text: str, draft_path: str | os.PathLike | None = None) -> list[Run]:
    runs = []
    for label in (part.strip() for part in text.split(",")):
        if not label:
            continue
        if label in ALIASES:
            runs.append(Run(label, *ALIASES[label]))
        elif label == "cospec":
            runs.append(Run(label, "speculative", default_learned_arbiter(draft_path)))
        elif label.startswith(("cospec:", "speculative:")):
            arbiter = label.split(":", 1)[1]
            if not arbiter:
                raise ValueError(f"{label!r}: name the arbiter after the colon")
            if arbiter == AUTO:  # resolved here, so records name the arbiter that ran
                arbiter = resolve_auto(draft_path)
            runs.append(Run(label, "speculative", arbiter))
        else:
            raise ValueError(f"unknown run {label!r}; use target-only, draft-only, sps, ngram, head, fly, aasd, cospec, "
                             f"cospec:NAME_OR_FOLDER or speculative:ARBITER")
    if len({r.label for r in runs}) != len(runs):
        raise ValueError("a run is named twice")
    return runs
