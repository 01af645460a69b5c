"""The docs a newcomer reads name what exists: every function, class or module of the package
they name in code (``store.compact``, ``probe.run.record_from_notebook(path)``) is there; the
README says where the command is and how to choose the data folder, and links each doc once."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import model_support

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]


def _modules() -> dict[str, list[str]]:
    """Every module of the package by its last name (``store`` -> model_support.record.store),
    and the package."""
    found: dict[str, list[str]] = {"model_support": ["model_support"]}
    for info in pkgutil.walk_packages(model_support.__path__, "model_support."):
        if ".notebooks" not in info.name and not info.name.endswith("__main__"):
            found.setdefault(info.name.rsplit(".", 1)[1], []).append(info.name)
    return found


def _resolves(modules: list[str], rest: list[str]) -> bool:
    """Whether ``rest`` (attributes, or submodules) is found under one of ``modules``."""
    for name in modules:
        obj = importlib.import_module(name)
        for i, part in enumerate(rest):
            if not hasattr(obj, part):
                try:
                    obj = importlib.import_module(".".join([name, *rest[: i + 1]]))
                    continue
                except ImportError:
                    break
            obj = getattr(obj, part)
        else:
            return True
    return False


def test_every_name_of_the_package_the_docs_give_exists():
    from model_support.probe.devices.registry import ENTRY_POINT_GROUP

    modules = _modules()
    missing = []
    for doc in DOCS:
        for span in re.findall(r"`([^`\s]+)`", doc.read_text()):
            dotted = re.match(r"([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+)(\(.*\))?$", span)
            if (
                not dotted
                or dotted.group(1).split(".")[0] not in modules
                or dotted.group(1) == ENTRY_POINT_GROUP
            ):
                continue
            first, *rest = dotted.group(1).split(".")
            if rest and rest[-1] in (
                "py",
                "md",
                "json",
                "yaml",
                "ipynb",
                "jsonl",
                "log",
                "html",
                "parquet",
            ):
                continue  # a file name
            if not _resolves(modules[first], rest):
                missing.append(f"{doc.relative_to(REPO)}: {span}")
    assert not missing, "names the docs give that do not exist:\n" + "\n".join(missing)


def test_the_readme_says_where_the_command_is_and_how_to_choose_the_data_folder():
    readme = (REPO / "README.md").read_text()
    assert ".venv/bin/model-support" in readme and "--data-dir" in readme


def test_the_readme_lists_each_doc_once():
    listed = (REPO / "README.md").read_text().split("## Documentation", 1)[1].split("\n## ", 1)[0]
    links = re.findall(r"\]\((docs/[\w.-]+\.md)\)", listed)
    assert sorted(links) == sorted(set(links)), [
        link for link in set(links) if links.count(link) > 1
    ]
