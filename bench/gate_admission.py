"""Which prompts a learned arbiter's domain gate admits: per prompt file, the share it lets the
arbiter decide, through the engine's own gate, in the target's own chat format and in another
(--chat-template-file). Only prompts are tokenized: no generation, so machine load does not matter.

    python bench/gate_admission.py -m gemma3-270m -md smollm2-135m --arbiter gemma3-smollm2-words \\
        --formats own,cospec_local/data/gemma3-smollm2/qa.jinja \\
        --prompts bench/headroom/tasks/antonyms-reworded-test.jsonl,chat,listops --out OUT.json

--prompts: task files (.jsonl with a "prompt" field), `chat` (bench/chat_identity.py's 100 held-out
general chat prompts) or a task family (its test split, 100 problems).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from chat_identity import chat_prompts  # noqa: E402
from results_report import command  # noqa: E402

from cospec_local import Engine  # noqa: E402
from cospec_local.tasks import load_task  # noqa: E402


def prompts_of(source: str, n: int) -> list[str]:
    if source == "chat":
        return chat_prompts(n)
    if source.endswith(".jsonl"):
        return [p.prompt for p in load_task(source, None, n)]
    return [p.prompt for p in load_task(source, "test", n)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-md", "--model-draft", required=True, help="the draft the arbiter was made for")
    ap.add_argument("--arbiter", required=True)
    ap.add_argument("--formats", default="own", help="comma-separated: own (the target's template), raw (the prompt's "
                                                     "text alone) or template files")
    ap.add_argument("--prompts", required=True, help="comma-separated task files, chat or task families")
    ap.add_argument("-n", type=int, default=100, help="most prompts of each source")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    rows = []
    for fmt in a.formats.split(","):
        template = None if fmt in ("own", "raw") else Path(fmt).read_text(encoding="utf-8")
        with Engine(a.model, a.model_draft, n_ctx=1024, n_threads=1, calibration=None,
                    **({"chat_template": template} if template else {})) as engine:
            arbiter = engine.arbiter(a.arbiter)
            for source in a.prompts.split(","):
                prompts = prompts_of(source, a.n)
                tokens = [engine.tokenize(p) if fmt == "raw" else engine.render_chat([{"role": "user", "content": p}])
                          for p in prompts]
                scores = [arbiter.gate_coverage(t) for t in tokens]
                admitted = sum(arbiter.admits(t) for t in tokens)
                rows.append({"format": Path(fmt).name, "prompts": Path(source).name, "n": len(prompts),
                             "admitted": admitted, "min_score": min(scores), "median_score": sorted(scores)[len(scores) // 2]})
    lines = [f"`{' '.join(command('gate_admission.py', argv))}`", "", "| format | prompts | admitted | lowest score | median score |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['format']} | {r['prompts']} | {r['admitted']} of {r['n']} | {r['min_score']:.3f} | "
              f"{r['median_score']:.3f} |" for r in rows]
    print("\n".join(lines))
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"command": command("gate_admission.py", argv), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
