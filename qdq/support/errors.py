"""Errors that end a command with exit code 2 and a one-line message.

Anything the user can fix (a bad path, a malformed model, a broken rules file) is raised as
one of these, so the command line prints one line instead of a traceback.
"""


class QdqError(Exception):
    """A problem with the user's input or options; the message is one line for the terminal."""


class ModelLoadError(QdqError):
    """The model file cannot be read as a usable ONNX QDQ model."""


class RuleSetError(QdqError):
    """A rules file or `[tool.qdq]` section is malformed or names something unknown."""


class OutputError(QdqError):
    """An output path cannot be written."""


class InvalidOutputError(QdqError):
    """qdq made a model the ONNX checker or onnxruntime refuses: a bug in qdq, and nothing is written."""
