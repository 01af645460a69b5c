"""The device's backend, self-contained (part of every repro script's body, as ``probe_core``):
loaded through torch's device-backend entry point (autoload off), its synchronisation and clock,
and the step timer that reads each generated token's time on it."""

import time

#: torch's entry-point group for out-of-tree device backends (its "autoload"); see ``load_backend``.
BACKENDS_GROUP = "torch.backends"


#: The variable that turns torch's autoload of every installed backend off ("0"), before ``import
#: torch``.
AUTOLOAD_VAR = "TORCH_DEVICE_BACKEND_AUTOLOAD"


#: The ``torch.backends`` entry points to load beside the one named for the device (comma-separated
#: names): a backend whose entry point is not named ``<device>`` or ``torch_<device>``, which
#: torch's autoload would have loaded.
BACKEND_ENTRY_POINTS_VAR = "MODEL_SUPPORT_BACKEND_ENTRY_POINTS"


def backend_device(entry_point_name):
    """The device a ``torch.backends`` entry point provides, by the packages' convention:
    torch_tpu -> tpu."""
    return entry_point_name.removeprefix("torch_")


def load_backend(device_type):
    """Register ``device_type`` with torch by calling the ``torch.backends`` entry point of the
    package that provides it, as torch's autoload does on ``import torch``, but only that one:
    the autoload is off in every process of ours (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), since it
    would load every installed backend (torch_tpu alone costs ~8 s and, on a machine with no TPU,
    can stall in libtpu's set-up). Nothing happens when torch already knows the device or no
    installed package provides it."""
    import importlib.metadata
    import os

    import torch

    if device_type == "cpu" or torch._C._get_privateuse1_backend_name() == device_type:
        return
    # a backend whose entry point is not named for its device (Intel Gaudi's ``device_backend`` for
    # hpu) is named by the user in BACKEND_ENTRY_POINTS_VAR (comma-separated entry point names):
    # torch's autoload is off in our processes
    named = {
        n.strip() for n in os.environ.get(BACKEND_ENTRY_POINTS_VAR, "").split(",") if n.strip()
    }
    for entry in importlib.metadata.entry_points(group=BACKENDS_GROUP):
        if backend_device(entry.name) == device_type or entry.name in named:
            entry.load()()


def synchronizer(device_type):
    """What waits for ``device_type``'s queued work (a timing is honest only after it): torch's
    generic ``torch.accelerator.synchronize``, or the backend's own ``torch.<type>.synchronize``
    where the generic call is refused (a backend written in Python has no streams torch knows);
    None on the CPU."""
    if device_type == "cpu":
        return None
    import torch

    try:
        torch.accelerator.synchronize()
        return torch.accelerator.synchronize
    except (RuntimeError, NotImplementedError):
        return getattr(torch, device_type).synchronize


def device_clock(device_type, mode="eager"):
    """The device's own clock, where its backend's device module (``torch.<type>``) offers one as
    ``perf_clock`` (a ``time.perf_counter``-like function reading the device's timeline, as its
    event timer would), else None: the host's wall clock, read after a sync. A module whose clock
    does not see what a compiled graph runs says so (``perf_clock_sees_compiled = False``: a
    backend written in Python, whose compiled graphs run on the CPU underneath, past its
    dispatch): in mode compile, None. The perf phase (``Adapter.perf_clock``) and the repro
    script's timed repeats read the same, so ``bisect --metric`` compares like with like."""
    if device_type == "cpu":
        return None
    import torch

    module = getattr(torch, device_type, None)
    clock = getattr(module, "perf_clock", None)
    if mode == "compile" and not getattr(module, "perf_clock_sees_compiled", True):
        return None
    return clock if callable(clock) else None


class StepTimer:
    """A generate() streamer that timestamps each new token (after a device sync, so compilation and
    queued work are counted where they happen)."""

    #: A second clock to stamp each token on too: the device's own (``device_clock``), so the
    #: verdict's generation is the perf phase's first repeat on the clock the phase times on
    #: (``performance.verdict_steps``); None: none.
    device_clock = None

    def __init__(self, synchronize=None, clock=None):
        self.synchronize = synchronize
        # the device's own clock where it has one (``Adapter.perf_clock``)
        self.clock = clock or time.perf_counter
        self.times = []
        self.device_times = []
        self._seen_prompt = False

    def put(self, value):
        if not self._seen_prompt:
            self._seen_prompt = True
            return
        if self.synchronize:
            self.synchronize()
        self.times.append(self.clock())
        if self.device_clock is not None:
            self.device_times.append(self.device_clock())

    def end(self):
        pass
