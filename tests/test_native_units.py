"""The C++ unit tests of the generation loop's parts that need no model (native/tests/unit_tests.cpp:
the text stream's stop strings and UTF-8 hold-back, the order of the samplers, the repeat penalty),
built beside the extension by the package's CMake build."""
from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_native_unit_tests_pass():
    built = sorted(REPO.glob("build/*/cospec_unit_tests"), key=lambda p: p.stat().st_mtime)
    assert built, "cospec_unit_tests is not built: ./install.sh builds it with the extension (build/)"
    run = subprocess.run([str(built[-1])], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    checks, failed = (int(x) for x in run.stdout.split()[::2][:2])
    assert failed == 0 and checks > 1000, run.stdout


def test_the_public_module_binds_cospec_h_and_the_internals_are_apart():
    """_cospec is cospec.h's binding; the engine's internals that tests check on crafted inputs
    (the n-gram drafter, the text bridge, the UTF-8 hold-back, the length tuner) live in
    _cospec_internals, and the public module has none of them."""
    import re
    from pathlib import Path

    from cospec_local import _cospec, _cospec_internals

    internals = {"NgramDrafter", "TextBridge", "utf8_complete_end", "DraftTuner", "fastest_length"}
    assert internals <= set(dir(_cospec_internals))
    assert not internals & set(dir(_cospec))
    python_dir = Path(__file__).resolve().parents[1] / "native" / "python"
    own = {"native_call.h", "arbiter_binding.h", "engine_binding.h"}  # the module's own files, over cospec.h
    for source in ["bindings.cpp", "native_call.cpp", "arbiter_binding.cpp", "engine_binding.cpp", *sorted(own)]:
        included = set(re.findall(r'#include "([^"]+)"', (python_dir / source).read_text()))
        assert included <= own | {"cospec.h"}, (source, included)  # none of the engine's internal headers
    assert "cospec.h" in set(re.findall(r'#include "([^"]+)"', (python_dir / "native_call.h").read_text()))
    module_text = "".join((python_dir / name).read_text() for name in ["bindings.cpp", "arbiter_binding.cpp",
                                                                         "engine_binding.cpp"])
    assert module_text.count('m.def("status_name"') == 1
