"""What the localiser replays and what it finds (``localise``'s module docstring says how): a
``Replay`` and a ``Localised``, apart from the replay's dispatch mode (``operator_check_mode``,
which imports torch) and from the localiser's workflow, so both import them."""

from __future__ import annotations

from dataclasses import dataclass, field

#: The flagged operators a result lists, the first first (the rest are counted, ``ops_wrong``).
MAX_LISTED = 20


@dataclass
class Replay:
    """What the localiser runs on the device (see the module docstring): a prompt
    (``prompt_ids``; None: the probe's), then ``tokens`` forced one decode step at a time through
    the KV cache (step ``s``'s forward is the one that answered with token ``s``: the record's
    ``output_token_ids``, or a long text's next tokens); none: the prompt's forward and the one
    token it gives. ``diverged_at``: the step where the record says it first went wrong, and
    ``how`` (in words); ``unreached``: a divergence this replay cannot reach, in words (a
    long-text position when the verdict's own generation is the one chased), which keeps any
    proof from saying the model matches; ``check_from``: the steps before it run unchecked (a
    long text's, filling the cache); ``what``: what is replayed, in words, and ``unit``: what its
    steps are called (a long text's are its positions)."""

    tokens: list[int] = field(default_factory=list)
    diverged_at: int | None = None
    how: str | None = None
    unreached: str | None = None
    prompt_ids: list[int] | None = None
    check_from: int = 0
    what: str = "the run"
    unit: str = "step"

    @property
    def steps(self) -> int:
        """The forwards the whole replay runs: one per forced token (the last one's answer needs
        no forward)."""
        return max(len(self.tokens), 1)

    def as_json(self) -> dict:
        return {
            "what": self.what,
            "tokens": len(self.tokens),
            "steps": self.steps,
            "prompt_tokens": len(self.prompt_ids) if self.prompt_ids is not None else None,
            "check_from": self.check_from,
            "diverged_at": self.diverged_at,
            "how": self.how,
            "unreached": self.unreached,
        }


@dataclass
class Localised:
    """What one checked run found: every operator flagged (in the order they ran, the first
    first, with the step it ran in and its encoded inputs for the repro), how many were judged,
    those that could not be (``unjudged``), the run's own failure (``tracer``'s) if any, how far
    the replay went (``steps_run`` of ``replay.steps``; ``replay`` None: one forward,
    ``localise_forward``), and its output judged against the CPU reference (``numerics``:
    ``agreement.compare``'s keys; None with ``numerics_why``)."""

    checked: int = 0  # operators judged: their CPU replay compared with the device's output
    flagged: int = 0  # every operator flagged; ``wrong`` lists the first ``MAX_LISTED``
    wrong: list[dict] = field(default_factory=list)
    # operators the CPU could not replay; ``unjudged`` lists the first ``MAX_LISTED``
    not_judged: int = 0
    unjudged: list[dict] = field(default_factory=list)
    # operator -> {"outputs": [...], "reason": ...}: outputs of judged operators that no CPU replay
    # makes
    outputs_not_judged: dict[str, dict] = field(default_factory=dict)
    # (args, kwargs) of the first wrong operator, ``op_check.encode``d
    first_inputs: tuple | None = None
    forward_failure: dict | None = None
    device_type: str | None = None
    seconds: float | None = None
    replay: Replay | None = None
    steps_run: int = 1  # the forwards run (the prompt's, then one per decode step)
    tokens_in: int | None = None
    numerics: dict | None = None
    numerics_why: str | None = None
    # the device's ``top_scores`` per step run
    scores: list = field(default_factory=list, repr=False)

    @property
    def first(self) -> dict | None:
        return self.wrong[0] if self.wrong else None

    @property
    def whole(self) -> bool:
        """The replay ran every step it was asked to (it did not stop at a wrong one, nothing
        raised)."""
        return self.replay is None or (
            self.steps_run >= self.replay.steps and self.forward_failure is None
        )


def cannot_run(exc: Exception) -> str:
    """Why an operator was not judged, in one clause: the CPU's error, its first sentence (a
    reader needs which kernel is missing, not torch's advice on custom builds)."""
    text = str(exc).strip()
    message = text.splitlines()[0].split(". ")[0].rstrip(".")[:160] if text else ""
    return f"the CPU cannot run it ({type(exc).__name__}{': ' + message if message else ''})"
