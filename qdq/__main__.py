"""`python -m qdq` runs the command line."""

from cli import entry_point

entry_point()
