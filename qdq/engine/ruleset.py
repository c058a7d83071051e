"""Declarative rule sets: TOML files in `rules/` (one per target) and the user's own.

A rule set says which rules are on, at what severity, with which parameters. `extends` builds one
set on another, so `npu` is `common` plus the NPU rules and bounds. Users narrow the set with
select/ignore (code prefixes, as in ruff) on the command line or in `[tool.qdq]` of pyproject.toml.
"""

from __future__ import annotations

import copy
import importlib.resources
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from qdq.engine.registry import all_rules
from qdq.rewrite.rule import Rule, Severity
from qdq.support.errors import RuleSetError

_RULE_KEYS = {"enabled", "severity", "effect", "reformats"}
_SET_KEYS = {"name", "description", "extends", "params", "rules", "select", "ignore", "fix-order", "search", "verdict"}


@dataclass
class RuleConfig:
    """One rule as a rule set configures it."""

    code: str
    enabled: bool
    severity: Severity
    params: dict[str, Any]
    # What the target builds where this rule fires (a template over the finding's values), and
    # how many Q/DQ-caused conversion layers that costs: a number, or the name of a finding value.
    effect: str | None = None
    reformats: int | str = 0


@dataclass
class RuleSet:
    """A resolved rule set: every configured rule, after `extends` and select/ignore."""

    name: str
    description: str
    rules: dict[str, RuleConfig]
    sources: list[str] = field(default_factory=list)
    # The [params] of this set and the sets it extends: rules that later sets turn on get them too.
    params: dict[str, Any] = field(default_factory=dict)
    # Code prefixes in the order `qdq fix` applies them (a target's pass order); the rest follow by code.
    fix_order: list[str] = field(default_factory=list)
    # [search]: how `qdq fix --calibrate` refines power-of-two positions on data (`qdq.engine.exponent_search`).
    search: dict[str, Any] = field(default_factory=dict)
    # [verdict]: how a changed model is judged against the input's float twin (`qdq.verification.verdict`).
    verdict: dict[str, Any] = field(default_factory=dict)

    def enabled(self) -> list[tuple[Rule, RuleConfig]]:
        """Instances of the enabled rules, in code order."""
        registry = all_rules()
        return [(registry[code](), cfg) for code, cfg in sorted(self.rules.items()) if cfg.enabled]

    def enabled_codes(self) -> frozenset[str]:
        """The codes of the enabled rules: what a check asks when it judges a value after another rule's fix."""
        return frozenset(code for code, cfg in self.rules.items() if cfg.enabled)

    def params_of(self, code: str) -> dict[str, Any]:
        """A rule's parameters as this set configures it, enabled or not; from the shipped `common` set
        when this set does not extend it (QDQ006's lists of ops qdq does not read hold whatever the set)."""
        cfg = self.rules.get(code) or load_target("common").rules[code]
        return cfg.params

    def fix_sequence(self) -> list[tuple[Rule, RuleConfig]]:
        """The enabled rules that have a fix, in the set's `fix-order`, then by code."""
        order = [p.upper() for p in self.fix_order]

        def rank(code: str) -> tuple[int, str]:
            matches = [i for i, prefix in enumerate(order) if code.startswith(prefix)]
            return (matches[0] if matches else len(order), code)

        fixable = [(rule, cfg) for rule, cfg in self.enabled() if rule.fix_safety is not None]
        return sorted(fixable, key=lambda pair: rank(pair[0].code))

    def narrowed(self, select: Iterable[str] = (), ignore: Iterable[str] = ()) -> RuleSet:
        """The same set with only the selected codes on and the ignored ones off (prefix match)."""
        select, ignore = [s.upper() for s in select], [s.upper() for s in ignore]
        known = set(self.rules)
        for code in select + ignore:
            if code != "ALL" and not any(k.startswith(code) for k in known):
                raise RuleSetError(f"no rule in set {self.name!r} matches {code!r} (see `qdq rules`)")
        rules = {}
        for code, cfg in self.rules.items():
            on = cfg.enabled
            if select:
                on = "ALL" in select or any(code.startswith(s) for s in select)
            if any(code.startswith(s) for s in ignore) or "ALL" in ignore:
                on = False
            rules[code] = RuleConfig(code, on, cfg.severity, cfg.params, cfg.effect, cfg.reformats)
        return RuleSet(self.name, self.description, rules, self.sources, self.params, self.fix_order, self.search,
                       self.verdict)


def builtin_rules_dir() -> Path:
    """The folder of the shipped rule sets (inside the wheel, or `rules/` in a source checkout)."""
    shipped = importlib.resources.files("qdq") / "rules"
    if shipped.is_dir():
        return Path(str(shipped))
    return Path(__file__).resolve().parents[2] / "rules"


def builtin_targets() -> list[str]:
    return sorted(p.stem for p in builtin_rules_dir().glob("*.toml"))


def load_target(name: str) -> RuleSet:
    """Load a shipped rule set by target name (`common`, `npu`, `trt`, `ort`, ...)."""
    path = builtin_rules_dir() / f"{name}.toml"
    if not path.is_file():
        raise RuleSetError(f"unknown target {name!r} (known: {', '.join(builtin_targets())})")
    return load_rules_file(path)


def load_rules_file(path: str | Path) -> RuleSet:
    """Load a rules file, resolving `extends` against the shipped sets or relative paths."""
    return _resolve(Path(path), chain=())


def _resolve(path: Path, chain: tuple[Path, ...]) -> RuleSet:
    data = _read_toml(path)
    if path.resolve() in chain:
        raise RuleSetError(f"{path}: `extends` forms a cycle")
    unknown = set(data) - _SET_KEYS
    if unknown:
        raise RuleSetError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    base_name = data.get("extends")
    if base_name is None:
        base = RuleSet(name="", description="", rules={}, sources=[])
    elif isinstance(base_name, str):
        base = _resolve(_extends_path(path, base_name), chain + (path.resolve(),))
    else:
        raise RuleSetError(f"{path}: `extends` must be a target name or a path")
    merged = _merge(base, data, path)
    select, ignore = _str_list(data, "select", path), _str_list(data, "ignore", path)
    try:
        narrowed = merged.narrowed(select, ignore)
    except RuleSetError as exc:
        raise RuleSetError(f"{path}: {exc}") from None
    # An exact `enabled` in this file is more specific than its own select/ignore prefixes.
    for code, table in data.get("rules", {}).items():
        if "enabled" in table:
            narrowed.rules[code].enabled = table["enabled"]
    return narrowed


def _extends_path(path: Path, name: str) -> Path:
    builtin = builtin_rules_dir() / f"{name}.toml"
    if "/" not in name and not name.endswith(".toml") and builtin.is_file():
        return builtin
    candidate = (path.parent / name).resolve()
    if candidate.is_file():
        return candidate
    raise RuleSetError(f"{path}: extends {name!r}, which is neither a shipped target nor a file")


def _merge(base: RuleSet, data: dict, path: Path) -> RuleSet:
    registry = all_rules()
    shared = data.get("params", {})
    if not isinstance(shared, dict):
        raise RuleSetError(f"{path}: [params] must be a table")
    declared = {name for rule in registry.values() for name in rule.parameters}
    for key in shared:
        if key not in declared:
            raise RuleSetError(f"{path}: [params] {key!r} is not a parameter of any rule")
    inherited = {**base.params, **shared}
    rules = {
        code: RuleConfig(code, c.enabled, c.severity, dict(c.params), c.effect, c.reformats)
        for code, c in base.rules.items()
    }
    # Shared params apply to every rule (inherited or new) that declares them.
    for code, cfg in rules.items():
        cfg.params.update(_typed_params(registry[code], shared, path, strict=False))
    tables = data.get("rules", {})
    if not isinstance(tables, dict):
        raise RuleSetError(f"{path}: [rules] must be a table of rule codes")
    for code, table in tables.items():
        if code not in registry:
            raise RuleSetError(f"{path}: unknown rule code {code!r}")
        if not isinstance(table, dict):
            raise RuleSetError(f"{path}: [rules.{code}] must be a table")
        rule = registry[code]
        cfg = rules.get(code) or RuleConfig(
            code,
            True,
            rule.severity,
            {**copy.deepcopy(rule.parameters), **_typed_params(rule, inherited, path, strict=False)},
        )
        if "enabled" in table:
            if not isinstance(table["enabled"], bool):
                raise RuleSetError(f"{path}: [rules.{code}] enabled must be true or false")
            cfg.enabled = table["enabled"]
        if "severity" in table:
            try:
                cfg.severity = Severity.parse(str(table["severity"]))
            except ValueError as exc:
                raise RuleSetError(f"{path}: [rules.{code}] {exc}") from None
        if "effect" in table:
            if not isinstance(table["effect"], str):
                raise RuleSetError(f"{path}: [rules.{code}] effect must be a string")
            cfg.effect = table["effect"]
        if "reformats" in table:
            if not isinstance(table["reformats"], (int, str)) or isinstance(table["reformats"], bool):
                raise RuleSetError(f"{path}: [rules.{code}] reformats must be a number or a finding value's name")
            cfg.reformats = table["reformats"]
        own = {k: v for k, v in table.items() if k not in _RULE_KEYS}
        cfg.params.update(_typed_params(rule, own, path, strict=True))
        rules[code] = cfg
    name = data.get("name") or path.stem
    description = data.get("description", base.description)
    fix_order = _str_list(data, "fix-order", path) if "fix-order" in data else base.fix_order
    tables = {}
    for key in ("search", "verdict"):
        tables[key] = data.get(key, {})
        if not isinstance(tables[key], dict):
            raise RuleSetError(f"{path}: [{key}] must be a table")
    return RuleSet(str(name), str(description), rules, base.sources + [str(path)], inherited, fix_order,
                   {**base.search, **tables["search"]}, {**base.verdict, **tables["verdict"]})


def _typed_params(rule: type[Rule], values: dict, path: Path, strict: bool) -> dict[str, Any]:
    """The values that are parameters of this rule, checked against the defaults' types."""
    out = {}
    for key, value in values.items():
        if key not in rule.parameters:
            if strict:
                raise RuleSetError(f"{path}: {rule.code} has no parameter {key!r}")
            continue
        default = rule.parameters[key]
        if not _same_kind(default, value):
            raise RuleSetError(f"{path}: {rule.code}.{key} must be {_kind(default)}, got {_kind(value)}")
        out[key] = float(value) if isinstance(default, float) else value
    return out


def _same_kind(default: Any, value: Any) -> bool:
    """Whether a TOML value fits a parameter's default: an int is a float, a float is no int."""
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, list):
        return isinstance(value, list) and (not default or all(_same_kind(default[0], v) for v in value))
    return isinstance(value, type(default))


def _kind(value: Any) -> str:
    if isinstance(value, list):
        kinds = sorted({_kind(v) for v in value})
        return f"list of {' and '.join(kinds)}" if kinds else "list"
    return type(value).__name__


def _str_list(data: dict, key: str, path: Path) -> list[str]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RuleSetError(f"{path}: `{key}` must be a list of rule codes")
    return value


def _read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise RuleSetError(f"{path}: rules file not found") from None
    except IsADirectoryError:
        raise RuleSetError(f"{path}: rules file is a directory") from None
    except tomllib.TOMLDecodeError as exc:
        raise RuleSetError(f"{path}: invalid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RuleSetError(f"{path}: cannot read rules file: {exc}") from None


@dataclass
class ProjectConfig:
    """The `[tool.qdq]` table of the nearest pyproject.toml, if any."""

    path: Path | None = None
    target: str | None = None
    rules: Path | None = None
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    fail_on: str | None = None
    # Node-name glob -> upper-case codes or prefixes not reported on matching nodes (`qdq.engine.suppression`).
    per_node_ignores: dict[str, list[str]] = field(default_factory=dict)


_PROJECT_KEYS = {"target", "rules", "select", "ignore", "fail-on", "per-node-ignores"}


def find_project_config(start: Path) -> ProjectConfig:
    """Read `[tool.qdq]` from the nearest pyproject.toml that has one, walking up from `start`.

    As in ruff and pytest, a pyproject.toml without `[tool.qdq]` (a nested package's) is skipped.
    """
    start = Path(start).resolve()  # a relative path has no parents to walk up
    for folder in [start, *start.parents]:
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            tool = _read_toml(candidate).get("tool", {})
            data = tool.get("qdq") if isinstance(tool, dict) else None
            if data is not None:
                return _project_config(candidate, data)
    return ProjectConfig()


def _project_config(path: Path, data: Any) -> ProjectConfig:
    if not isinstance(data, dict):
        raise RuleSetError(f"{path}: [tool.qdq] must be a table")
    unknown = set(data) - _PROJECT_KEYS
    if unknown:
        raise RuleSetError(f"{path}: [tool.qdq] has unknown key(s) {', '.join(sorted(unknown))}")
    for key in ("target", "rules", "fail-on"):
        if key in data and not isinstance(data[key], str):
            raise RuleSetError(f"{path}: [tool.qdq] {key} must be a string")
    if "fail-on" in data:
        try:
            Severity.parse(data["fail-on"])
        except ValueError as exc:
            raise RuleSetError(f"{path}: [tool.qdq] fail-on: {exc}") from None
    rules = (path.parent / data["rules"]) if "rules" in data else None
    return ProjectConfig(
        path=path,
        target=data.get("target"),
        rules=rules,
        select=_str_list(data, "select", path),
        ignore=_str_list(data, "ignore", path),
        fail_on=data.get("fail-on"),
        per_node_ignores=_per_node_ignores(data.get("per-node-ignores", {}), path),
    )


def _per_node_ignores(table: Any, path: Path) -> dict[str, list[str]]:
    """Validated `[tool.qdq.per-node-ignores]`: every code must name at least one known rule, as
    with --ignore, so a typo cannot silently suppress nothing."""
    where = f"{path}: [tool.qdq.per-node-ignores]"
    if not isinstance(table, dict):
        raise RuleSetError(f"{where} must be a table of node-name patterns")
    known = all_rules()
    ignores = {}
    for pattern, codes in table.items():
        if not isinstance(codes, list) or not all(isinstance(code, str) for code in codes):
            raise RuleSetError(f"{where} {pattern!r} must be a list of rule codes")
        codes = [code.upper() for code in codes]
        for code in codes:
            if code != "ALL" and not (code and any(k.startswith(code) for k in known)):
                raise RuleSetError(f"{where} {pattern!r}: no rule matches {code!r} (see `qdq rules`)")
        ignores[pattern] = codes
    return ignores
