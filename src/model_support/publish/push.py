"""Push the Parquet dataset to the Hugging Face Hub (needs network and a token in the environment).

Only the dataset card and the two configs' Parquet files go up: never records, logs or notebooks.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from ..probe.hub_fetch import classify


class PushError(UserError):
    """Pushing failed; the message says why in one sentence."""


def push(data_dir: Path, repo_id: str, private: bool = True) -> str:
    from huggingface_hub import HfApi

    data_dir = Path(data_dir)
    if not (data_dir / "README.md").exists() or not any((data_dir / "results").glob("sweep=*/*.parquet")):
        raise PushError(f"{data_dir} holds no dataset yet; run a sweep first (make sweep).")
    api = HfApi()
    try:
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        commit = api.upload_folder(
            folder_path=str(data_dir),
            repo_id=repo_id,
            repo_type="dataset",
            allow_patterns=["README.md", "results/**/*.parquet", "excluded/**/*.parquet"],
            commit_message="model-support: update sweeps",
        )
    except Exception as exc:  # noqa: BLE001  classified: a Hub or network problem is one sentence, a bug re-raises
        if classify(exc, repo_id)[0] is None:
            raise
        raise PushError(
            f"Could not push to the Hub dataset {repo_id!r} ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
            "this needs network access to huggingface.co and a write token in HF_TOKEN."
        ) from exc
    return getattr(commit, "commit_url", None) or f"https://huggingface.co/datasets/{repo_id}"
