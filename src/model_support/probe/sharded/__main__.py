"""``python -m model_support.probe.sharded``: the launcher (``--launch DIR``) and the ranks
(``--rank DIR``) of run_sharded, each given the run folder."""

import sys
from pathlib import Path

from .launch import launch_main
from .rank import rank_main

if __name__ == "__main__":
    role, folder = sys.argv[1], Path(sys.argv[2])
    sys.exit(launch_main(folder) if role == "--launch" else rank_main(folder))
