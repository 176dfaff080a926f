"""The repository itself: nothing tracked that .gitignore says to ignore (a virtual environment
or a build folder committed by a merge stays in git even after .gitignore lists it)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_no_tracked_file_is_ignored_by_gitignore():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.fail("tests run from a git checkout (git and .git are needed to check tracked files)")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--ignored", "--exclude-standard", "-z"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode("utf-8", "replace")
    tracked_but_ignored = [name for name in listed.split("\0") if name]
    assert not tracked_but_ignored, (
        f"{len(tracked_but_ignored)} tracked file(s) match .gitignore (untrack them with "
        f"`git rm -r --cached`): {tracked_but_ignored[:10]}")
