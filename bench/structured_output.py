"""What a grammar costs: tokens/s of target-only and speculative decoding, each free and held to a
JSON schema's grammar (llama.cpp's converter), on chat requests for JSON, in one run.

Every prompt runs with every configuration back to back, the order rotating with the prompt and
the repeat; the first repeat warms up and is not counted. Speculative and target-only outputs
under the grammar must be the same tokens (greedy lossless speculation), which it checks.

    python bench/structured_output.py -m smollm2-135m -md smollm2-135m-draft --repeats 3 --out OUT.json
"""
from __future__ import annotations

import argparse
import json
import time

from cospec_local import Engine
from cospec_local.json_grammar import schema_grammar
from cospec_local.evaluation.machine import OtherLoad, busy_note, machine_identity

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"},
                                           "hobbies": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "city", "hobbies"]}
CITIES = ["Paris", "Lima", "Oslo", "Rome", "Cairo", "Tokyo", "Quito", "Hanoi"]
CONFIGS = {"target-only": {"mode": "target-only"}, "target-only + grammar": {"mode": "target-only", "grammar": True},
           "speculative": {}, "speculative + grammar": {"grammar": True}}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-md", "--model-draft", default="smollm2-135m-draft")
    ap.add_argument("--prompts", type=int, default=len(CITIES))
    ap.add_argument("--repeats", type=int, default=3, help="counted repeats (one more warms up)")
    ap.add_argument("-n", "--max-tokens", type=int, default=96)
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("--out", help="write the report here (JSON)")
    args = ap.parse_args(argv)
    grammar = schema_grammar(PERSON)
    totals = {name: [0, 0.0] for name in CONFIGS}
    outputs: dict = {}
    with Engine(args.model, args.model_draft, n_ctx=1024, n_threads=args.threads) as engine, OtherLoad() as load:
        prompts = [engine.render_chat([{"role": "user", "content": f"Describe a person from {city} as JSON with "
                                                                   "name, age, city and hobbies."}])
                   for city in (CITIES * (1 + args.prompts // len(CITIES)))[:args.prompts]]
        names = list(CONFIGS)
        for repeat in range(args.repeats + 1):
            for i, prompt in enumerate(prompts):
                shift = (i + repeat) % len(names)
                for name in names[shift:] + names[:shift]:
                    settings = dict(CONFIGS[name], grammar=grammar) if CONFIGS[name].get("grammar") else CONFIGS[name]
                    start = time.perf_counter()
                    result = engine.generate(prompt, max_tokens=args.max_tokens, **settings)
                    elapsed = time.perf_counter() - start
                    outputs.setdefault((i, name), result.tokens)
                    if repeat > 0:
                        totals[name][0] += len(result.tokens)
                        totals[name][1] += elapsed
    lossless = all(outputs[i, "speculative + grammar"] == outputs[i, "target-only + grammar"]
                   for i in range(len(prompts)))
    speed = {name: n / s for name, (n, s) in totals.items()}
    report = {"command": "python bench/structured_output.py " + " ".join(argv or []), "target": args.model,
              "draft": args.model_draft, "prompts": len(prompts), "repeats": args.repeats,
              "max_tokens": args.max_tokens, "tokens_per_s": speed,
              "speedup_over_target_only": {"free": speed["speculative"] / speed["target-only"],
                                           "grammar": speed["speculative + grammar"] / speed["target-only + grammar"]},
              "grammar_cost": {"target-only": speed["target-only + grammar"] / speed["target-only"],
                               "speculative": speed["speculative + grammar"] / speed["speculative"]},
              "lossless_under_grammar": lossless, "other_load": load.share, "machine": machine_identity()}
    print(json.dumps({k: v for k, v in report.items() if k != "machine"}, indent=1))
    print("\n| configuration | tokens/s |\n|---|---|")
    for name, value in speed.items():
        print(f"| {name} | {value:.1f} |")
    if (note := busy_note(load.share)) is not None:
        print(f"warning: {note}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
