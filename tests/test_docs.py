"""The documentation runs: every ```python block of README.md and docs/*.md, and the rules' doctests.

Blocks of one page run in order in one namespace (a fresh module), in a temporary working directory, so
files they write (checkpoints, plots) go away. Markers, an HTML comment on the line right before the
opening fence (GitHub and MkDocs render neither):

* ``<!-- fragment -->`` (or ``<!-- fragment: why -->``): not run, e.g. an excerpt that needs a model the
  page only describes;
* ``<!-- requires: torch, jax -->``: run only when every name is available (an importable module, or
  ``gpu``: a CUDA device, or the simulator under ``NUMBA_ENABLE_CUDASIM=1``), skipped otherwise.

docs/architecture.md documents the convention for authors.
"""
from __future__ import annotations

import doctest
import importlib
import importlib.util
import pathlib
import re
import sys
import types

import numpy as np
import pytest

import numbaopt
from numbaopt import rules

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*)$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>fragment|requires)\b\s*:?\s*(?P<arg>.*?)\s*-->\s*$")


class Block:
    """One ```python block: its source, the line of its first source line, and its markers."""

    def __init__(self, page, line, source, fragment, requires):
        self.page, self.line, self.source = page, line, source
        self.fragment, self.requires = fragment, requires

    def __repr__(self):
        return f"{self.page.name}:{self.line}"


def blocks(page: pathlib.Path) -> list[Block]:
    """The ```python (or ```py) blocks of a Markdown page, with the markers of the lines before each."""
    lines = page.read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent, info = m["fence"], len(m["indent"]), m["info"].split()
        end = i + 1
        while end < len(lines) and not (lines[end].strip().startswith(fence[0] * len(fence))
                                        and set(lines[end].strip()) == {fence[0]}):
            end += 1
        if info and info[0].lower() in ("python", "py"):
            fragment, requires = False, []
            j = i - 1
            while j >= 0 and (mk := _MARKER.match(lines[j])):
                if mk["kind"] == "fragment":
                    fragment = True
                else:
                    requires += [r.strip() for r in mk["arg"].split(",") if r.strip()]
                j -= 1
            if len(info) > 1:
                raise AssertionError(f"{page.name}:{i + 1}: info string {' '.join(info)!r}; mark fragments and "
                                     "requirements with an HTML comment on the line before the fence")
            source = "\n".join(ln[indent:] if ln[:indent].strip() == "" else ln for ln in lines[i + 1:end])
            out.append(Block(page, i + 2, source, fragment, requires))
        i = end + 1
    return out


def _available(name: str) -> bool:
    if name == "gpu":
        return numbaopt.cuda_available()
    return importlib.util.find_spec(name) is not None


def _run_page(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # a real module, so dataclasses, pickling and Numba find the names the blocks define
    mod = types.ModuleType(f"docs_{page.stem}")
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    ran, skipped = 0, []
    for b in blocks(page):
        if b.fragment:
            continue
        missing = [r for r in b.requires if not _available(r)]
        if missing:
            skipped.append(f"{b} needs {', '.join(missing)}")
            continue
        # leading newlines: a traceback's line numbers are the page's
        code = compile("\n" * (b.line - 1) + b.source, str(page), "exec")
        exec(code, mod.__dict__)
        ran += 1
    if skipped:
        pytest.skip(f"ran {ran} block(s); skipped {'; '.join(skipped)}")
    return ran


@pytest.mark.parametrize("page", [p for p in PAGES if any(not b.fragment for b in blocks(p))],
                         ids=lambda p: p.name)
def test_page_runs(page, tmp_path, monkeypatch):
    assert _run_page(page, tmp_path, monkeypatch) > 0


def test_block_parser(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("text\n\n<!-- fragment: needs a model -->\n```python\nundefined_name\n```\n\n"
                    "<!-- requires: torch, gpu -->\n```py\nx = 1\n```\n\n```sh\nls\n```\n\n"
                    "* a list item:\n\n  ```python\n  y = 2\n  ```\n")
    got = blocks(page)
    assert [(b.line, b.source, b.fragment, b.requires) for b in got] == [
        (5, "undefined_name", True, []), (10, "x = 1", False, ["torch", "gpu"]), (20, "y = 2", False, [])]
    page.write_text("```python fragment\nx\n```\n")
    with pytest.raises(AssertionError, match="info string"):
        blocks(page)


def test_failing_block_names_its_line(tmp_path, monkeypatch):
    page = tmp_path / "p.md"
    page.write_text("# t\n\n```python\nx = 1\n```\n\n```python\ny = x + 1\nraise RuntimeError(y)\n```\n")
    with pytest.raises(RuntimeError) as e:
        _run_page(page, tmp_path, monkeypatch)
    assert str(e.value) == "2"
    assert e.traceback[-1].lineno + 1 == 9


def test_api_reference_lists_every_public_name():
    """Each name of ``numbaopt.__all__`` has its entry in docs/api/ (a new public name needs one)."""
    text = "\n".join(p.read_text() for p in (ROOT / "docs" / "api").glob("*.md"))
    listed = set(re.findall(r"^::: numbaopt\.(\w+)", text, re.M))
    missing = [n for n in numbaopt.__all__ if n not in listed and n != "schedules"]
    assert not missing, f"add to docs/api/*.md: {missing}"


# --- the rules' docstrings: a reference and a runnable example each --------------------------------------

RULE_MODULES = ["basic", "adaptive", "recent", "sign_based", "clipping", "layerwise", "lookahead", "stages", "factored",
                "averaging", "matrix", "parameter_free"]
_FINDER = doctest.DocTestFinder()
DOCTESTS = [t for m in [numbaopt] + [importlib.import_module(f"numbaopt.rules.{n}") for n in RULE_MODULES]
            for t in _FINDER.find(m) if t.examples]


@pytest.mark.parametrize("test", DOCTESTS, ids=lambda t: t.name)
def test_doctest(test, tmp_path, monkeypatch):
    """The examples assume ``import numpy as np, numbaopt as no`` (as docs/api/rules.md says)."""
    monkeypatch.chdir(tmp_path)
    test.globs.update(np=np, no=numbaopt)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    result = runner.run(test, out=lambda s: sys.stdout.write(s))
    assert result.failed == 0, f"{test.name}: {result.failed} of {result.attempted} examples failed (see stdout)"


@pytest.mark.parametrize("name", rules.BUILTIN)
def test_rule_docstring_has_reference_and_example(name):
    prose = getattr(rules, name).__doc__.split("Examples\n")[0]
    assert re.search(r"\b(19|20)\d\d\b.*\n?.*https://\S+", prose), f"{name}: a reference (authors, year, link)"
    assert any(t.name.endswith(f".{name}") for t in DOCTESTS), f"{name}: an Examples section with doctests"
