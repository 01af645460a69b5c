"""The synchronous rerun of a silent abort: ``python -m model_support.probe.instruments.rerun
STARTED_JSON``.

Started by the probe's process once its kernel died silently
(``flight_recorder.rerun_silent_crash``), with the adapter's ``blocking_env`` set where the stack
has one (errors reported at the operator that caused them) and ``FLIGHT_VAR`` naming the rerun's
recorder file, which records whatever the probe's ``flight_recorder`` setting. It runs only what the
dead probe ran on the device, the model's stages (``probe_core.run_stages``, from the settings the
probe wrote before them: ``checks.write_started``), under the flight recorder, pinned to the same
devices (the process inherits the probe's pinning, or its grant): no census, no reference, no
record. It is expected to die; its recorder's last operator is then the one the run died in.
"""

from __future__ import annotations

import json
import sys

from .. import devices, probe_core, probe_params
from . import flight_recorder


def main(started_path: str) -> int:
    settings = json.loads(open(started_path, encoding="utf-8").read())["settings"]
    devices.prepare_environment(settings["device"])  # a gated probe's grant: the same devices
    adapter = devices.resolve(settings["device"])
    recorder = flight_recorder.recorder_for(settings, adapter, mode_sees=True, rerun=True)
    if recorder is None:
        return 2
    with recorder:
        result = probe_core.run_stages(
            model_id=settings["load_from"],
            **probe_params.stage_settings(settings),
            device=adapter.torch_device,
            synchronize=adapter.synchronize if adapter.type != "cpu" else None,
            compile_backend=adapter.compile_backend(),
            on_stage=recorder.enter,
        )
    print(json.dumps({"status": result["status"], "failure_stage": result["failure_stage"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
