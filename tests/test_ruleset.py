"""Rule sets: the shipped `common`, user files that extend it, select/ignore, parameters, [tool.qdq]."""

from __future__ import annotations

from pathlib import Path

import pytest

from qdq.engine.registry import all_rules
from qdq.engine.ruleset import (
    ProjectConfig,
    RuleSet,
    builtin_rules_dir,
    builtin_targets,
    find_project_config,
    load_rules_file,
    load_target,
)
from qdq.rewrite.rule import RULES, Rule, Severity
from qdq.support.errors import RuleSetError

COMMON_CODES = [
    "QDQ001", "QDQ002", "QDQ003", "QDQ004", "QDQ005", "QDQ006",
    "QDQ101", "QDQ102", "QDQ103", "QDQ104",
    "QDQ201", "QDQ202", "QDQ203", "QDQ204",
    "QDQ301",
]
COMMON_PATH = str(builtin_rules_dir() / "common.toml")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def enabled_codes(ruleset: RuleSet) -> list[str]:
    return [code for code, cfg in sorted(ruleset.rules.items()) if cfg.enabled]


def load_error(path: Path) -> str:
    with pytest.raises(RuleSetError) as info:
        load_rules_file(path)
    return str(info.value)


# --- shipped sets -------------------------------------------------------------------------------------


def test_builtin_targets_include_common():
    assert "common" in builtin_targets()
    assert Path(COMMON_PATH).is_file()


def test_load_common():
    common = load_target("common")
    registry = all_rules()
    assert common.name == "common"
    assert common.description == "Q/DQ validity, pairing, redundant nodes and exporter artefacts"
    assert sorted(common.rules) == COMMON_CODES
    assert enabled_codes(common) == COMMON_CODES
    for code, cfg in common.rules.items():
        assert cfg.code == code
        assert cfg.severity == registry[code].severity
        if code != "QDQ006":  # its op lists exist only in common.toml
            assert cfg.params == registry[code].parameters  # common keeps every default
    assert common.rules["QDQ101"].severity == Severity.ERROR
    assert common.rules["QDQ103"].severity == Severity.INFO
    assert common.sources == [COMMON_PATH]
    assert [type(rule).code for rule, _ in common.enabled()] == COMMON_CODES
    assert common.params == {}


def test_unknown_target():
    with pytest.raises(RuleSetError, match=r"unknown target 'nope' \(known: .*common"):
        load_target("nope")


# --- user files -------------------------------------------------------------------------------------------


def test_user_file_extends_common(tmp_path):
    path = write(tmp_path / "mine.toml", """
extends = "common"
description = "my deployment"
select = ["QDQ0", "qdq1"]
ignore = ["QDQ104"]

[rules.QDQ103]
severity = "Error"

[rules.QDQ005]
enabled = false
""")
    ruleset = load_rules_file(path)
    assert ruleset.name == "mine" and ruleset.description == "my deployment"
    assert ruleset.sources == [COMMON_PATH, str(path)]
    assert sorted(ruleset.rules) == COMMON_CODES  # every rule stays configured, some off
    # QDQ005 is disabled by name, which is more specific than the `QDQ0` prefix.
    assert enabled_codes(ruleset) == ["QDQ001", "QDQ002", "QDQ003", "QDQ004", "QDQ006", "QDQ101", "QDQ102", "QDQ103"]
    assert ruleset.rules["QDQ103"].severity == Severity.ERROR
    assert ruleset.rules["QDQ102"].severity == Severity.WARNING
    assert load_target("common").rules["QDQ103"].severity == Severity.INFO  # the shipped set is untouched


def test_enabled_by_name_beats_ignore_prefix(tmp_path):
    path = write(tmp_path / "r.toml", 'extends = "common"\nignore = ["QDQ2"]\n[rules.QDQ202]\nenabled = true\n')
    assert [c for c in enabled_codes(load_rules_file(path)) if c.startswith("QDQ2")] == ["QDQ202"]


def test_file_without_extends_lists_only_its_rules(tmp_path):
    path = write(tmp_path / "tiny.toml", 'name = "tiny"\n[rules.QDQ301]\nseverity = "info"\n')
    ruleset = load_rules_file(path)
    assert ruleset.name == "tiny" and ruleset.description == ""
    assert list(ruleset.rules) == ["QDQ301"]
    assert ruleset.rules["QDQ301"].enabled and ruleset.rules["QDQ301"].severity == Severity.INFO


def test_chain_of_extends(tmp_path):
    base = write(tmp_path / "base" / "team.toml", """
extends = "common"
name = "team"
description = "team defaults"
[rules.QDQ101]
severity = "warning"
[rules.QDQ201]
enabled = false
[rules.QDQ202]
severity = "error"
""")
    top = write(tmp_path / "project.toml", """
extends = "base/team.toml"
[rules.QDQ201]
enabled = true
[rules.QDQ202]
severity = "warning"
""")
    ruleset = load_rules_file(top)
    assert ruleset.sources == [COMMON_PATH, str(base.resolve()), str(top)]
    assert ruleset.name == "project" and ruleset.description == "team defaults"
    assert ruleset.rules["QDQ101"].severity == Severity.WARNING  # from team.toml
    assert ruleset.rules["QDQ201"].enabled  # team.toml turned it off, project.toml on again
    assert ruleset.rules["QDQ202"].severity == Severity.WARNING
    assert enabled_codes(ruleset) == COMMON_CODES
    team = load_rules_file(base)
    assert team.name == "team" and not team.rules["QDQ201"].enabled


def test_extends_cycle(tmp_path):
    a = write(tmp_path / "a.toml", 'extends = "b.toml"\n')
    write(tmp_path / "b.toml", 'extends = "a.toml"\n')
    message = load_error(a)
    assert "a.toml" in message and "cycle" in message
    itself = write(tmp_path / "self.toml", 'extends = "self.toml"\n')
    assert load_error(itself) == f"{itself.resolve()}: `extends` forms a cycle"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('extends = "common"\n[rules.QDQ777]\n', "unknown rule code 'QDQ777'"),
        ('extends = "common"\ncolour = "red"\nsize = 1\n', "unknown key(s) colour, size"),
        ('extends = "common"\n[rules.QDQ001]\nthreshold = 1\n', "QDQ001 has no parameter 'threshold'"),
        ('extends = "common"\n[params]\nthreshold = 1\n', "[params] 'threshold' is not a parameter of any rule"),
        ('extends = "common"\nparams = 1\n', "[params] must be a table"),
        ('extends = "common"\nrules = 1\n', "[rules] must be a table of rule codes"),
        ('extends = "common"\n[rules]\nQDQ001 = 1\n', "[rules.QDQ001] must be a table"),
        ('[rules.QDQ001]\nseverity = "fatal"\n',
         "[rules.QDQ001] unknown severity 'fatal' (use error, warning or info)"),
        ('[rules.QDQ001]\nseverity = 2\n', "[rules.QDQ001] unknown severity '2'"),
        ('[rules.QDQ001]\nenabled = "no"\n', "[rules.QDQ001] enabled must be true or false"),
        ("extends = 3\n", "`extends` must be a target name or a path"),
        ('extends = "nowhere"\n', "extends 'nowhere', which is neither a shipped target nor a file"),
        ('extends = "common"\nselect = "QDQ1"\n', "`select` must be a list of rule codes"),
        ('extends = "common"\nignore = [1]\n', "`ignore` must be a list of rule codes"),
        ('extends = "common"\nselect = ["QDQ9"]\n', "no rule in set 'bad' matches 'QDQ9'"),
        ("extends = \n", "invalid TOML: "),
        ('[rules.QDQ001\nseverity = "info"\n', "invalid TOML: "),
    ],
)
def test_rules_file_errors_name_the_file(tmp_path, text, problem):
    path = write(tmp_path / "bad.toml", text)
    message = load_error(path)
    assert message.startswith(f"{path}: ")
    assert problem in message
    assert "\n" not in message


def test_error_in_an_extended_file_names_that_file(tmp_path):
    base = write(tmp_path / "base.toml", 'extends = "common"\n[rules.QDQ001]\nseverity = "loud"\n')
    top = write(tmp_path / "top.toml", 'extends = "base.toml"\n')
    assert load_error(top).startswith(f"{base.resolve()}: [rules.QDQ001] unknown severity 'loud'")


def test_missing_and_unreadable_files(tmp_path):
    missing = tmp_path / "missing.toml"
    assert load_error(missing) == f"{missing}: rules file not found"
    assert load_error(tmp_path) == f"{tmp_path}: rules file is a directory"
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00name")
    assert load_error(binary).startswith(f"{binary}: ")


# --- select / ignore ----------------------------------------------------------------------------------------


def test_narrowed_by_prefix():
    common = load_target("common")
    assert enabled_codes(common.narrowed(select=["QDQ1"])) == ["QDQ101", "QDQ102", "QDQ103", "QDQ104"]
    assert enabled_codes(common.narrowed(select=["qdq20", "QDQ301"])) == ["QDQ201", "QDQ202", "QDQ203", "QDQ204", "QDQ301"]
    assert enabled_codes(common.narrowed(ignore=["QDQ0", "QDQ2"])) == ["QDQ101", "QDQ102", "QDQ103", "QDQ104", "QDQ301"]
    assert enabled_codes(common.narrowed(select=["QDQ1"], ignore=["QDQ103"])) == ["QDQ101", "QDQ102", "QDQ104"]
    assert enabled_codes(common) == COMMON_CODES  # narrowing returns a new set


def test_narrowed_all():
    common = load_target("common")
    assert enabled_codes(common.narrowed(select=["ALL"])) == COMMON_CODES
    assert enabled_codes(common.narrowed(ignore=["all"])) == []
    assert enabled_codes(common.narrowed(select=["ALL"], ignore=["QDQ3"])) == COMMON_CODES[:-1]


def test_narrowed_keeps_severity_and_sources():
    common = load_target("common")
    narrow = common.narrowed(select=["QDQ103"])
    assert narrow.rules["QDQ103"].severity == Severity.INFO
    assert narrow.name == "common" and narrow.sources == common.sources
    assert sorted(narrow.rules) == COMMON_CODES


@pytest.mark.parametrize(
    ("select", "ignore", "code"),
    [(["QDQ9"], [], "QDQ9"), ([], ["QDQ1", "X"], "X"), (["QDQ0011"], [], "QDQ0011")],
)
def test_narrowed_with_a_code_matching_nothing(select, ignore, code):
    with pytest.raises(RuleSetError, match=f"no rule in set 'common' matches '{code}'"):
        load_target("common").narrowed(select=select, ignore=ignore)


# --- [tool.qdq] in pyproject.toml -------------------------------------------------------------------------


def test_project_config_from_a_parent_folder(tmp_path):
    pyproject = write(tmp_path / "pyproject.toml", """
[project]
name = "app"

[tool.qdq]
target = "common"
rules = "qdq/rules.toml"
select = ["QDQ1"]
ignore = ["QDQ103"]
fail-on = "error"
""")
    start = tmp_path / "models" / "v2"
    start.mkdir(parents=True)
    config = find_project_config(start)
    assert config == ProjectConfig(
        path=pyproject, target="common", rules=tmp_path / "qdq" / "rules.toml",
        select=["QDQ1"], ignore=["QDQ103"], fail_on="error",
    )


def test_project_config_skips_a_pyproject_without_tool_qdq(tmp_path):
    outer = write(tmp_path / "pyproject.toml", '[tool.qdq]\ntarget = "common"\n')
    write(tmp_path / "pkg" / "pyproject.toml", '[project]\nname = "pkg"\n[tool.other]\nx = 1\n')
    config = find_project_config(tmp_path / "pkg")
    assert config.path == outer and config.target == "common" and config.rules is None
    assert config.select == [] and config.ignore == [] and config.fail_on is None


def test_project_config_from_a_relative_start(tmp_path, monkeypatch):
    pyproject = write(tmp_path / "pyproject.toml", '[tool.qdq]\nselect = ["QDQ0"]\n')
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    assert find_project_config(Path(".")).path == pyproject
    assert find_project_config(Path(".")).select == ["QDQ0"]


def test_no_project_config(tmp_path):
    write(tmp_path / "pyproject.toml", '[project]\nname = "x"\n')
    assert find_project_config(tmp_path) == ProjectConfig()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('[tool.qdq]\ntarget = "common"\nlevel = 3\nmode = "x"\n', "[tool.qdq] has unknown key(s) level, mode"),
        ("[tool]\nqdq = 3\n", "[tool.qdq] must be a table"),
        ("[tool.qdq]\ntarget = 1\n", "[tool.qdq] target must be a string"),
        ('[tool.qdq]\nselect = "QDQ1"\n', "`select` must be a list of rule codes"),
        ('[tool.qdq]\nfail-on = "fatal"\n', "[tool.qdq] fail-on: unknown severity 'fatal'"),
        ("[tool.qdq\n", "invalid TOML"),
    ],
)
def test_project_config_errors(tmp_path, text, problem):
    pyproject = write(tmp_path / "pyproject.toml", text)
    with pytest.raises(RuleSetError) as info:
        find_project_config(tmp_path)
    assert str(info.value).startswith(f"{pyproject}: ")
    assert problem in str(info.value)


# --- rule parameters ------------------------------------------------------------------------------------------


@pytest.fixture
def param_rules():
    """Two temporary rules with parameters, registered for one test only."""
    all_rules()  # register the real rules first

    class GapRule(Rule):
        """A test rule with parameters."""

        code = "QDQ999"
        name = "test-gap"
        message = "{node}"
        severity = Severity.INFO
        parameters = {"max_gap": 7, "ops": ["Concat"]}

        def check(self, ctx):
            return []

    class ToleranceRule(Rule):
        code = "QDQ998"
        name = "test-tolerance"
        message = "{node}"
        parameters = {"tolerance": 0.5, "strict": False}

        def check(self, ctx):
            return []

    RULES[GapRule.code] = GapRule
    RULES[ToleranceRule.code] = ToleranceRule
    try:
        yield GapRule, ToleranceRule
    finally:
        RULES.pop(GapRule.code, None)
        RULES.pop(ToleranceRule.code, None)


def test_rule_defaults(tmp_path, param_rules):
    gap, _ = param_rules
    ruleset = load_rules_file(write(tmp_path / "r.toml", 'extends = "common"\n[rules.QDQ999]\n'))
    cfg = ruleset.rules["QDQ999"]
    assert cfg.enabled and cfg.severity == Severity.INFO
    assert cfg.params == {"max_gap": 7, "ops": ["Concat"]}
    cfg.params["ops"].append("Add")
    assert gap.parameters == {"max_gap": 7, "ops": ["Concat"]}  # the class default is not shared
    assert "QDQ998" not in ruleset.rules  # not listed, not on
    [(rule, rule_cfg)] = [(r, c) for r, c in ruleset.enabled() if c.code == "QDQ999"]
    assert isinstance(rule, gap) and rule_cfg is cfg


def test_params_shared_and_per_rule(tmp_path, param_rules):
    path = write(tmp_path / "r.toml", """
extends = "common"
[params]
max_gap = 3
tolerance = 1

[rules.QDQ999]
ops = ["Concat", "Add"]

[rules.QDQ998]
severity = "error"
strict = true
""")
    ruleset = load_rules_file(path)
    assert ruleset.rules["QDQ999"].params == {"max_gap": 3, "ops": ["Concat", "Add"]}
    tolerance = ruleset.rules["QDQ998"].params["tolerance"]
    assert tolerance == 1.0 and isinstance(tolerance, float)
    assert ruleset.rules["QDQ998"].params["strict"] is True
    assert ruleset.rules["QDQ998"].severity == Severity.ERROR
    assert ruleset.rules["QDQ001"].params == {}  # shared params go only to rules that declare them
    assert ruleset.params == {"max_gap": 3, "tolerance": 1}


def test_per_rule_value_beats_shared(tmp_path, param_rules):
    path = write(tmp_path / "r.toml", 'extends = "common"\n[params]\nmax_gap = 3\n[rules.QDQ999]\nmax_gap = 5\n')
    assert load_rules_file(path).rules["QDQ999"].params["max_gap"] == 5


def test_params_through_extends(tmp_path, param_rules):
    write(tmp_path / "base.toml", 'extends = "common"\n[params]\nmax_gap = 2\n[rules.QDQ998]\ntolerance = 0.25\n')
    # A rule the extending file turns on gets the base's shared params.
    later = load_rules_file(write(tmp_path / "later.toml", 'extends = "base.toml"\n[rules.QDQ999]\n'))
    assert later.rules["QDQ999"].params == {"max_gap": 2, "ops": ["Concat"]}
    assert later.rules["QDQ998"].params == {"tolerance": 0.25, "strict": False}
    # Shared params of the extending file override what the base configured.
    over_text = 'extends = "base.toml"\n[params]\ntolerance = 2.5\n[rules.QDQ999]\n'
    over = load_rules_file(write(tmp_path / "over.toml", over_text))
    assert over.rules["QDQ998"].params["tolerance"] == 2.5
    assert over.rules["QDQ999"].params["max_gap"] == 2


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ('[rules.QDQ999]\nmax_gap = "3"\n', "QDQ999.max_gap must be int, got str"),
        ("[rules.QDQ999]\nmax_gap = 2.5\n", "QDQ999.max_gap must be int, got float"),
        ("[rules.QDQ999]\nmax_gap = true\n", "QDQ999.max_gap must be int, got bool"),
        ('[rules.QDQ999]\nops = "Concat"\n', "QDQ999.ops must be list of str, got str"),
        ('[rules.QDQ999]\nops = ["Concat", 1]\n', "QDQ999.ops must be list of str, got list of int and str"),
        ('[params]\nmax_gap = "3"\n[rules.QDQ999]\n', "QDQ999.max_gap must be int, got str"),
        ('[rules.QDQ998]\ntolerance = "0.5"\n', "QDQ998.tolerance must be float, got str"),
        ("[rules.QDQ998]\nstrict = 1\n", "QDQ998.strict must be bool, got int"),
        ("[rules.QDQ999]\nmax_gaps = 1\n", "QDQ999 has no parameter 'max_gaps'"),
        ("[rules.QDQ999]\ntolerance = 1.0\n", "QDQ999 has no parameter 'tolerance'"),
    ],
)
def test_parameter_errors(tmp_path, param_rules, table, problem):
    path = write(tmp_path / "r.toml", 'extends = "common"\n' + table)
    message = load_error(path)
    assert message == f"{path}: {problem}"


def test_temporary_rules_are_gone_after_the_fixture():
    assert "QDQ999" not in all_rules() and "QDQ998" not in all_rules()
