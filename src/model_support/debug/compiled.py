"""A compiled run, explained: torch._dynamo's graph breaks, each with its reason and the line of
user code (the model's or transformers') where the graph broke. Shown by the debug notebook in
compile mode."""

from __future__ import annotations

from ..display import Cell, html_table


def explain_graph_breaks(model, input_ids, attention_mask=None, extra_inputs=None) -> dict:
    """``torch._dynamo.explain`` of one forward (with an image-text-to-text model's image
    inputs): graphs, breaks, and for each break its reason and where (``file:line in function``
    of the innermost user frame)."""
    import torch
    import torch._dynamo

    from ..probe import probe_core

    device = next(model.parameters()).device
    kwargs = {
        "input_ids": input_ids.to(device),
        **probe_core.on_device(extra_inputs, device, model),
    }
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask.to(device)
    torch._dynamo.reset()
    with torch.inference_mode():
        explained = torch._dynamo.explain(model)(**kwargs)
    breaks = []
    for reason in explained.break_reasons:
        frames = list(getattr(reason, "user_stack", None) or [])
        where = (
            f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno} in {frames[-1].name}"
            if frames
            else None
        )
        breaks.append({"reason": str(reason.reason).strip().splitlines()[0][:300], "where": where})
    return {
        "graphs": explained.graph_count,
        "graph_breaks": explained.graph_break_count,
        "breaks": breaks,
    }


def graph_breaks_html(explained: dict) -> str:
    """The graph count, then each break's reason and where it broke (``display.html_table``)."""
    head = (
        f"<p><b>torch.compile</b>: {explained['graphs']} graph(s), {explained['graph_breaks']} "
        "graph break(s) in one forward.</p>"
    )
    if not explained["breaks"]:
        return head
    rows = ([Cell(b["reason"]), Cell(b["where"] or "-", code=True)] for b in explained["breaks"])
    return head + html_table(["reason", "where"], rows)
