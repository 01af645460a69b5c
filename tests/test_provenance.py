"""Where a record came from: the package's git commit, whatever git does."""

from __future__ import annotations

import os

import pytest

from model_support.probe import provenance


@pytest.fixture
def git_that_hangs_on_status(tmp_path, monkeypatch):
    """A ``git`` first on PATH that names a commit and then never answers ``git status``."""
    script = tmp_path / "bin" / "git"
    script.parent.mkdir()
    script.write_text(
        '#!/bin/sh\nif [ "$3" = rev-parse ]; then echo 0123abcd; exit 0; fi\nexec sleep 30\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(provenance, "GIT_TIMEOUT_S", 1.0)
    provenance.git_commit.cache_clear()
    yield
    provenance.git_commit.cache_clear()


def test_a_git_status_that_does_not_answer_leaves_the_commit_and_says_it_cannot_tell(
    git_that_hangs_on_status,
):
    assert provenance.git_commit() == "0123abcd-dirty?"


def test_the_commit_of_this_checkout():
    provenance.git_commit.cache_clear()
    commit = provenance.git_commit()
    assert commit is not None and len(commit.removesuffix("-dirty")) == 40
