"""`python -m qdq` runs the command line."""

from qdq.cli import entry_point

entry_point()
