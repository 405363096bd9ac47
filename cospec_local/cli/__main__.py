"""`python -m cospec_local.cli`: the `cospec-local` command, run as its console entry point runs it."""
from . import run

run()
