"""Write the SmolLM2 arithmetic pair's task file: one-operation arithmetic questions in a few
phrasings, as a user's plain jsonl task ({"prompt", "answer", "solution"}; the answer is scored
by final number, the solution is the worked reply a draft is taught with).

    python scripts/make_arithmetic_tasks.py cospec_local/data/smollm2-arith/arithmetic.jsonl --n 6000

Each calculation (a, op, b) occurs once in a file. The draft's own training data come from a
second file that leaves out every calculation of the first file's dev and test rows, in any
phrasing, so the draft never saw a held-out problem's numbers:

    python scripts/make_arithmetic_tasks.py OUT/draft-arithmetic.jsonl --n 40000 --seed 1 --every-phrasing \
        --exclude-heldout-of cospec_local/data/smollm2-arith/arithmetic.jsonl

Deterministic for --seed. Operands: addition and subtraction of two 2-digit numbers (the result
never negative), multiplication of a 2-digit number by a 1-digit one, exact division of a 2- or
3-digit number by a 1-digit one. SmolLM2-135M-Instruct answers about one in ten of them.
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

PHRASINGS = {
    "+": ("What is {a} + {b}?", "Compute {a} + {b}.", "How much is {a} plus {b}?", "Add {a} and {b}.",
          "What do you get when you add {b} to {a}?"),
    "-": ("What is {a} - {b}?", "Compute {a} - {b}.", "How much is {a} minus {b}?", "Subtract {b} from {a}.",
          "What is {b} less than {a}?"),
    "*": ("What is {a} * {b}?", "Compute {a} * {b}.", "How much is {a} times {b}?", "Multiply {a} by {b}.",
          "What is the product of {a} and {b}?"),
    "/": ("What is {a} / {b}?", "Compute {a} / {b}.", "How much is {a} divided by {b}?", "Divide {a} by {b}.",
          "What is {a} split into {b} equal parts?"),
}


def calculation(rng: random.Random) -> tuple[int, str, int, int]:
    op = rng.choice("+-*/")
    if op == "+":
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        c = a + b
    elif op == "-":
        a, b = sorted((rng.randint(10, 99), rng.randint(10, 99)), reverse=True)
        c = a - b
    elif op == "*":
        a, b = rng.randint(10, 99), rng.randint(2, 9)
        c = a * b
    else:
        b, c = rng.randint(2, 9), rng.randint(3, 99)
        a = b * c
    return a, op, b, c


def main() -> None:
    from cospec_local.tasks import load_task

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--n", type=int, default=6000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--every-phrasing", action="store_true", help="write each calculation in all its phrasings")
    ap.add_argument("--exclude-heldout-of", type=Path, default=None,
                    help="leave out the calculations of this task file's dev and test rows")
    args = ap.parse_args()
    excluded = set()
    if args.exclude_heldout_of:
        for split in ("dev", "test"):
            excluded |= {row_fact(p.solution) for p in load_task(args.exclude_heldout_of, split)}
    rng, seen, rows = random.Random(args.seed), set(excluded), []
    tries = 0
    while len(rows) < args.n and tries < 50 * args.n:
        tries += 1
        a, op, b, c = calculation(rng)
        if (a, op, b) in seen:
            continue
        seen.add((a, op, b))
        phrasings = PHRASINGS[op] if args.every_phrasing else (rng.choice(PHRASINGS[op]),)
        for phrasing in phrasings:
            rows.append({"id": f"arith1-{len(rows)}", "prompt": phrasing.format(a=a, b=b), "answer": str(c),
                         "solution": f"{a} {op} {b} = {c}"})
    with args.out.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(f"{len(rows)} rows, {len(seen) - len(excluded)} calculations -> {args.out}")


def row_fact(solution: str) -> tuple[int, str, int]:
    a, op, b = solution.split(" = ")[0].split()
    return int(a), op, int(b)


if __name__ == "__main__":
    main()
