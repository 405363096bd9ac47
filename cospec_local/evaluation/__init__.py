"""Measuring runs on the same problems and prompts.

- task_eval.py: `cospec-local eval`, accuracy and speed of each run on verifiable tasks;
- bench.py: `cospec-local bench`, speed of each run on chat prompts;
- runs.py: the runs they compare (a decoding mode and, for speculation, an arbiter);
- machine.py: other load on the machine during a measurement, and the machine's identity.
"""
