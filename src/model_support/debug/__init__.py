"""Debug one failing model: which module raises (``tracer``), which module diverges from the CPU
reference and at which generation step it fails (``compare``), which aten operator is the first
wrong one (``localise``, its one-operator script ``op_repro``), shown by ``views``; ``runner``
executes ``notebooks/debug.ipynb`` for one model of a sweep, with a what-if sweep's operators on
the host (``hosting``). The notebook calls these names."""

from ..display import show_html
from . import hosting
from .compare import (
    COLUMNS,
    DEFAULT_TOLERANCE,
    build_result,
    compare_tensors,
    compare_traces,
    conclusion,
    first_offender,
    generate_steps,
    load_for_debug,
    load_reference,
    named_operator,
    offender_reason,
    reference_numerics,
    summary_text,
)
from .compiled import explain_graph_breaks, graph_breaks_html
from .debug_runner import (
    DebugRun,
    debug_notebook_path,
    debug_parameters,
    execute_debug,
    prepare_debug,
    resolve_model,
    run_debug_notebook,
)
from .hosting import Hosting, show_host_ops, with_host_ops
from .localise import Localised, localise_forward
from .localise_words import localised_html
from .stack import stack_difference
from .tracer import (
    ROOT_LABEL,
    ForwardTrace,
    ModuleTracer,
    describe_inputs,
    first_tensor,
    model_device,
    model_dtype,
    trace_forward,
)
from .views import (
    DEBUG_FLAG,
    chart_bundle,
    conclusion_html,
    conclusion_slot,
    debug_result_from_notebook,
    divergence_chart,
    divergence_html,
    failure_html,
    generation_html,
    show,
    show_chart,
    show_conclusion,
    summary_html,
    table_html,
)

__all__ = [name for name in dir() if not name.startswith("_")]
