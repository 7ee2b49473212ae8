"""Source checks on a small real git repository: dirty trees, non-commits, tree equality, exact export."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.build import git
from orchestrator.errors import BuildError
from orchestrator.lab.source import git_env


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], env=git_env(), check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "src"
    r.mkdir()
    _git(r, "init", "-q", "-b", "main")
    (r / "a.cpp").write_text("int a() { return 1; }\n")
    (r / "tools").mkdir()
    (r / "tools" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (r / "tools" / "run.sh").chmod(0o755)
    _git(r, "add", "-A")
    _git(r, "commit", "-q", "-m", "one")
    _git(r, "tag", "one")
    return r


def test_clean_repo_resolves_to_commit_tree_and_count(repo: Path) -> None:
    git.require_clean(repo)
    rev = git.resolve(repo, "one")
    assert rev.commit == _git(repo, "rev-parse", "HEAD") and rev.tree == _git(repo, "rev-parse", "HEAD^{tree}")
    assert rev.count == 1 and rev.build_info == f"b1-{rev.commit[:10]}"


@pytest.mark.parametrize("make_dirty", ["modify", "untracked", "staged"])
def test_dirty_tree_is_refused(repo: Path, make_dirty: str) -> None:
    if make_dirty == "modify":
        (repo / "a.cpp").write_text("int a() { return 2; }\n")
    elif make_dirty == "untracked":
        (repo / "notes.txt").write_text("x")
    else:
        (repo / "b.cpp").write_text("x")
        _git(repo, "add", "b.cpp")
    with pytest.raises(BuildError, match="uncommitted changes or untracked files"):
        git.require_clean(repo)


@pytest.mark.parametrize("rev,reason", [("one^{tree}", "a tree, not a commit"), ("nope", "not a known revision"),
                                        ("--output=/tmp/x", "not valid"), ("", "not valid")])  # fmt: skip
def test_non_commit_revisions_are_refused(repo: Path, rev: str, reason: str) -> None:
    with pytest.raises(BuildError, match=reason):
        git.resolve(repo, rev)


def test_blob_revision_is_refused(repo: Path) -> None:
    blob = _git(repo, "rev-parse", "HEAD:a.cpp")
    with pytest.raises(BuildError, match="a blob, not a commit"):
        git.resolve(repo, blob)


def test_expect_tree_accepts_same_tree_and_refuses_another(repo: Path) -> None:
    one = git.resolve(repo, "one")
    # a "merge" commit whose tree equals the reviewed head
    same = _git(repo, "commit-tree", one.tree, "-p", one.commit, "-m", "merge")
    git.require_tree(repo, git.resolve(repo, same), "one")
    (repo / "a.cpp").write_text("int a() { return 3; }\n")
    _git(repo, "commit", "-q", "-am", "two")
    two = git.resolve(repo, "HEAD")
    with pytest.raises(BuildError, match="tree mismatch"):
        git.require_tree(repo, two, "one")


def test_export_is_the_commit_not_the_working_copy_and_diff_proves_it(repo: Path, tmp_path: Path) -> None:
    one = git.resolve(repo, "one")
    (repo / "a.cpp").write_text("working copy edit\n")  # must not leak into the export
    out = tmp_path / "export"
    git.export_tree(repo, one.commit, out)
    assert (out / "a.cpp").read_text() == "int a() { return 1; }\n"
    assert (out / "tools" / "run.sh").stat().st_mode & 0o111
    assert git.export_differences(repo, one.commit, out) == []
    (out / "a.cpp").write_text("changed\n")
    (out / "extra.h").write_text("x")
    (out / "tools" / "run.sh").chmod(0o644)
    diff = git.export_differences(repo, one.commit, out)
    assert diff == [
        "a.cpp: bytes differ from the commit's blob " + _git(repo, "rev-parse", "HEAD:a.cpp")[:12],
        f"extra.h: not in {one.commit[:10]}'s tree",
        "tools/run.sh: mode 100644, the commit has 100755",
    ]


def test_export_keeps_links_and_attribute_bytes_and_sees_a_rewritten_file(repo: Path, tmp_path: Path) -> None:
    """`.gitattributes` ident/eol would make `git diff` call a rewritten file equal; the blob id does not."""
    (repo / ".gitattributes").write_text("* ident\n*.txt text eol=crlf\n")
    (repo / "v.txt").write_text("$Id$\nline\n")
    (repo / "link").symlink_to("a.cpp")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "two")
    two = git.resolve(repo, "HEAD")
    out = tmp_path / "export"
    git.export_tree(repo, two.commit, out)
    assert (out / "v.txt").read_bytes() == b"$Id$\nline\n" and os.readlink(out / "link") == "a.cpp"
    assert git.export_differences(repo, two.commit, out) == []
    expanded = subprocess.run(["git", "-C", str(repo), "archive", two.commit, "v.txt"], env=git_env(),
                              check=True, capture_output=True).stdout  # fmt: skip
    assert b"$Id: " in expanded and b"\r\n" in expanded  # what `git archive` would have built
    (out / "v.txt").write_bytes(b"$Id: 0123 $\r\nline\r\n")
    assert [d.split(":")[0] for d in git.export_differences(repo, two.commit, out)] == ["v.txt"]


def test_a_tree_with_a_path_no_checkout_writes_is_refused(repo: Path, tmp_path: Path) -> None:
    blob = _git(repo, "rev-parse", "HEAD:a.cpp")
    tree = subprocess.run(["git", "-C", str(repo), "mktree"], input=f"100644 blob {blob}\t..\n", env=git_env(),
                          check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    commit = _git(repo, "commit-tree", tree, "-m", "hostile")
    with pytest.raises(BuildError, match="a path git would not check out"):
        git.export_tree(repo, commit, tmp_path / "export")
    assert not list((tmp_path / "export").iterdir())


def test_not_a_repository_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="does not exist"):
        git.require_repo(tmp_path / "missing")


def test_a_tree_whose_link_is_the_folder_of_another_entry_is_refused(repo: Path, tmp_path: Path) -> None:
    """A crafted tree (mktree takes duplicate names): link `x` to a folder outside, then a tree `x`
    holding link `evil`; the export must not make `evil` through `x` (mkdir would follow it)."""
    outside = tmp_path / "outside"
    outside.mkdir()

    def obj(*args: str, data: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], input=data, env=git_env(), check=True,
                              capture_output=True, text=True).stdout.strip()  # fmt: skip

    link = obj("hash-object", "-w", "--stdin", data=str(outside))
    evil = obj("hash-object", "-w", "--stdin", data="zz")
    sub = obj("mktree", data=f"120000 blob {evil}\tevil\n")
    tree = obj("mktree", data=f"120000 blob {link}\tx\n040000 tree {sub}\tx\n")
    commit = _git(repo, "commit-tree", tree, "-m", "hostile")
    with pytest.raises(BuildError, match="x/evil.*inside x, which the tree also lists"):
        git.export_tree(repo, commit, tmp_path / "export")
    assert not list(outside.iterdir())
