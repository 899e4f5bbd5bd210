"""The docs as a tested reference: the settings and flags tables are what the code generates
(dispatcher/docgen.py), and every claim in README.md, docs/*.md and manifests/README.md that
can be checked mechanically is: settings named, flags, files and links, make targets, the
defaults of the settings table, the columns `kubectl get aw` prints.

tests/e2e/test_docs_paths.py runs the commands the same docs give; this reads the rest.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher import chartschema, cli, docgen
from dispatcher.core.crdcheck import CrdVersions, crd_problem
from testenv.docblocks import FENCE, HEADING, blocks

REPO = Path(__file__).resolve().parents[2]
DOC_FILES = ["README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))]
DOC_FILES += ["manifests/README.md", "charts/appwrapper-dispatcher/README.md"]
SETTINGS = {s.path: s for s in docgen.settings()}
SECTIONS = {path.split(".")[0].split("[")[0] for path in SETTINGS if "." in path}
"""Top-level settings with settings below them: `webhook`, `members`, `provisioning`..."""
REGENERATE = f"run {docgen.COMMAND} (or .venv/bin/python -m dispatcher.docgen)"


def read(path: str) -> str:
    return (REPO / path).read_text()


def prose(markdown: str) -> str:
    """`markdown` without its fenced blocks."""
    kept, fence = [], ""
    for line in markdown.splitlines():
        opening = FENCE.match(line)
        if fence:
            if opening and opening["fence"].startswith(fence) and not opening["info"]:
                fence = ""
        elif opening:
            fence = opening["fence"]
        else:
            kept.append(line)
    return "\n".join(kept)


def code(markdown: str) -> Iterator[str]:
    """What a doc writes as code: inline spans, and the lines of fenced blocks."""
    for block in blocks(markdown, languages=()):
        yield from block.text.splitlines()
    yield from re.findall(r"`([^`\n]+)`", prose(markdown))


def every_doc() -> Iterator[tuple[str, str]]:
    for path in DOC_FILES:
        yield path, read(path)


# -- the generated tables --------------------------------------------------------------


@pytest.mark.parametrize("doc", docgen.DOCS)
def test_generated_tables_are_what_the_code_says(doc: str) -> None:
    current = read(doc)
    for name in docgen.TABLES:
        assert f"<!-- {name}:begin -->" in current, f"{doc}: no {name} table"
    assert current == docgen.rewritten(current), f"{doc} drifted from the code: {REGENERATE}"


def test_check_mode_finds_a_stale_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = tmp_path / "docs" / "x.md"
    doc.parent.mkdir()
    doc.write_text("a\n<!-- flags:begin -->\nold\n<!-- flags:end -->\nb\n")
    monkeypatch.setattr(docgen, "REPO", tmp_path)
    monkeypatch.setattr(docgen, "DOCS", ("docs/x.md",))
    assert docgen.main(["--check"]) == 1
    assert docgen.main([]) == 0
    assert docgen.main(["--check"]) == 0
    assert "| `--dev` |" in doc.read_text()
    assert doc.read_text().startswith("a\n<!-- flags:begin -->\n")


def test_every_setting_is_documented_in_the_code() -> None:
    """A field without a docstring (dispatcher/config.py) would be a row without meaning."""
    assert [p for p, s in SETTINGS.items() if not s.meaning] == []


def test_the_settings_table_holds_nested_settings() -> None:
    for path in (
        "fault_tolerance.retry_limit_maximum",
        "provisioning.checks.*.retry_limit",
        "node_health.resource_taints.*[].effect",
        "kueue_quotas",
        "visibility.enabled",
        "members[].name",
    ):
        assert f"| `{path}` |" in read("docs/operations.md")


def test_every_run_option_sets_a_setting_or_says_it_does_not() -> None:
    for action in docgen.run_options():
        setting = docgen.flag_setting(action)
        assert setting is None or setting in SETTINGS, action.option_strings


# -- settings, flags, files, links and make targets named in the docs ------------------

SETTING_PATH = re.compile(r"^(?:config\.)?([a-z_]+(?:(?:\.|\[\]\.)[a-z_]+|\.\*)+)(?:: .*)?$")


def named_setting(span: str) -> str | None:
    """The setting path a code span names (`webhook.cert_dir`, `members[].kubeconfig`,
    `provisioning.enabled: false`, the chart's `config.visibility.enabled`), if it is one:
    a dotted name under a top-level setting that has settings below it."""
    match = SETTING_PATH.match(span.strip())
    if match is None or match[1].rsplit(".", 1)[-1] in FILE_SUFFIXES:
        return None
    path = match[1]
    return path if path.split(".")[0].split("[")[0] in SECTIONS else None


FILE_SUFFIXES = {"py", "yaml", "json", "md", "txt", "tpl"}


def chart_values(properties: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """The Helm chart's own values (`visibility.readers`), which share some names."""
    for name, schema in properties.items():
        yield f"{prefix}{name}"
        yield from chart_values(schema.get("properties", {}), f"{prefix}{name}.")


def known_path(path: str) -> bool:
    """A setting, or a key under a map of settings (`provisioning.checks.autoscale`)."""
    if path in SETTINGS or path in set(chart_values(chartschema.CHART_VALUES)):
        return True
    if path.endswith(".*") and path[:-2] in SETTINGS:
        return True  # `webhook.*`: every setting under it
    generic = re.sub(
        r"^(priority_policy\.namespaces|provisioning\.checks)\.[a-z_-]+", r"\1.*", path
    )
    return generic in SETTINGS or re.sub(r"\.[^.]+$", "", path) in {
        p for p, s in SETTINGS.items() if s.kind.startswith("map of")
    }


def test_every_setting_the_docs_name_exists() -> None:
    wrong = [
        f"{doc}: {span}"
        for doc, markdown in every_doc()
        for span in re.findall(r"`([^`\n]+)`", prose(markdown))
        if (path := named_setting(span)) is not None and not known_path(path)
    ]
    assert wrong == [], "settings named in the docs that dispatcher/config.py does not have"


def dispatcher_options() -> dict[str, set[str]]:
    """Subcommand -> its options, and "" -> the root's."""
    root = cli.parser()
    found = {"": {o for a in root._actions for o in a.option_strings}}
    for action in root._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[name] = {o for a in sub._actions for o in a.option_strings}
    return found


DISPATCHER = re.compile(
    r"(?:^|[\s/$])(?:appwrapper-dispatcher|python -m dispatcher)\s+"
    r"((?:run|check-config|--version|--help)\b.*)"
)


def test_every_flag_given_to_the_dispatcher_exists() -> None:
    options = dispatcher_options()
    wrong = []
    for doc, markdown in every_doc():
        for line in code(markdown):
            match = DISPATCHER.search(line)
            if match is None:
                continue
            words = match[1].split("#")[0].split()
            command = words[0] if words and words[0] in options else ""
            for word in words:
                flag = word.strip("[]").split("=")[0].rstrip(".,;)")
                if flag.startswith("--") and flag not in options[command]:
                    wrong.append(f"{doc}: {line.strip()}")
    assert wrong == [], "appwrapper-dispatcher flags the parser (dispatcher/cli.py) lacks"


OTHER_TOOLS = {
    # kubectl
    "--as", "--dry-run", "--for", "--timeout", "--validate", "--type", "--raw",
    "--server-side", "--force-conflicts", "--clusterrole", "--user", "--group",
    "--kubeconfig", "--context", "--namespace", "--patch-file", "--api-group",
    # helm
    "--create-namespace", "--set", "--strict", "--take-ownership",
    # buildah and debootstrap (the image, manifests/README.md)
    "--isolation", "--name", "--network", "--storage-driver", "--variant",
    # kube-apiserver, the cluster autoscaler, MCAD
    "--requestheader-client-ca-file", "--requestheader-allowed-names",
    "--requestheader-", "--proxy-client-", "--admission-control-config-file",
    "--enable-provisioning-requests", "--preemption", "--backofftime",
}  # fmt: skip
"""Flags of other programs the docs mention (kubectl, kube-apiserver, helm, MCAD, buildah)."""


def flags_defined_in_this_repository() -> set[str]:
    found = {o for opts in dispatcher_options().values() for o in opts}
    sources = ("dispatcher/**/*.py", "testenv/*.py", "benchmarks/*.py")
    for source in (path for pattern in sources for path in REPO.glob(pattern)):
        found.update(re.findall(r"""["'](--[a-z0-9-]+)["']""", source.read_text()))
    return found


def test_every_flag_the_docs_mention_is_defined_somewhere() -> None:
    """A `--flag` in the docs is one of this repository's programs (the dispatcher, kubectl
    aw, the demo, the benchmarks) or of a program listed in OTHER_TOOLS."""
    known = flags_defined_in_this_repository() | OTHER_TOOLS
    wrong = sorted(
        {
            f"{doc}: {flag}"
            for doc, markdown in every_doc()
            for line in code(markdown)
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", line)
            if flag not in known
        }
    )
    assert wrong == [], "flags no program here defines (or add the tool's to OTHER_TOOLS)"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    plain = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", plain).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for line in prose(path.read_text()).splitlines():
        heading = HEADING.match(line)
        if heading:
            name, n = slug(heading["title"]), 1
            while name in found:
                name, n = f"{slug(heading['title'])}-{n}", n + 1
            found.add(name)
    return found


def test_every_relative_link_and_anchor_exists() -> None:
    wrong = []
    for doc, markdown in every_doc():
        here = (REPO / doc).parent
        text = re.sub(r"`[^`\n]*`", "", prose(markdown))
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (here / file).resolve() if file else REPO / doc
            if not path.exists():
                wrong.append(f"{doc}: {target}: no such file")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                wrong.append(f"{doc}: {target}: no such heading")
    assert wrong == []


TOP_DIRS = ("dispatcher/", "docs/", "manifests/", "crds/", "samples/", "charts/", "tests/")
TOP_DIRS += ("benchmarks/", "testenv/", "requirements/")


def test_every_repository_path_the_docs_name_exists() -> None:
    """`dispatcher/...`, `manifests/...` and the like in code spans (not placeholders)."""
    wrong = []
    for doc, markdown in every_doc():
        for span in re.findall(r"`([^`\n]+)`", prose(markdown)):
            for word in span.split():
                word = word.rstrip(".,;:)").split("#")[0].split("::")[0]
                if not word.startswith(TOP_DIRS) or re.search(r"[<>*{}$A-Z]|\.\.\.", word):
                    continue
                if not (REPO / word).exists():
                    wrong.append(f"{doc}: {word}")
    assert wrong == []


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z0-9-]*):", read("Makefile"), flags=re.M))


def test_every_make_target_the_docs_name_exists() -> None:
    """`make X` as a command: a code span or a line of a block that starts with it."""
    targets = make_targets()
    wrong = [
        f"{doc}: {line}"
        for doc, markdown in every_doc()
        for line in code(markdown)
        if (match := re.match(r"\s*(?:\$ )?make ([a-z][a-z0-9-]*)", line))
        and match[1] not in targets
    ]
    assert wrong == []


# -- the detailed settings table: names and defaults -----------------------------------


def detail_rows() -> list[tuple[list[str], str]]:
    """(settings named, default cell) of each row of "What the settings do"."""
    markdown = read("docs/operations.md")
    section = markdown.split("### What the settings do", 1)[1].split("\n#", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows.append((re.findall(r"`([^`]+)`", cells[0]), cells[1]))
    return rows


def test_the_detail_table_names_only_settings() -> None:
    rows = detail_rows()
    assert len(rows) > 80
    assert [n for names, _ in rows for n in names if n not in SETTINGS] == []


def _normal(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    if isinstance(value, str) and re.fullmatch(r"[0-9]+/[0-9]+", value):
        return Fraction(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return Fraction(value).limit_denominator(1000)
    return value


def documented_default(cell: str) -> Iterator[Any]:
    """The defaults a cell states, one per setting of the row (`50`, `100`); a cell in
    words (`the 17 kinds below`) states none that can be read."""
    cell = re.sub(r"\s*\([^)]*\)$", "", cell)
    for part in cell.split(", "):
        if part in ("unset", "required"):
            yield None if part == "unset" else ...
        elif re.fullmatch(r"`[^`]*`", part):
            yield yaml.safe_load(part.strip("`"))
        else:
            return


def test_the_detail_table_states_the_defaults_of_the_code() -> None:
    wrong, checked = [], 0
    for names, cell in detail_rows():
        stated = list(documented_default(cell))
        if len(stated) != len(names):
            continue
        for name, value in zip(names, stated, strict=True):
            checked += 1
            if cell == SETTINGS[name].default:
                continue
            if _normal(value) != _normal(SETTINGS[name].value):
                wrong.append(f"{name}: docs {cell}, code {SETTINGS[name].default}")
    assert wrong == []
    assert checked > 80


# -- `kubectl get aw` as the demo prints it --------------------------------------------


def printer_columns(version: str | None, *, wide: bool, converting: bool) -> list[str]:
    """The headings `kubectl get aw` prints for crds/appwrapper.yaml: as shipped (the
    versions it serves; what `kubectl apply -f crds/` and the demo give) or, `converting`,
    as an install that converts applies it (every version served); of `version`, else of
    the preferred one (Kubernetes ranks v1beta2 above v1beta1)."""
    crd = yaml.safe_load(read("crds/appwrapper.yaml"))
    versions = {
        v["name"]: v for v in crd["spec"]["versions"] if converting or v.get("served", True)
    }
    chosen = versions[version or max(versions, key=_version_rank)]
    columns = [
        c["name"].upper()
        for c in chosen.get("additionalPrinterColumns", [])
        if wide or not c.get("priority")
    ]
    return ["NAME", *columns]


def _version_rank(name: str) -> tuple[int, int, int]:
    match = re.fullmatch(r"v([0-9]+)(?:(alpha|beta)([0-9]+))?", name)
    assert match, name
    stage = {"alpha": 0, "beta": 1, None: 2}[match[2]]
    return (stage, int(match[1]), int(match[3] or 0))


GET_AW = re.compile(r"^\$ kubectl get (?:aw|appwrappers(?:\.(v[0-9a-z]+)\.[a-z.]+)?)\b(.*)$")


def get_aw_outputs() -> Iterator[tuple[str, str, list[str], list[list[str]]]]:
    """(where, the command, the headings it shows, the wanted headings: as shipped, then
    converting) for each `$ kubectl get aw ...` in the docs shown with its output."""
    for doc, markdown in every_doc():
        for block in blocks(markdown, path=doc, languages=()):
            lines = block.text.splitlines()
            for index, line in enumerate(lines[:-1]):
                match = GET_AW.match(line.split("#")[0].strip())
                if match is None or not re.match(r"(NAMESPACE|NAME)\s", lines[index + 1]):
                    continue
                args = match[2].split()
                wants = []
                for converting in (False, True):
                    want = printer_columns(match[1], wide="wide" in args, converting=converting)
                    all_namespaces = "-A" in args or "--all-namespaces" in args
                    wants.append(["NAMESPACE", *want] if all_namespaces else want)
                header = re.split(r"\s{2,}", lines[index + 1].strip())
                yield f"{block.where()}+{index + 1}", line, header, wants


def test_kubectl_get_aw_shows_the_crds_columns() -> None:
    """Each output shows the columns of the CRD as shipped or as an install that converts
    applies it: none missing, none made up."""
    found = list(get_aw_outputs())
    assert len(found) >= 4
    wrong = [
        f"{where}: {command}\n  shows {header}\n  CRD   {wants[0]}\n  or    {wants[1]}"
        for where, command, header, wants in found
        if header not in wants
    ]
    assert wrong == [], "\n".join(wrong)


def test_the_readme_shows_what_the_demo_prints() -> None:
    """The README's example is the demo's `kubectl get aw -n demo` (testenv/demo.py):
    the columns of v1beta2, which the demo serves from the start (the CRD in its converting
    form, before kubectl first reads discovery), and its samples."""
    readme = read("README.md")
    (where, command, header, wants), *_ = get_aw_outputs()
    assert where.startswith("README.md")
    assert command == "$ kubectl get aw -n demo"
    assert header == wants[1]
    block = next(b for b in blocks(readme, languages=()) if command in b.text)
    rows = block.text.split(command + "\n", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    names = {
        yaml.safe_load(p.read_text())["metadata"]["name"] for p in (REPO / "samples").glob("*.yaml")
    }
    assert rows
    assert {r.split()[0] for r in rows} <= names


# -- the dispatcher's rights: manifests/README.md's table against manifests/rbac.yaml ---

Right = tuple[str, str, str]
"""(resource, verb, resource name or "")."""


def granted() -> set[Right]:
    """Every right the Roles and ClusterRoles of manifests/rbac.yaml grant."""
    rights: set[Right] = set()
    for doc in yaml.safe_load_all(read("manifests/rbac.yaml")):
        for rule in (doc or {}).get("rules", []):
            for resource in rule.get("resources", []):
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames") or [""]:
                        rights.add((resource, verb, name))
    return rights


def documented_rights() -> tuple[set[Right], set[str]]:
    """The rights manifests/README.md's "Rule | Verbs | Why" table names, and the verbs of
    its "wrapped kinds" row (each kind of the default `allowed_kinds`)."""
    table = read("manifests/README.md").split("| Rule | Verbs | Why |", 1)[1].split("\n\n")[0]
    rights: set[Right] = set()
    wrapped: set[str] = set()
    for line in table.splitlines()[2:]:
        rule, verbs, _ = (c.strip() for c in re.split(r"(?<!\\)\|", line)[1:4])
        if rule == "wrapped kinds":
            wrapped = {v.strip() for v in verbs.split(",")}
            continue
        rule = re.sub(r"\([^)]*\)| in `[^`]+` only", "", rule)
        resources: list[tuple[str, str]] = []
        pending: list[str] = []
        for named, token in re.findall(r"(named\s+)?`([^`]+)`", rule):
            if named:
                resources += [(r, token) for r in pending]
                pending = []
            else:
                pending.append(token)
        resources += [(r, "") for r in pending]
        for part in verbs.split(";"):
            only = re.search(r" on `([^`]+)` only", part)
            words = re.sub(r" on `[^`]+` only", "", part)
            for verb in (v.strip() for v in words.split(",")):
                for resource, name in resources:
                    rights.add((resource, verb, only[1] if only else name))
    return rights, wrapped


def test_the_rbac_table_names_the_verbs_rbac_yaml_grants() -> None:
    rights, wrapped_verbs = documented_rights()
    given = granted()
    assert sorted(rights - given) == [], "the table names rights rbac.yaml does not grant"
    documented_resources = {r for r, _, _ in rights}
    rest = {right for right in given if right[0] not in documented_resources}
    wrapped = {r for r, _, _ in rest}
    want = {(r, v, "") for r in wrapped for v in wrapped_verbs}
    assert sorted(rest ^ want) == [], "rights not in the table (nor wrapped kinds' verbs)"
    assert {"pods", "configmaps", "rayclusters"} - documented_resources - wrapped <= {"pods"}


# -- the refusals docs/operations.md quotes ------------------------------------------


def test_the_crd_refusals_quoted_are_the_codes() -> None:
    """The section "Another AppWrapper controller's CRD" quotes what the dispatcher says when
    it refuses to start (core/crdcheck.py): each quoted piece (between elisions) is in one."""
    name = "appwrappers.workload.codeflare.dev"
    cases = [
        CrdVersions(served=("v1beta2",), not_served=(), stored=("v1beta2", "v1beta1"),
                    converts=False),
        CrdVersions(served=("v1beta1", "v1beta2"), not_served=(), stored=("v1beta1",),
                    converts=False),
        CrdVersions(served=(), not_served=("v1beta1",), stored=(), converts=False),
        None,
    ]  # fmt: skip
    said = [f"appwrapper-dispatcher: refusing to start: {crd_problem(name, c)}" for c in cases]
    # A CRD it may not read: the message kube/preflight.py raises, its literals joined.
    said.append("".join(re.findall(r'"([^"]*)"', read("dispatcher/kube/preflight.py"))))
    section = read("docs/operations.md").split("## Another AppWrapper controller's CRD")[1]
    section = section.split("\n## ")[0]
    quotes = [
        " ".join(q.split())
        for q in re.findall(r"`([^`]+)`", section)
        if q.startswith(("appwrapper-dispatcher: refusing", "... "))
    ]
    assert len(quotes) >= 3
    wrong = [
        piece
        for quote in quotes
        for piece in re.split(r"\s*\(?\.\.\.\)?\s*", quote)
        if len(piece) > 12 and not any(piece in " ".join(s.split()) for s in said)
    ]
    assert wrong == [], said
