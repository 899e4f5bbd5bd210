"""The Markdown shell-block extractor the docs test runs on (testenv/docblocks.py)."""

from __future__ import annotations

import pytest

from testenv.docblocks import blocks, commands, without_comment

DOC = """\
# Title

```sh
make demo    # the demo
```

## Using it

Text.

```yaml
kind: Pod
```

<!-- not run: needs a registry -->
```sh
docker build -t x .
```

### Deeper

- a list item:

  ```sh
  kubectl apply -f crds/       # both files
  appwrapper-dispatcher run \\
    --kubeconfig ~/.kube/config
  ```

## Other

```
plain, no language
```

~~~bash
echo tilde
~~~
"""


def test_blocks_of_a_language_with_their_sections_lines_and_notes() -> None:
    found = blocks(DOC, path="doc.md")
    assert [(b.where(), b.sections, b.note) for b in found] == [
        ("doc.md:3", ("Title",), ""),
        ("doc.md:16", ("Title", "Using it"), "not run: needs a registry"),
        ("doc.md:24", ("Title", "Using it", "Deeper"), ""),
        ("doc.md:36", ("Title", "Other"), ""),
    ]
    assert found[2].text.splitlines()[0] == "kubectl apply -f crds/       # both files"
    assert found[3].language == "bash"


def test_every_block_when_no_language_is_asked() -> None:
    found = blocks(DOC, languages=())
    assert [b.language for b in found] == ["sh", "yaml", "sh", "sh", "", "bash"]
    assert found[4].text == "plain, no language"


def test_a_note_counts_only_right_before_its_block() -> None:
    doc = "<!-- not run: x -->\n\nSome text.\n\n```sh\nls\n```\n"
    assert blocks(doc)[0].note == ""
    assert blocks("<!-- not run: x -->\n\n```sh\nls\n```\n")[0].note == "not run: x"


def test_a_longer_fence_holds_a_shorter_one() -> None:
    doc = "````sh\necho start\n```\n````\n"
    (block,) = blocks(doc)
    assert block.text == "echo start\n```"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param("a\nb\n", ["a", "b"], id="one-per-line"),
        pytest.param("# only a comment\n\na # kept\n", ["a # kept"], id="comment-lines-dropped"),
        pytest.param(
            "kubectl get x \\\n  -o json\n", ["kubectl get x -o json"], id="continuation-joined"
        ),
        pytest.param("echo a\\\\\nb\n", ["echo a\\\\", "b"], id="escaped-backslash-ends-line"),
        pytest.param("tail \\\n", ["tail"], id="dangling-continuation"),
    ],
)
def test_commands(text: str, want: list[str]) -> None:
    assert commands(text) == want


@pytest.mark.parametrize(
    ("command", "want"),
    [
        pytest.param(
            "kubectl apply -f crds/   # the CRDs", "kubectl apply -f crds/", id="trailing"
        ),
        pytest.param("echo 'a # b'", "echo 'a # b'", id="single-quoted"),
        pytest.param('echo "a # b" # c', 'echo "a # b"', id="double-quoted"),
        pytest.param("echo a#b", "echo a#b", id="inside-a-word"),
        pytest.param("echo \\# x", "echo \\# x", id="escaped"),
        pytest.param(
            "kubectl get x -o jsonpath='{.a}{\"\\n\"}'  # the leader",
            "kubectl get x -o jsonpath='{.a}{\"\\n\"}'",
            id="jsonpath",
        ),
    ],
)
def test_without_comment(command: str, want: str) -> None:
    assert without_comment(command) == want
