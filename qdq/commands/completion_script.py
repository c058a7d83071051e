"""Shell completion scripts for bash, zsh and fish, written from the command line's own argparse parser.

Nothing is listed twice: commands, options, `--format` choices, target names and rule codes come
from the parser and the registry when the script is generated, so a new option completes as
soon as it exists. zsh runs the bash function through its bashcompinit layer.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from qdq.engine.registry import all_rules
from qdq.engine.ruleset import builtin_targets
from qdq.rewrite.rule import Severity

SHELLS = ("bash", "zsh", "fish")


@dataclass
class _Option:
    flags: list[str]
    help: str
    values: list[str] = field(default_factory=list)  # the words it takes, when known
    takes_value: bool = False
    path: bool = False  # its value is a file


@dataclass
class _Command:
    name: str
    help: str
    options: list[_Option]
    words: list[str]  # what its positional arguments can be, when known (rule codes for explain)


def script(shell: str, parser: argparse.ArgumentParser, commands: dict[str, argparse.ArgumentParser]) -> str:
    """The completion script for `shell`, for the parser of `qdq` and its commands."""
    helps = {action.dest: action.help or "" for group in parser._subparsers._group_actions  # type: ignore[union-attr]
             for action in getattr(group, "_choices_actions", [])}
    described = [_describe(name, sub, helps.get(name, "")) for name, sub in commands.items()]
    return {"bash": _bash, "zsh": _zsh, "fish": _fish}[shell](described)


def _describe(name: str, parser: argparse.ArgumentParser, help_text: str) -> _Command:
    options, words = [], []
    for action in parser._actions:
        if not action.option_strings:
            if name == "explain":
                words = sorted(all_rules()) + sorted(rule.name for rule in all_rules().values())
            continue
        values = [str(c) for c in action.choices] if action.choices else []
        if "--target" in action.option_strings:
            values = builtin_targets() + (["all"] if name == "lint" else [])
        elif "--fail-on" in action.option_strings:
            values = [str(severity) for severity in sorted(Severity, reverse=True)]
        options.append(_Option(list(action.option_strings), (action.help or "").replace("%%", "%"), values,
                               takes_value=action.nargs != 0, path=action.type is Path))
    return _Command(name, help_text, options, words)


def _words(items: list[str]) -> str:
    return " ".join(items)


def _bash(commands: list[_Command]) -> str:
    cases_value, cases_options = [], []
    for command in commands:
        for option in command.options:
            if not option.takes_value:
                continue
            pattern = "|".join(f'"{command.name} {flag}"' for flag in option.flags)
            reply = f'($(compgen -W "{_words(option.values)}" -- "$cur"))' if option.values else \
                '($(compgen -f -- "$cur"))' if option.path else "()"
            cases_value.append(f"    {pattern}) COMPREPLY={reply}; return ;;")
        flags = _words([flag for option in command.options for flag in option.flags])
        positional = f'compgen -W "{_words(command.words)}" -- "$cur"' if command.words else 'compgen -f -- "$cur"'
        cases_options.append(f'    {command.name}) opts="{flags}"; words_cmd=\'{positional}\' ;;')
    names = _words([command.name for command in commands])
    return f"""# qdq completion for bash (zsh: see `qdq completion zsh`). Load it with:
#   eval "$(qdq completion bash)"     (e.g. in ~/.bashrc)
_qdq() {{
  local cur prev cmd opts words_cmd i
  cur="${{COMP_WORDS[COMP_CWORD]}}"
  prev="${{COMP_WORDS[COMP_CWORD-1]}}"
  cmd=""
  for ((i = 1; i < COMP_CWORD; i++)); do
    case "${{COMP_WORDS[i]}}" in -*) ;; *) cmd="${{COMP_WORDS[i]}}"; break ;; esac
  done
  if [[ -z "$cmd" ]]; then
    COMPREPLY=($(compgen -W "{names} -h --help -V --version" -- "$cur"))
    return
  fi
  case "$cmd $prev" in
{chr(10).join(cases_value)}
  esac
  case "$cmd" in
{chr(10).join(cases_options)}
    *) return ;;
  esac
  if [[ "$cur" == -* ]]; then
    COMPREPLY=($(compgen -W "$opts" -- "$cur"))
  else
    COMPREPLY=($(eval "$words_cmd"))
  fi
}}
complete -o filenames -F _qdq qdq
"""


def _zsh(commands: list[_Command]) -> str:
    return ("# qdq completion for zsh, through zsh's bash-completion layer. Load it with:\n"
            '#   eval "$(qdq completion zsh)"     (e.g. in ~/.zshrc)\n'
            "(( $+functions[compdef] )) || { autoload -U +X compinit && compinit }\n"
            "autoload -U +X bashcompinit && bashcompinit\n"
            + _bash(commands).split("\n", 2)[2])


def _fish(commands: list[_Command]) -> str:
    lines = ["# qdq completion for fish. Load it with:",
             "#   qdq completion fish > ~/.config/fish/completions/qdq.fish",
             "complete -c qdq -f"]
    names = _words([command.name for command in commands])
    for command in commands:
        lines.append(f"complete -c qdq -n 'not __fish_seen_subcommand_from {names}' -a {command.name} "
                     f"-d {shlex.quote(command.help)}")
    for command in commands:
        seen = f"-n '__fish_seen_subcommand_from {command.name}'"
        if command.words:
            lines.append(f"complete -c qdq {seen} -x -a {shlex.quote(_words(command.words))}")
        else:
            lines.append(f"complete -c qdq {seen} -F")
        for option in command.options:
            flags = " ".join(f"-l {flag[2:]}" if flag.startswith("--") else f"-s {flag[1:]}" for flag in option.flags)
            value = (f" -x -a {shlex.quote(_words(option.values))}" if option.values else
                     " -r -F" if option.path else " -x" if option.takes_value else "")
            lines.append(f"complete -c qdq {seen} {flags}{value} -d {shlex.quote(_first_sentence(option.help))}")
    return "\n".join(lines) + "\n"


def _first_sentence(text: str) -> str:
    """A short description for fish: the help up to its first clause, without a parenthesis left open."""
    first = text.split("; ")[0].split(". ")[0]
    if first.count("(") > first.count(")"):
        first = first[: first.rindex("(")].rstrip()
    return first
