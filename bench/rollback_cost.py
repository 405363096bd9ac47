"""What a rejected block costs on memories that cannot drop a tail (recurrent and hybrid models),
against attention models and against llama.cpp's own `llama-speculative-simple` (which saves and
restores a checkpoint of the target too): the zoo's tiny random models
(cospec_local/formats/tiny_models.py), a ~900-token prompt, a draft of another family that almost
never agrees, greedy, fixed K, the same threads, each program's runs beside each other.

    python bench/rollback_cost.py --targets llama,qwen3,falconh1,qwen35,mamba2,jamba,lfm2 -k 4 --out bench/rollback_cost

Per target: sps time / target-only time in the engine (the cost of speculating with a draft that is
always refused), that ratio over the attention targets' median, the tokens the target decoded
after the prompt (no re-decoding of the context: about 2 (K + 1) per generated token at most), and
the engine's sps time over llama-speculative-simple's.
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from ngram_vs_llama_cpp import build_speculative_simple  # noqa: E402
from results_report import command, report  # noqa: E402

PROMPT = ("Speculative decoding lets a small draft model propose a block of tokens that the large target model "
          "checks in one batched pass; where they disagree, the target's token is taken and the block ends. ")


def llama_sps_seconds(binary: Path, target: Path, draft: Path, prompt: str, k: int, n: int, threads: int) -> float:
    cmd = [str(binary), "-m", str(target), "-md", str(draft), "-p", prompt, "--spec-type", "draft-simple",
           "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0", "--draft-p-min", "0", "-n", str(n), "--temp", "0",
           "--top-k", "1", "--ignore-eos", "-t", str(threads), "-td", str(threads), "-c", "2048"]
    # errors="replace": a random model's text is not valid UTF-8
    out = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=600)
    text = out.stdout + out.stderr
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", text)
    if out.returncode != 0 or not m:
        raise RuntimeError(f"llama-speculative-simple failed on {target.name}:\n{text[-2000:]}")
    return float(m.group(2))


def main(argv=None) -> int:
    from cospec_local import Engine
    from cospec_local.formats import tiny_models
    from cospec_local.evaluation.machine import OtherLoad

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", default="llama,qwen3,gemma3,falconh1,qwen35,mamba2,jamba,lfm2,granitehybrid")
    ap.add_argument("--draft", default="qwen2", help="a zoo model of another family (it almost never agrees)")
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--repeat-prompt", type=int, default=20, help="copies of the prompt's sentence (~45 tokens each)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each, the median kept")
    ap.add_argument("--zoo", type=Path, default=None, help="default: the checkout's zoo, as the tests build it")
    ap.add_argument("--llama-bin", type=Path, default=REPO / ".cache" / "llama-bin")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    targets = a.targets.split(",")
    zoo = tiny_models.build(sorted({*targets, a.draft}), a.zoo or tiny_models.cache_dir(REPO))
    binary = build_speculative_simple(a.llama_bin)
    prompt = PROMPT * a.repeat_prompt
    rows, load = {}, OtherLoad()
    for name in targets:
        times = {"target_only": [], "sps": [], "llama_sps": []}
        with Engine(zoo[name], zoo[a.draft], n_ctx=2048, n_threads=a.threads) as engine:
            n_prompt = len(engine.tokenize(prompt))
            for _ in range(a.runs):
                with load.window():
                    engine.reset()
                    plain = engine.generate(prompt, max_tokens=a.n, mode="target-only", ignore_eos=True)
                    engine.reset()
                    sps = engine.generate(prompt, max_tokens=a.n, spec_type="draft", draft_max=a.k,
                                          adaptive_draft=False, ignore_eos=True)
                times["target_only"].append(plain.stats.predicted_ms / 1000)
                times["sps"].append(sps.stats.predicted_ms / 1000)
                times["llama_sps"].append(llama_sps_seconds(binary, zoo[name], zoo[a.draft], prompt, a.k, a.n,
                                                            a.threads))
        med = {key: statistics.median(v) for key, v in times.items()}
        s = sps.stats
        rows[name] = {"kind": tiny_models.ARCHITECTURES[name], "prompt_tokens": n_prompt,
                      "identical": sps.tokens == plain.tokens, "acceptance": s.acceptance_rate,
                      "target_decoded": s.target_decoded, "restored": s.restored, "generated": s.predicted_n,
                      **{f"{key}_s": v for key, v in med.items()},
                      "sps_over_target_only": med["sps"] / med["target_only"],
                      "sps_over_llama": med["sps"] / med["llama_sps"]}
        print(f"{name:<14} sps {rows[name]['sps_over_target_only']:.2f}x target-only, over llama.cpp's "
              f"{rows[name]['sps_over_llama']:.2f}, target decoded {s.target_decoded} for {s.predicted_n} "
              f"(restored {s.restored}), {'same' if rows[name]['identical'] else 'DIFFERENT'}", flush=True)
    attention = [r["sps_over_target_only"] for r in rows.values() if r["kind"].startswith("attention")]
    base = statistics.median(attention) if attention else float("nan")
    cmd = command("rollback_cost.py", argv)
    lines = [f"# Rollback cost: sps with a draft that is always refused, K = {a.k}", "",
             f"`{' '.join(cmd)}`", "",
             f"Zoo models (hidden 64, 4 layers), draft {a.draft}, {a.n} tokens after a "
             f"{next(iter(rows.values()))['prompt_tokens']}-token prompt, {a.threads} threads, medians of {a.runs}.", "",
             "| target | memory | sps / target-only | over the attention median | target decoded / generated | "
             "engine sps / llama.cpp sps |", "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        r["over_attention"] = r["sps_over_target_only"] / base
        lines.append(f"| {name} | {r['kind']} | {r['sps_over_target_only']:.2f}x | {r['over_attention']:.2f} | "
                     f"{r['target_decoded']} / {r['generated']} | {r['sps_over_llama']:.2f} |")
    report(lines, cmd, a.out, load.share, k=a.k, n=a.n, rows=rows, at=time.strftime("%Y-%m-%d"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
