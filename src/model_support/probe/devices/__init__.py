"""Device adapters: one interface (``base.Adapter``, the CPU's), one generic adapter for any backend
``torch.accelerator`` reports (``accelerator.AcceleratorAdapter``), and small subclasses for what is
a backend's own (``cuda``, ``tpu``), found by name through a registry (``registry``).

Adding a backend is one module: subclass ``AcceleratorAdapter`` with what is the backend's own (its
compile backend, visibility variable, cache statistics, the sentence when it is missing), decorate
it with ``@register("<name>")`` and import it below; or, from another package, name the class in the
entry point group ``model_support.devices``. A backend with nothing of its own needs no module at
all: the generic adapter serves it by name. Out-of-tree backends are loaded through torch's own
entry points (``backends``), one per process, only when their device is used.

The probe calls ``resolve(device)``; the sweep's runner calls ``facts``, ``check_available`` and
``pinning_env``, which import nothing heavy (a child process answers what needs torch).
"""

from . import cuda, tpu  # noqa: F401  (their registrations)
from .accelerator import AcceleratorAdapter
from .backends import AUTOLOAD_VAR, load_backend, prepare_environment
from .base import (
    COMMON_MODES,
    CRASHES,
    FALLBACK,
    IMPLEMENTED,
    MISSING,
    OP_STATUSES,
    UNKNOWN,
    WRONG,
    Adapter,
    DeviceUnavailable,
)
from .registry import (
    adapter_class,
    adapter_for,
    backend_identity,
    register,
    registered,
    stack_configuration,
)
from .resolve import (
    DeviceFacts,
    auto_candidates,
    check_available,
    facts,
    known_device,
    pinning_env,
    readable_stacks,
    resolve,
    unknown_device,
)
from .tpu import torch_tpu_installed, tpu_hardware_visible, tpu_rank_env
