"""Shell completion of `kubectl aw`, in the protocol kubectl (1.26+) speaks to plugins: for
`kubectl aw ARGS... WORD<TAB>` kubectl runs `kubectl_complete-aw ARGS... WORD` (found on
PATH; the package installs it, `make plugin` writes it beside the zipapp) and reads Cobra's
answer: one candidate a line (`value<TAB>description`), then `:DIRECTIVE` (4: no file names;
0: the shell may offer files). `kubectl-aw __complete ...` answers the same, and `kubectl aw
completion bash|zsh` prints a script that completes the `kubectl-aw` command with it.

Offered: commands, each command's flags, `-o` formats, `--context` (the kubeconfig's
contexts), `-n` (namespaces), `why NAME` (AppWrappers of the namespace), `stop` / `resume`
QUEUE (ClusterAppQueues), `completion` shells. Names are read from the API server with a
5-second timeout; a failure offers nothing (completion never prints an error).

Side effects: for names, reads the kubeconfig and lists from the API server; prints to `out`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TextIO

from dispatcher.api.constants import GROUP
from dispatcher.plugin.errors import PluginError
from dispatcher.plugin.kubeconfig import Connection

NO_FILES = 4
"""Cobra's ShellCompDirectiveNoFileComp."""
DEFAULT = 0
"""Cobra's ShellCompDirectiveDefault: the shell may complete file names."""
APPWRAPPERS = f"/apis/{GROUP}/v1beta1"

Connect = Callable[..., Connection]


def complete(
    args: Sequence[str],
    *,
    commands: dict[str, argparse.ArgumentParser],
    connect: Connect,
    out: TextIO,
) -> int:
    """Print the candidates for the last of `args` (the word being completed, maybe empty)
    after the words before it; exit code 0."""
    *words, word = args or [""]
    candidates, directive = _candidates(words, word, commands=commands, connect=connect)
    lines = [c for c in candidates if c.split("\t", 1)[0].startswith(word)]
    out.write("".join(f"{line}\n" for line in lines) + f":{directive}\n")
    return 0


def _candidates(
    words: list[str], word: str, *, commands: dict[str, argparse.ArgumentParser], connect: Connect
) -> tuple[list[str], int]:
    command = next((w for w in words if w in commands), None)
    if command is None:
        if word.startswith("-"):
            return ["--help"], NO_FILES
        return [f"{name}\t{_help(parser)}" for name, parser in commands.items()], NO_FILES
    parser = commands[command]
    flags = {o: a for a in parser._actions for o in a.option_strings}
    if "=" in word and word.startswith("--"):  # --output=ya
        flag, _, value = word.partition("=")
        found, directive = _values(flag, words, flags, connect)
        return [f"{flag}={v}" for v in found if v.startswith(value)], directive
    if word.startswith("-"):
        return [f"{o}\t{a.help}" if a.help else o for o, a in flags.items()], NO_FILES
    previous = words[-1] if words else ""
    if previous in flags and flags[previous].nargs != 0:
        return _values(previous, words, flags, connect)
    positionals = [a for a in parser._actions if not a.option_strings]
    given = _positionals_given(words[words.index(command) + 1 :], flags)
    if given >= len(positionals):
        return [], NO_FILES
    name = positionals[given].dest
    if name == "shell":
        return ["bash", "zsh"], NO_FILES
    if name == "name":
        return _names(words, flags, connect, "appwrappers", namespaced=True), NO_FILES
    if name == "queue":
        return _names(words, flags, connect, "clusterappqueues", namespaced=False), NO_FILES
    return [], NO_FILES


def _help(parser: argparse.ArgumentParser) -> str:
    return (parser.description or "").split("\n")[0]


def _positionals_given(words: list[str], flags: dict[str, argparse.Action]) -> int:
    given, skip = 0, False
    for w in words:
        if skip:
            skip = False
        elif w.startswith("-"):
            skip = w in flags and flags[w].nargs != 0
        else:
            given += 1
    return given


def _values(
    flag: str, words: list[str], flags: dict[str, argparse.Action], connect: Connect
) -> tuple[list[str], int]:
    action = flags.get(flag)
    if action is None:
        return [], NO_FILES
    if action.choices:
        return [str(c) for c in action.choices], NO_FILES
    if action.dest == "kubeconfig":
        return [], DEFAULT
    if action.dest == "context":
        return _contexts(words, flags), NO_FILES
    if action.dest == "namespace":
        return _listed(words, flags, connect, "/api/v1/namespaces"), NO_FILES
    return [], NO_FILES


def _given(words: list[str], flags: dict[str, argparse.Action], dest: str) -> str | None:
    """The value of the flag with `dest` among `words` (`-n NS` or `--namespace=NS`)."""
    for at, w in enumerate(words):
        flag, equals, value = w.partition("=")
        action = flags.get(flag)
        if action is None or action.dest != dest:
            continue
        if equals:
            return value
        if at + 1 < len(words):
            return words[at + 1]
    return None


def _contexts(words: list[str], flags: dict[str, argparse.Action]) -> list[str]:
    from dispatcher.plugin.kubeconfig import kubeconfig_contexts

    try:
        return kubeconfig_contexts(_given(words, flags, "kubeconfig"))
    except PluginError:
        return []


def _names(
    words: list[str],
    flags: dict[str, argparse.Action],
    connect: Connect,
    plural: str,
    *,
    namespaced: bool,
) -> list[str]:
    path = f"{APPWRAPPERS}/{plural}"
    if namespaced:
        path = f"{APPWRAPPERS}/namespaces/{{namespace}}/{plural}"
    return _listed(words, flags, connect, path)


def _listed(
    words: list[str], flags: dict[str, argparse.Action], connect: Connect, path: str
) -> list[str]:
    try:
        api = connect(
            kubeconfig=_given(words, flags, "kubeconfig"),
            context=_given(words, flags, "context"),
            namespace=_given(words, flags, "namespace"),
            timeout=5.0,
        )
        listed = api.get(path.format(namespace=api.namespace))
    except PluginError:
        return []
    return sorted(str((i.get("metadata") or {}).get("name")) for i in listed.get("items") or [])


BASH = r"""# bash completion for kubectl-aw: source <(kubectl-aw completion bash)
# (`kubectl aw <TAB>` completes through kubectl's own completion and kubectl_complete-aw.)
_kubectl_aw() {
    local cur=${COMP_WORDS[COMP_CWORD]} out directive line
    local -a found=()
    out=$(kubectl-aw __complete "${COMP_WORDS[@]:1:COMP_CWORD-1}" "$cur" 2>/dev/null) || return
    directive=${out##*:}
    out=${out%:*}
    while IFS= read -r line; do
        [[ -n $line ]] && found+=("${line%%$'\t'*}")
    done <<< "$out"
    COMPREPLY=("${found[@]}")
    if (( ${#found[@]} == 0 && (directive & 4) == 0 )); then
        mapfile -t COMPREPLY < <(compgen -f -- "$cur")
    fi
}
complete -F _kubectl_aw kubectl-aw
"""

ZSH = r"""#compdef kubectl-aw
# zsh completion for kubectl-aw: source <(kubectl-aw completion zsh)
# (`kubectl aw <TAB>` completes through kubectl's own completion and kubectl_complete-aw.)
_kubectl_aw() {
    local out directive line
    local -a lines found
    out=$(kubectl-aw __complete "${(@)words[2,CURRENT-1]}" "${words[CURRENT]}" \
        2>/dev/null) || return 1
    lines=("${(@f)out}")
    directive=${lines[-1]#:}
    for line in "${(@)lines[1,-2]}"; do
        [[ -n $line ]] || continue
        if [[ $line == *$'\t'* ]]; then
            found+=("${${line%%$'\t'*}//:/\\:}:${line#*$'\t'}")
        else
            found+=("${line//:/\\:}")
        fi
    done
    if (( ${#found} )); then
        _describe 'kubectl-aw' found
    elif (( (directive & 4) == 0 )); then
        _files
    fi
}
if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
    _kubectl_aw "$@"
else
    compdef _kubectl_aw kubectl-aw
fi
"""


def script(shell: str) -> str:
    """The completion script for `shell` (bash or zsh)."""
    return {"bash": BASH, "zsh": ZSH}[shell]
