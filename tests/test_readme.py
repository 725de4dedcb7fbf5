"""README and docs/*.md: their examples are executed, so they cannot drift from the API; the README stays short;
CI's set-up commands stay greppable; every relative link points to a file (and heading) that exists."""

from __future__ import annotations

import glob
import os
import re
import urllib.parse

import torch
from IPython.core.interactiveshell import InteractiveShell

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
GUIDE = os.path.join(ROOT, "docs", "guide.md")
PROSE_LIMIT = 1500  # words of prose in README.md (code blocks and table rows not counted)


def read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def lines_outside_fences(text: str) -> list[str]:
    lines, fence = [], None
    for line in text.splitlines():
        marker = line.lstrip()[:3]
        if marker in ("```", "~~~"):
            fence = marker if fence is None else (None if fence == marker else fence)
            continue
        if fence is None:
            lines.append(line)
    return lines


def python_blocks(path: str = README) -> list[str]:
    return re.findall(r"```python\n(.*?)```", read(path), re.S)


def run_blocks(shell: InteractiveShell, path: str) -> None:
    for block in python_blocks(path):  # in order, in one shell, magics included
        result = shell.run_cell(block, store_history=False)
        assert result.success, f"{os.path.relpath(path, ROOT)} block failed:\n{block}\n{result.error_in_exec!r}"


def fresh_shell() -> InteractiveShell:
    import matplotlib

    matplotlib.use("Agg")
    shell = InteractiveShell.instance()
    for name in ("_lens", "lens", "w", "x"):  # nothing left over from another test can pass for a result
        shell.user_ns.pop(name, None)
    return shell


def assert_the_hook_example(ns: dict) -> None:
    (call,) = ns["_lens"].hook_calls  # exactly one hook call, wherever Python is installed (CI: a venv)
    assert (call.target, float(call.grad_in), float(call.grad_out)) == ("y", 5.0, 2.5)
    assert float(ns["_lens"].passes[0].grads_without_hooks["x"]) == 20.0
    assert float(ns["x"].grad) == 10.0


def test_readme_examples_run_in_ipython(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shell = fresh_shell()
    assert len(python_blocks(README)) >= 3
    try:
        run_blocks(shell, README)
        assert_the_hook_example(shell.user_ns)
    finally:
        shell.run_cell("%unload_ext autograd_lens", store_history=False)


def test_guide_examples_run_in_ipython(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # lens.to_html("trace.html") and recipe.save("hooks.json") write here
    shell = fresh_shell()
    assert len(python_blocks(GUIDE)) >= 6
    try:
        run_blocks(shell, GUIDE)
        ns = shell.user_ns
        assert_the_hook_example(ns)
        assert torch.equal(ns["w"].grad, torch.tensor([1.0, -1.0]))
        assert (tmp_path / "trace.html").exists()
        assert (tmp_path / "hooks.json").exists()
    finally:
        shell.run_cell("%unload_ext autograd_lens", store_history=False)


# --- the set-up commands, as .ci/run greps them -------------------------------------------------------------------


def test_setup_commands_are_where_ci_greps_them():
    text = read(README)
    lines = text.splitlines()
    # .ci/run: grep -m1 -E '^pip install torch==[^ ]+ -e "\.\[test\]" && python -m pytest' README.md
    tests = [line for line in lines if re.match(r'^pip install torch==[^ ]+ -e "\.\[test\]" && python -m pytest', line)]
    assert tests, "README lost its test command"
    pin = re.match(r"pip install (torch==[^ ]+)", tests[0]).group(1)
    # .ci/run: grep -m1 -oE 'torch==[^ ]+' README.md  (the torch the wheel demo installs)
    assert re.search(r"torch==[^ ]+", text).group(0) == pin, "the first torch== in README is not the test command's"
    assert f"pip install {pin} -e . && python -m autograd_lens -o trace.html" in lines, "README lost its demo command"
    assert f'pip install {pin} -e ".[test]" && python -m pytest' in lines


# --- prose length -----------------------------------------------------------------------------------------------


def prose_words(text: str) -> int:
    """Words outside fenced code blocks and table rows."""
    return sum(len(line.split()) for line in lines_outside_fences(text) if not line.lstrip().startswith("|"))


def test_prose_words_skip_code_and_tables():
    text = "One two three.\n\n```python\nnot counted here\n```\n\n| a | b |\n|---|---|\n| x y z | w |\n\nfour `five`\n"
    assert prose_words(text) == 5


def test_readme_prose_is_short():
    count = prose_words(read(README))
    assert count <= PROSE_LIMIT, f"README.md has {count} words of prose (at most {PROSE_LIMIT}): move detail to docs/"


# --- links ------------------------------------------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def outside_code(text: str) -> str:
    """The text without fenced blocks and inline code spans."""
    return "\n".join(re.sub(r"(`+)(?:(?!\1).)+?\1", "", line) for line in lines_outside_fences(text))


def anchors(path: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, -1, -2 … on repeats."""
    seen: dict[str, int] = {}
    found = set()
    for line in lines_outside_fences(read(path)):
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", match.group(1))
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def dead_links(path: str) -> list[str]:
    """Relative links (and images) in a Markdown file whose file, or heading anchor, does not exist."""
    dead = []
    for target in LINK.findall(outside_code(read(path))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):
            continue  # http:, https:, mailto: …
        file_part, _, anchor = target.partition("#")
        file_part = urllib.parse.unquote(file_part)
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        if not os.path.exists(resolved):
            dead.append(target)
        elif anchor and resolved.endswith(".md") and anchor.lower() not in anchors(resolved):
            dead.append(target)
    return dead


def markdown_pages() -> list[str]:
    return [README, *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]


def test_every_relative_link_points_to_an_existing_file():
    pages = markdown_pages()
    assert len(pages) >= 5  # README.md, docs/guide.md, guarantees.md, architecture.md, course.md
    dead = {os.path.relpath(page, ROOT): dead_links(page) for page in pages}
    assert not {page: links for page, links in dead.items() if links}


def test_dead_link_check_finds_dead_links(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "there.md").write_text("# A heading, with `code`\n\n## Again\n## Again\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Top\n[ok](sub/there.md) [ok](sub/there.md#a-heading-with-code) [ok](sub/there.md#again-1) [ok](#top)\n"
        "[web](https://example.org/nothing.md) `[in code](missing.md)`\n\n```\n[in a block](missing.md)\n```\n"
        "[gone](sub/missing.md) ![gone](pictures/none.png) [bad anchor](sub/there.md#nowhere) [bad](#bottom)\n",
        encoding="utf-8",
    )
    assert dead_links(str(page)) == ["sub/missing.md", "pictures/none.png", "sub/there.md#nowhere", "#bottom"]
