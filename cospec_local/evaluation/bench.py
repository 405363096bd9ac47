"""`cospec-local bench`: runs (target-only, sps, fly, learned arbiters; see runs.py in this package)
on the same prompts in one process, so speed-ups are ratios measured side by side
on the same (noisy) machine."""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

from ..engine import Engine
from .machine import OtherLoad, busy_note
from ..params import GenerationParams
from .runs import Run


def speedup_bound(a: float, k: int, c: float, v: float) -> float:
    """Expected speed-up of K-token blocks over target-only (Leviathan et al.) with a
    measured verify cost: (1 - a^(K+1)) / ((1 - a)(K c + v(K))), where a is the
    per-token acceptance, c = t_draft / t_target and v(K) = t_verify(K+1) / t_target."""
    tokens = k + 1 if a >= 1.0 else (1 - a ** (k + 1)) / (1 - a)
    return tokens / (k * c + v)

BUILTIN_PROMPTS = [
    "The capital of France is",
    "Write a short story about a robot who learns to paint.",
    "Explain how photosynthesis works in simple terms.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "List five tips for staying productive when working from home:\n1.",
    "Q: A train travels 60 miles in 1.5 hours. What is its average speed?\nA:",
    "Translate to French: 'The weather is nice today and I want to go for a walk.'",
    "The three laws of thermodynamics are",
]


def task_prompts(families: Sequence[str], n: int, split: str = "test") -> list[str]:
    """n prompts drawn in turn from the given task families (for models trained on those tasks),
    each followed by the newline that ends a prompt in their training data."""
    from ..tasks import load_task

    per_family = [load_task(f, split, limit=n) for f in families]
    return [per_family[i % len(families)][i // len(families)].prompt + "\n" for i in range(n)]


def measure_costs(engine: Engine, tokenized: Sequence[list[int]], params: GenerationParams, plain_ms: dict,
                  k: int = 8) -> dict:
    """The cost model that arbiters which keep mismatches choose block lengths with, measured:
    a draft step and each verified token beyond the first, in target steps. The marginal comes
    from plain speculative decoding at a fixed K (every verify pass holds K + 1 tokens)."""
    blocks = verify_ms = 0.0
    for prompt in tokenized:
        s = engine.generate(prompt, params, mode="speculative", arbiter="target", draft_max=k,
                            adaptive_draft=False, draft_p_min=0.0).stats
        blocks += s.blocks
        verify_ms += s.verify_ms
    v = verify_ms / blocks / plain_ms["target-only"] if blocks else float("nan")
    return {"draft_cost": round(plain_ms["draft-only"] / plain_ms["target-only"], 4),
            "verify_cost": round(max(0.0, (v - 1.0) / k), 4), "measured_with_k": k}


@dataclass
class RunTotals:
    """One row's sums over prompts and repeats, and its tokens and time in each repeat."""
    tokens: int = 0
    ms: float = 0.0
    drafted: int = 0
    accepted: int = 0
    kept: int = 0
    blocks: int = 0
    fallbacks: int = 0
    verify_ms: float = 0.0
    inside_ms: float = 0.0  # in llama.cpp's decode calls: drafting and verifying
    arbiter_ms: float = 0.0
    arbiter_calls: int = 0
    per_repeat: list = field(default_factory=list)  # [tokens, ms] of each repeat
    outputs: list = field(default_factory=list)  # each prompt's tokens, from the first repeat

    def add(self, repeat: int, result) -> None:
        s = result.stats
        self.tokens += s.predicted_n
        self.ms += s.predicted_ms
        self.drafted += s.draft_n
        self.accepted += s.draft_n_accepted
        self.kept += s.arbiter_keeps
        self.blocks += s.blocks
        self.fallbacks += s.target_fallbacks
        self.verify_ms += s.verify_ms
        self.inside_ms += s.draft_ms + s.verify_ms
        self.arbiter_ms += s.arbiter_ms
        self.arbiter_calls += s.arbiter_calls
        while len(self.per_repeat) <= repeat:
            self.per_repeat.append([0, 0.0])
        self.per_repeat[repeat][0] += s.predicted_n
        self.per_repeat[repeat][1] += s.predicted_ms
        if repeat == 0:
            self.outputs.append(result.tokens)


@dataclass
class BenchRow:
    """One run at one block length K (None for target-only), against target-only in the same run."""
    draft_max: int | None
    run: str
    tokens: int
    seconds: float
    tokens_per_second: float
    speedup: float | None
    speedup_per_repeat: list | None  # the speed-up within each repeat
    noisy: bool | None  # the repeats' spread is wider than the effect
    acceptance_rate: float | None  # drafted tokens that reached the output (matched or kept)
    mean_accepted_per_block: float | None
    arbiter_keeps: int
    arbiter_share: float | None  # of generation time, in the learned arbiter's own pass
    arbiter_ms_per_call: float | None
    speedup_bound: float | None  # Leviathan et al.'s model from this row's acceptance and costs
    overhead_fraction: float | None  # time outside llama.cpp's decode calls
    prompts_identical_to_target: int | None


@dataclass
class BenchReport:
    """What `cospec-local bench` measured and under which settings (bench.json is its fields)."""
    target: str
    draft: str | None
    prompts: int
    max_tokens: int
    repeat: int
    draft_p_min: float
    adaptive_draft: bool
    temperature: float
    seed: int
    c: float | None  # a draft token's time in target tokens' time
    costs: dict | None  # the timing-free cost model (--draft-cost, --verify-cost) measured for this pair and machine
    other_load: float | None  # the share of this process's CPUs' time other work took during the runs
    results: list[BenchRow]
    calibration: str | None = None  # the id of the pair's calibration the engine ran under

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "BenchReport":
        fields = {f.name for f in dataclasses.fields(cls)}
        report = cls(**{k: v for k, v in data.items() if k in fields})
        report.results = [BenchRow(**r) for r in data["results"]]
        return report


def _tps(tokens: float, ms: float) -> float:
    return 1000.0 * tokens / ms if ms else 0.0


def plain_costs(engine: Engine, tokenized: Sequence[list[int]], draft_tokenized: Sequence, params: GenerationParams
                ) -> dict[str, float]:
    """Milliseconds a token of the draft alone and of the target alone, for the speed bound."""
    plain_ms = {}
    for mode in ("draft-only", "target-only"):
        stats = [engine.generate(p, params, mode=mode, draft_prompt=d).stats for p, d in zip(tokenized, draft_tokenized)]
        plain_ms[mode] = sum(r.predicted_ms for r in stats) / sum(r.predicted_n for r in stats)
    return plain_ms


def make_row(k: int | None, label: str, totals: RunTotals, base: RunTotals | None, params: GenerationParams,
             plain_ms: dict, repeat: int) -> BenchRow:
    """A row's rates, its speed-up over target-only (per repeat too) and its speed bound."""
    speed = _tps(totals.tokens, totals.ms)
    base_tps = _tps(base.tokens, base.ms) if base is not None else None
    is_base = label == "target-only"
    same = None
    if base is not None and not is_base:
        same = sum(x == y for x, y in zip(totals.outputs, base.outputs))
    bound = None
    # The bound models blocks of exactly K drafted tokens: not what adaptive lengths or
    # --draft-p-min's early ends (greedy only) run, so those rows get none.
    full_blocks = not params.adaptive_draft and (params.draft_p_min == 0 or params.temperature > 0)
    if plain_ms and totals.blocks and full_blocks:
        # a: per-token acceptance under the geometric model (accepted vs ends by rejection)
        ends = totals.accepted + totals.fallbacks
        per_token = totals.accepted / ends if ends else 0.0
        c = plain_ms["draft-only"] / plain_ms["target-only"]
        v = totals.verify_ms / totals.blocks / plain_ms["target-only"]
        bound = speedup_bound(per_token, k, c, v)
    speedup = speed / base_tps if base_tps else None
    by_repeat = noisy = None
    if base_tps and not is_base:
        by_repeat = [round(_tps(*mine) / _tps(*theirs), 4) if _tps(*theirs) else None
                     for mine, theirs in zip(totals.per_repeat, base.per_repeat)]
        if repeat >= 2 and None not in by_repeat:
            # The spread of the repeats against the size of the effect: a half-range wider than
            # the distance from 1.0x means the sign of the effect is not established.
            noisy = (max(by_repeat) - min(by_repeat)) / 2 > abs(speedup - 1.0)
    return BenchRow(
        draft_max=k, run=label, tokens=int(totals.tokens), seconds=totals.ms / 1000.0, tokens_per_second=speed,
        speedup=speedup, speedup_per_repeat=by_repeat, noisy=noisy,
        acceptance_rate=totals.accepted / totals.drafted if totals.drafted else None,
        mean_accepted_per_block=totals.accepted / totals.blocks if totals.blocks else None,
        arbiter_keeps=int(totals.kept),
        arbiter_share=totals.arbiter_ms / totals.ms if totals.ms else None,
        arbiter_ms_per_call=totals.arbiter_ms / totals.arbiter_calls if totals.arbiter_calls else None,
        speedup_bound=bound,
        overhead_fraction=max(0.0, totals.ms - totals.inside_ms) / totals.ms if totals.ms else None,
        prompts_identical_to_target=same)


def run_bench(engine: Engine, prompts: Sequence[str], ks: Sequence[int], runs: Sequence[Run], params: GenerationParams,
              repeat: int = 3, as_chat: bool = False, progress: Callable[[str], None] | None = None) -> BenchReport:
    """Generate params.max_tokens per prompt (EOS ignored, so every run does the same work)
    for each K and run. Runs are interleaved per prompt, so machine noise hits all alike;
    target-only, which has no K, runs once per prompt and repeat, and every speed-up is over
    it. With several repeats each row gives the speed-up's range over repeats and is flagged
    noisy when that spread is larger than the effect itself."""
    say = progress or (lambda msg: None)
    params = params.updated(ignore_eos=True)
    baseline = next((r for r in runs if r.label == "target-only"), None)
    others = [r for r in runs if r is not baseline]
    tokenized = [engine.render_chat([{"role": "user", "content": p}]) if as_chat else engine.tokenize(p)
                 for p in prompts]
    # A draft of another vocabulary reads a chat in its own format.
    draft_tokenized = [engine.render_draft_chat([{"role": "user", "content": p}]) if as_chat else None
                       for p in prompts]

    def generate(i: int, run: Run, **overrides):
        return engine.generate(tokenized[i], params, draft_prompt=draft_tokenized[i],
                               **{**run.overrides(), **overrides})

    # Warm-up: first calls pay for page faults and thread start-up.
    for run in runs:
        generate(0, run, max_tokens=8, draft_max=ks[0])
    plain_ms, costs = {}, None
    if baseline is not None and engine.has_draft:  # (a head or the n-gram drafter alone: no draft model to time)
        plain_ms = plain_costs(engine, tokenized, draft_tokenized, params)
        costs = measure_costs(engine, tokenized, params, plain_ms)

    totals: dict[tuple, RunTotals] = defaultdict(RunTotals)  # (K, label) -> totals; K is None for target-only
    with OtherLoad() as load:  # what else ran meanwhile: a busy machine makes the ratios meaningless
        for rep in range(repeat):
            for i in range(len(tokenized)):
                if baseline is not None:
                    totals[None, baseline.label].add(rep, generate(i, baseline))
                for k in ks:
                    for run in others:
                        totals[k, run.label].add(rep, generate(i, run, draft_max=k))
                say(f"prompt {i + 1}/{len(tokenized)} (repeat {rep + 1}/{repeat})")

    base = totals[None, "target-only"] if baseline is not None else None
    keys = [(None, "target-only")] * (baseline is not None) + [(k, r.label) for k in ks for r in others]
    return BenchReport(
        target=engine.target_path, draft=engine.draft_path, prompts=len(prompts), max_tokens=params.max_tokens,
        repeat=repeat, draft_p_min=params.draft_p_min, adaptive_draft=params.adaptive_draft,
        temperature=params.temperature, seed=params.seed,
        c=plain_ms["draft-only"] / plain_ms["target-only"] if plain_ms else None, costs=costs, other_load=load.share,
        results=[make_row(k, label, totals[k, label], base, params, plain_ms, repeat) for k, label in keys],
        calibration=engine.calibration_id)


def _fmt(value, spec: str, suffix: str = "") -> str:
    return "-" if value is None else format(value, spec) + suffix


def markdown_table(report: BenchReport) -> str:
    temperature = report.temperature
    sampling = f"temperature {temperature:g}, seed {report.seed}" if temperature > 0 else "greedy"
    lines = [
        f"target: {report.target}  ",
        f"draft: {report.draft} (one draft token costs {_fmt(report.c, '.3f')} target tokens' time)  ",
        f"{report.prompts} prompts x {report.max_tokens} tokens (end of text ignored, where generate stops) x "
        f"{report.repeat} repeat(s), {sampling}, "
        + ("adaptive block length" if report.adaptive_draft else
           "fixed block length (each row drafts K tokens a block, where generate and chat adapt it)")
        + (f", draft_p_min {report.draft_p_min}" if report.draft_p_min else "")
        + "; every run in this one process, interleaved prompt by prompt",
    ]
    if report.costs:
        c = report.costs
        lines.append(f"  \ncost model for arbiters that keep, measured here: `--draft-cost {c['draft_cost']} "
                     f"--verify-cost {c['verify_cost']}`")
    lines += [
        "",
        "| K | run | tok/s | speed-up over target-only | bound | acceptance | accepted/block | arbiter keeps | arbiter time "
        "| outside llama.cpp | same as target |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    noisy = False
    for r in report.results:
        same = "-" if r.prompts_identical_to_target is None else f"{r.prompts_identical_to_target}/{report.prompts}"
        speedup = _fmt(r.speedup, ".2f", "x")
        spread = [v for v in (r.speedup_per_repeat or []) if v is not None]
        if len(spread) >= 2:
            speedup += f" ({min(spread):.2f}-{max(spread):.2f})"
        if r.noisy:
            speedup += " noisy"
            noisy = True
        lines.append(
            f"| {_fmt(r.draft_max, 'd')} | {r.run} | {r.tokens_per_second:.1f} | {speedup} "
            f"| {_fmt(r.speedup_bound, '.2f', 'x')} "
            f"| {_fmt(r.acceptance_rate, '.1%')} | {_fmt(r.mean_accepted_per_block, '.2f')} "
            f"| {r.arbiter_keeps} | {_fmt(r.arbiter_share, '.1%')} | {_fmt(r.overhead_fraction, '.1%')} "
            f"| {same} |")
    lines += ["", "Columns: **speed-up**, tokens/s over target-only's on the same prompts in this run (in brackets "
                  "its range over the repeats); **bound**, the speed-up the standard model predicts from this run's "
                  "acceptance a, draft cost c and verify cost v(K): (1-a^(K+1)) / ((1-a)(Kc+v(K))), blank (-) where "
                  "blocks are shorter than K (adaptive lengths, --draft-p-min); **acceptance**, the share of drafted "
                  "tokens that reached the output (matched or kept); **accepted/block**, those tokens per block; "
                  "**arbiter keeps**, mismatches settled for the draft; **arbiter time**, the share of generation "
                  "time in the learned arbiter's own pass; **outside llama.cpp**, the share spent outside llama.cpp's "
                  "decode calls (sampling, bookkeeping); **same as target**, prompts whose output is token for "
                  "token target-only's."]
    if (note := busy_note(report.other_load)) is not None:
        lines += ["", f"**Warning**: {note}."]
    if noisy:
        lines += ["", "noisy: half the range of the repeats' speed-ups is wider than the speed-up's distance from 1.0x, "
                      "so this run does not establish which side of 1.0x the run is on; repeat more (--repeat) on an "
                      "idle machine."]
    return "\n".join(lines)
