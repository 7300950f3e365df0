"""README.md and docs/ hold what they show: their examples run, their other
code parses, and their relative links point at files that exist.

The convention (docs/contributing.md, "Code blocks in the docs"):

  ```python          runs, on CPU, in seconds: every such block of one file
                     runs in order in one namespace, so a later block reuses
                     the models and names of earlier ones
  ```python full     runs too, but only in the full tier (`-m "not slow"`):
                     a block that compiles or times more than a few seconds
  ```python norun    is compiled (it must parse), never run: it trains,
                     downloads, needs a pod, or edits the library
  ```bash            is parsed with `bash -n`, never run
  ```text (or none)  is left alone: output, layouts, formulas

Every dotted `specjax.` / `sj.` name in inline code must exist, and the
notebooks' markdown cells (colab/) have their links checked too.
"""

import dataclasses
import importlib
import json
import pathlib
import re
import shutil
import subprocess

import pytest

from conftest import REPO

from specjax.decode import verifiers as verifiers_lib
from specjax.harness import autotune

README = REPO / "README.md"
PAGES = sorted((REPO / "docs").glob("*.md"))
FILES = [README] + PAGES
NOTEBOOKS = sorted((REPO / "colab").glob("*.ipynb"))
# A newcomer reads the README in five minutes; the rest lives in docs/.
README_MAX_LINES = 250

_FENCE = re.compile(r"^(\s*)```(.*)$")
_INLINE_CODE = re.compile(r"`[^`\n]*`")


@dataclasses.dataclass(frozen=True)
class Block:
  path: pathlib.Path
  line: int        # 1-based line of the opening fence
  lang: str        # "python", "bash", "text", "" ...
  tags: tuple      # the words after the language: ("norun",), ("full",)
  code: str

  @property
  def where(self) -> str:
    return f"{self.path.relative_to(REPO)}:{self.line}"


def _blocks(path: pathlib.Path) -> list[Block]:
  """Every fenced block of a markdown file, in order."""
  blocks, lines = [], path.read_text().splitlines()
  i = 0
  while i < len(lines):
    opening = _FENCE.match(lines[i])
    if not opening:
      i += 1
      continue
    indent, info = opening.group(1), opening.group(2).split()
    body, j = [], i + 1
    while j < len(lines) and lines[j].strip() != "```":
      body.append(lines[j][len(indent):] if lines[j].startswith(indent)
                  else lines[j])
      j += 1
    assert j < len(lines), f"{path.name}:{i + 1}: a code block is not closed"
    blocks.append(Block(path, i + 1, info[0] if info else "",
                        tuple(info[1:]), "\n".join(body) + "\n"))
    i = j + 1
  return blocks


def _runnable(path, tier):
  """The python blocks of `path` that run in `tier` ("fast": untagged;
  "full": untagged and `full`)."""
  allowed = {(), ("full",)} if tier == "full" else {()}
  return [b for b in _blocks(path) if b.lang == "python" and b.tags in allowed]


def _run(blocks, monkeypatch):
  """Runs `blocks` in order in one namespace, from the repository root, with
  the verifier registry restored afterwards (a page registers its own)."""
  monkeypatch.chdir(REPO)  # pages show paths from the repository root
  monkeypatch.setattr(verifiers_lib, "_REGISTRY",
                      dict(verifiers_lib._REGISTRY))  # pylint: disable=protected-access
  namespace = {"__name__": "__docs__"}
  for block in blocks:
    exec(compile(block.code, block.where, "exec"), namespace)  # pylint: disable=exec-used
  return namespace


def _ids(paths):
  return [str(p.relative_to(REPO)) for p in paths]


_FAST = [p for p in FILES if _runnable(p, "fast")]
_FULL = [p for p in FILES if len(_runnable(p, "full")) > len(_runnable(p, "fast"))]


@pytest.mark.parametrize("path", _FAST, ids=_ids(_FAST))
def test_runnable_blocks_run(path, monkeypatch):
  _run(_runnable(path, "fast"), monkeypatch)


@pytest.mark.full
@pytest.mark.parametrize("path", _FULL, ids=_ids(_FULL))
def test_full_tier_blocks_run(path, monkeypatch):
  # gamma="auto" prices every width it plans with timers and compiles: the
  # blocks run as written, with two widths and brief timings (their
  # outputs, not this machine's costs, are what is checked).
  monkeypatch.setattr(autotune, "AUTO_GAMMA_MAX", 2)
  monkeypatch.setattr(autotune.measure_goodput, "__kwdefaults__", {
      **autotune.measure_goodput.__kwdefaults__, "seconds": 0.002,
      "repeats": 1})
  _run(_runnable(path, "full"), monkeypatch)


def test_the_readme_has_a_runnable_example_of_at_most_20_lines():
  examples = _runnable(README, "fast")
  assert len(examples) == 1, [b.where for b in examples]
  assert len(examples[0].code.splitlines()) <= 20, examples[0].where
  assert "speculative_generate" in examples[0].code


def test_the_readme_is_short():
  lines = len(README.read_text().splitlines())
  assert lines <= README_MAX_LINES, f"README.md has {lines} lines"


@pytest.mark.parametrize("path", FILES, ids=_ids(FILES))
def test_code_blocks_parse_and_say_what_they_are(path):
  for block in _blocks(path):
    assert block.lang in ("python", "bash", "text", ""), (
        f"{block.where}: fence language {block.lang!r}; use python, bash or "
        "text (docs/contributing.md)")
    if block.lang == "python":
      assert block.tags in ((), ("norun",), ("full",)), (
          f"{block.where}: unknown tags {block.tags}; python, python norun "
          "or python full")
      compile(block.code, block.where, "exec")
    elif block.lang == "bash":
      assert not block.tags, f"{block.where}: bash blocks take no tags"
      done = subprocess.run([shutil.which("bash") or "bash", "-n"],
                            input=block.code, text=True, capture_output=True,
                            check=False)
      assert done.returncode == 0, f"{block.where}: {done.stderr}"


# ------------------------------------------------------------------ names --

_QUALIFIED = re.compile(r"\b((?:specjax|sj)(?:\.[A-Za-z_]\w*)+)")


def _resolve(name: str):
  """The module or attribute a dotted name (`specjax.harness.zoo.load`,
  `sj.Goodput.warm_start`) names; raises where there is none."""
  parts = name.split(".")
  parts[0] = "specjax"
  for i in range(len(parts), 0, -1):
    try:
      found = importlib.import_module(".".join(parts[:i]))
    except ImportError:
      continue
    for attribute in parts[i:]:
      found = getattr(found, attribute)
    return found
  raise ImportError(name)


@pytest.mark.parametrize("path", FILES, ids=_ids(FILES))
def test_qualified_names_in_inline_code_exist(path):
  """A renamed module or function shows up here, not in a reader's
  traceback."""
  missing = []
  for code in _INLINE_CODE.findall(_prose(path.read_text(), inline_code=True)):
    for name in _QUALIFIED.findall(code):
      try:
        _resolve(name)
      except (ImportError, AttributeError):
        missing.append(name)
  assert not missing


def test_the_name_check_finds_a_missing_name():
  assert _resolve("sj.harness.zoo.load") is not None
  for name in ("specjax.no_such_module", "specjax.harness.zoo.no_such_name"):
    with pytest.raises((ImportError, AttributeError)):
      _resolve(name)


# ------------------------------------------------------------------ links --

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose(text: str, inline_code: bool = False) -> str:
  """Markdown without its fenced blocks (and its inline code, unless
  `inline_code`)."""
  kept, fenced = [], False
  for line in text.splitlines():
    if fenced:
      fenced = line.strip() != "```"
    elif _FENCE.match(line):
      fenced = True
    else:
      kept.append(line if inline_code else _INLINE_CODE.sub("", line))
  return "\n".join(kept)


def _slug(heading: str) -> str:
  """GitHub's anchor for a heading."""
  text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
  return text.replace(" ", "-")


def _anchors(path: pathlib.Path) -> set:
  return {_slug(line.lstrip("#")) for line in _prose(
      path.read_text(), inline_code=True).splitlines() if line.startswith("#")}


def _check_links(source: pathlib.Path, text: str) -> list[str]:
  broken = []
  for target in _LINK.findall(_prose(text)):
    if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
      continue
    file_part, _, anchor = target.partition("#")
    resolved = (source.parent / file_part).resolve() if file_part else source
    if not resolved.exists():
      broken.append(f"{target}: no such file")
    elif (anchor and resolved.suffix == ".md"
          and anchor not in _anchors(resolved)):
      broken.append(f"{target}: no heading #{anchor} in {resolved.name}")
  return broken


@pytest.mark.parametrize("path", FILES, ids=_ids(FILES))
def test_relative_links_point_at_files_that_exist(path):
  assert not _check_links(path, path.read_text())


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_links_point_at_files_that_exist(path):
  cells = json.loads(path.read_text())["cells"]
  text = "\n\n".join("".join(c["source"]) for c in cells
                     if c["cell_type"] == "markdown")
  assert "../docs/" in text, f"{path.name} links to no docs page"
  assert not _check_links(path, text)


def test_every_docs_page_is_reachable_from_the_readme():
  linked = {(README.parent / t.partition("#")[0]).resolve()
            for t in _LINK.findall(_prose(README.read_text()))}
  assert not [p.name for p in PAGES if p.resolve() not in linked]


def test_the_link_check_finds_a_broken_link(tmp_path):
  """The control: a missing file, and a heading that is not there."""
  page = tmp_path / "page.md"
  page.write_text("# Title\n\n[ok](#title) [gone](missing.md) [bad](#nope)\n"
                  "`[code](not-a-link.md)`\n")
  assert _check_links(page, page.read_text()) == [
      "missing.md: no such file", "#nope: no heading #nope in page.md"]
