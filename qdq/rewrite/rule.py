"""What a rule is: a stable code, a one-line message, a doc, a check, and optionally a fix.

Rules are small classes registered by code. They hold no target knowledge: bounds and op lists
come in as parameters from a rule set in `rules/`, so a new target is a rules-file edit.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any, ClassVar, Iterable

from qdq.graph import ir
from qdq.graph.model import Model
from qdq.graph.names import Names, stem
from qdq.quant.index import QTensor, QuantIndex
from qdq.rewrite.edits import EditLog


class Severity(IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2

    @classmethod
    def parse(cls, text: str) -> Severity:
        try:
            return cls[text.upper()]
        except KeyError:
            raise ValueError(f"unknown severity {text!r} (use error, warning or info)") from None

    def __str__(self) -> str:
        return self.name.lower()


class FixSafety(str, Enum):
    """Exact fixes keep outputs bit-identical; approximate ones change numerics and say so."""

    EXACT = "exact"
    APPROXIMATE = "approximate"

    def __str__(self) -> str:
        return self.value


@dataclass
class Finding:
    """One violation: which rule, where (node and tensors), and the values involved."""

    code: str
    message: str
    severity: Severity
    node: str | None
    tensors: tuple[str, ...] = ()
    values: dict[str, Any] = field(default_factory=dict)
    fix: FixSafety | None = None
    # The graph objects the check looked at, for the rule's own fix; never serialised.
    subject: Any = field(default=None, repr=False, compare=False)
    # What the target builds here and the conversion layers it costs, when the rule set says (`effect`);
    # `conversions` names those layers' Q/DQ nodes when known, so two findings never count one twice.
    effect: str | None = None
    reformats: int = 0
    conversions: tuple[str, ...] = ()
    # The part of the graph the HTML reports draw around it (qdq.reports.neighbourhood), taken while the graph is
    # loaded; never serialised.
    neighbourhood: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "code": self.code,
            "severity": str(self.severity),
            "message": self.message,
            "node": self.node,
            "tensors": list(self.tensors),
            "values": self.values,
            "fix": str(self.fix) if self.fix else None,
        }
        if self.effect is not None:
            out["effect"] = self.effect
            out["predicted_reformats"] = self.reformats
            if self.conversions:
                out["predicted_conversions"] = list(self.conversions)
        return out


@dataclass
class Change:
    """One edit a fix made, for the change report: rule, node, tensor, old → new."""

    code: str
    node: str | None
    tensor: str | None
    old: Any
    new: Any
    description: str
    # Measured side effects (saturated values, weights rounded to zero, bits lost), for the report.
    values: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code, "node": self.node, "tensor": self.tensor,
            "old": self.old, "new": self.new, "description": self.description, "values": self.values,
        }


@dataclass
class CheckContext:
    """What a check sees: the model, its quantization index, and this rule's parameters."""

    model: Model
    index: QuantIndex
    params: dict[str, Any]
    severity: Severity
    # Measured (min, max) of float tensors by name, from `qdq fix --calibrate`; None without data.
    ranges: dict[str, tuple[float, float]] | None = None
    # The codes of the rules in this run, for a check that judges a value after another rule's fix.
    enabled: frozenset[str] = frozenset()

    @property
    def graph(self) -> ir.Graph:
        return self.model.graph

    def value_name(self, qt: QTensor) -> str:
        """A quantized value's name: its float tensor, or its stored integers."""
        return qt.float_input.name if qt.float_input is not None else qt.integer.name


class ScaleCeilings:
    """The largest scale some values may take in one fix run, set by the fixes that made them that fine.

    Why: a fix can need a value finer than its group would have it (QDQ607 puts a HardSigmoid
    output at pos ≥ 7); a later alignment in the same run (a pool after the HardSigmoid) must
    not make it coarser again. A ceiling only ever comes down.
    """

    def __init__(self) -> None:
        self._by_value: dict[str, float] = {}

    def lower(self, value: str, scale: float) -> None:
        self._by_value[value] = min(scale, self._by_value.get(value, math.inf))

    def lowest(self, values: Iterable[str]) -> float | None:
        """The finest ceiling among `values`, None when none has one."""
        found = [self._by_value[v] for v in values if v in self._by_value]
        return min(found) if found else None


@dataclass(kw_only=True)
class FixContext(CheckContext):
    """What a fix sees: the check's view, and what all fixes of one run share.

    Fixes change the graph only through `edits`, name new constants through `names` (so names
    never collide across rules, and reports use the names of the input model), and leave
    `ceilings` for the fixes after them.
    """

    edits: EditLog
    names: Names
    ceilings: ScaleCeilings = field(default_factory=ScaleCeilings)

    def new_name(self, base: str, replacing: str | None = None) -> str:
        """A tensor name not yet used in the graph, for a constant a fix creates (to replace `replacing`)."""
        return self.names.new(base, replacing)

    def value_name(self, qt: QTensor) -> str:
        """The name the input model gave a quantized value."""
        return self.names.original(super().value_name(qt))


class Rule:
    """Base class of every rule. Subclasses set the class attributes and implement `check`.

    The class docstring is the rule's documentation shown by `qdq explain`: what it checks, why
    it matters, and an example.
    """

    code: ClassVar[str]
    name: ClassVar[str]
    message: ClassVar[str]  # a str.format template over the finding's values
    severity: ClassVar[Severity] = Severity.WARNING
    fix_safety: ClassVar[FixSafety | None] = None
    parameters: ClassVar[dict[str, Any]] = {}
    # Most rules read Q/DQ nodes and are skipped on a model without any; a rule about the rest of the graph is not.
    runs_without_qdq: ClassVar[bool] = False

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        raise NotImplementedError

    def fix(self, ctx: FixContext, finding: Finding) -> list[Change]:
        """Apply the fix for one finding to ctx.model.graph, through ctx.edits, and return what changed."""
        raise NotImplementedError(f"{self.code} has no fix")

    def assumption(self, ctx: CheckContext) -> str | None:
        """What the check assumed about this model's deployment that its findings depend on, for the
        report's notes (QDQ508: the CPU), or None. Lint asks every rule it runs."""
        return None

    @classmethod
    def doc(cls) -> str:
        return inspect.cleandoc(cls.__doc__ or "")

    def finding(
        self,
        ctx: CheckContext,
        node: ir.Node | None,
        tensors: Iterable[ir.Tensor | str | None] = (),
        subject: Any = None,
        fixable: bool = True,
        **values: Any,
    ) -> Finding:
        """Build a finding, formatting the rule's message from the values it reports.

        `fixable=False` marks a finding the rule's fix cannot handle (say, a graph output is involved).
        """
        names = tuple(t if isinstance(t, str) else t.name for t in tensors if t is not None)
        return Finding(
            code=self.code,
            message=self.message.format(node=mention(node), **values),
            severity=ctx.severity,
            node=mention(node) if node is not None else None,
            tensors=names,
            values=values,
            fix=self.fix_safety if fixable else None,
            subject=subject,
        )


def mention(node: ir.Node | None) -> str:
    """How findings, messages and changes name a node: by its name; the unnamed nodes some tools
    write (tract, a few of Quark's) by their first output, so that two of them never read alike."""
    if node is None:
        return ""
    shown = stem(node)
    return shown if node.name or not shown else f"(unnamed, writes {shown!r})"


RULES: dict[str, type[Rule]] = {}


def register(cls: type[Rule]) -> type[Rule]:
    """Class decorator: make a rule known by its code."""
    if cls.code in RULES:
        raise RuntimeError(f"rule code {cls.code} registered twice")
    RULES[cls.code] = cls
    return cls
