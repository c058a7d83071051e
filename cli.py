"""`python -m cli` from a checkout: the command line lives in `qdq.cli`; tests import it from here."""

from qdq.cli import entry_point, main

__all__ = ["entry_point", "main"]

if __name__ == "__main__":
    entry_point()
