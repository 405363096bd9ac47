"""Arbiters: who settles a mismatch between draft and target.

- catalog.py: what a name means (`target`, `fly`, the shipped learned arbiters, the user's own, a path);
- file_format.py: a learned arbiter's files, written by training and read by the engine;
- domain_gate.py: where a learned arbiter abstains (prompts unlike its training prompts);
- callbacks.py: arbiters that decide in Python (a function, a head under ONNX Runtime);
- evaluations.py: what an arbiter is measured to do, kept beside it, and `arbiter list/show`;
- engine_arbiters.py: an Engine's arbiters, the rules made from their settings and learned ones loaded once.
"""
