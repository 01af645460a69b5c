"""The probe's stages, self-contained: load, template, generate, classify.

This module imports nothing from this package on purpose: its source *is* the body of every
record's ``repro_script`` (see ``repro.py``), so the script that reproduces a probe runs exactly the
code the probe ran, with plain ``python`` and no project install. Keep it to the standard library,
torch and transformers (and Pillow, which transformers' image processors need anyway).

Two tasks share the stages: ``text-generation`` (a tokenizer and ``AutoModelForCausalLM``) and
``image-text-to-text`` (a processor and ``AutoModelForImageTextToText``, with the fixed image that
``probe_image`` draws, in code, so that this script re-creates it).
"""

import time
import traceback as _traceback

from .probe_backend import StepTimer, device_clock
from .probe_compile import (
    compile_counts,
    compile_forward,
    compile_settings,
    execution_context,
    is_compile_error,
)
from .probe_failures import (
    NewlyInitialisedWeights,
    NoChatTemplate,
    NoImageProcessor,
    NotAProbedTask,
    TooLongForPositions,
    VisionBackendMissing,
)
from .probe_vision import (
    build_image_inputs,
    image_token_id,
    load_processor,
    probe_image,
    vision_environment,
)

# Their home as a stored traceback names them, as when they were defined here (in a repro script:
# its own).
for _failure in (
    NewlyInitialisedWeights,
    NoChatTemplate,
    NoImageProcessor,
    NotAProbedTask,
    TooLongForPositions,
    VisionBackendMissing,
):
    _failure.__module__ = __name__
del _failure

PASS, FAIL_LOAD, FAIL_GEN, FAIL_OTHER = "PASS", "FAIL(load)", "FAIL(gen)", "FAIL(other)"
DEFAULT_PROMPT = "The future of AI is"
TEXT_GENERATION, IMAGE_TEXT_TO_TEXT = "text-generation", "image-text-to-text"
#: The tasks the probe runs (the Hub's pipeline_tag names); ``auto`` decides from the model.
TASKS = (TEXT_GENERATION, IMAGE_TEXT_TO_TEXT)
DEFAULT_IMAGE_PROMPT = "Describe this image."
STAGE_VERDICT = {
    "download": FAIL_LOAD,
    "compile": FAIL_GEN,
    "load": FAIL_LOAD,
    "template": FAIL_OTHER,
    "generate": FAIL_GEN,
    "runner": FAIL_OTHER,
}


#: Failures of the environment (or of what was asked), not of the model: the result carries
#: ``exclusion_reason`` and no verdict.
NOT_A_VERDICT = (NotAProbedTask, VisionBackendMissing, TooLongForPositions)
#: The new tokens the verdict generates by default (``max_new_tokens``' default).
VERDICT_TOKENS = 8


def positions_of(model):
    """The positions a model can hold (its text config's ``max_position_embeddings``; gpt2's
    ``n_positions``, which transformers maps to it), or None where the config names none."""
    config = (
        model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    )
    positions = getattr(config, "max_position_embeddings", None)
    return positions if isinstance(positions, int) else None


def positions_short(model, tokens_in, max_new_tokens):
    """Why the model's positions (its text config's ``max_position_embeddings``; gpt2's
    ``n_positions``) cannot hold the prompt's ``tokens_in`` and ``max_new_tokens`` more, or None.
    Only the length axis excludes: a model that cannot hold even the prompt plus the verdict's
    ``VERDICT_TOKENS`` fails at any length as at the default (FAIL(gen), its own verdict), so it
    is not excluded here; one that holds those but not the asked length is."""
    positions = positions_of(model)
    need = tokens_in + max_new_tokens
    if positions is None or need <= positions:
        return None
    # fails at the default too: its own verdict
    if tokens_in + min(max_new_tokens, VERDICT_TOKENS) > positions:
        return None
    return (
        f"max_position_embeddings={positions} cannot hold the prompt's {tokens_in} tokens plus "
        f"max_new_tokens={max_new_tokens} ({need} positions): excluded on the length axis (ask "
        f"for at most {positions - tokens_in} new tokens)"
    )


def is_oom(exc):
    """Out of memory, on the device or the host, whatever raised it."""
    text = f"{type(exc).__name__}: {exc}".lower()
    return (
        isinstance(exc, MemoryError)
        or "outofmemory" in text
        or "out of memory" in text
        or "resource_exhausted" in text
    )


def classify(stage, exc):
    """The verdict for an exception raised in ``stage`` (docs/design.md): OOM is always
    FAIL(other)."""
    if is_oom(exc):
        return FAIL_OTHER
    return STAGE_VERDICT.get(stage, FAIL_OTHER)


def trimmed_traceback(exc, max_lines=60):
    lines = "".join(_traceback.format_exception(type(exc), exc, exc.__traceback__)).splitlines()
    if len(lines) > max_lines:
        lines = (
            lines[:10]
            + [f"... ({len(lines) - max_lines} lines trimmed) ..."]
            + lines[-(max_lines - 11) :]
        )
    return "\n".join(lines)


#: ``from_pretrained``'s hub kernels stay off. transformers 5.25 turns them on by default when the
#: ``kernels`` package is installed (it now requires it): layers (RMSNorm, SiLU, GELU, rotary) are
#: swapped for compiled kernels downloaded from the Hub, on the devices ``kernels`` knows, and a
#: device it does not know (any out-of-tree PrivateUse1 backend) is refused outright when the model
#: is placed on it at load (a sharded run). Either way the verdict would describe downloaded code
#: and the network, not the stack's own kernels: like ``trust_remote_code``, code from the Hub runs
#: only when asked for. transformers 5.24 reads the same keyword, off by default.
HUB_KERNELS_OFF = {"use_kernels": False}


def quiet_loading():
    """transformers' own switch for its progress bars ("Loading weights" per checkpoint): off,
    since they land in sweep logs, notebooks and command output, where they say nothing a record
    or a timing does not."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def load(
    model_id,
    revision,
    dtype,
    trust_remote_code,
    device,
    info,
    extra=None,
    task=TEXT_GENERATION,
    on_device=None,
):
    """Config, tokenizer (or, for image-text-to-text, the processor) and weights, moved to
    ``device``. Fills ``info`` as it learns things, so a later failure still records the model
    type, architectures, task and size. ``task`` "auto" decides from the config
    (``task_of_config``). ``extra``: more keyword arguments for ``from_pretrained`` (a sharded
    run's ``distributed_config``)."""
    import torch
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoTokenizer,
    )

    quiet_loading()
    kwargs = {"revision": revision or None, "trust_remote_code": trust_remote_code}
    if task != "auto":  # known before the config: a config that fails to load still says its task
        info["task"] = task
    config = AutoConfig.from_pretrained(model_id, **kwargs)
    info["model_type"] = getattr(config, "model_type", None)
    info["architectures"] = list(getattr(config, "architectures", None) or [])
    info["task"] = task = task_of_config(config) if task == "auto" else task
    if task == IMAGE_TEXT_TO_TEXT:
        tokenizer, model_class = load_processor(model_id, kwargs), AutoModelForImageTextToText
    else:
        tokenizer, model_class = (
            AutoTokenizer.from_pretrained(model_id, **kwargs),
            AutoModelForCausalLM,
        )
    model, loading = model_class.from_pretrained(
        model_id,
        dtype=getattr(torch, dtype),
        output_loading_info=True,
        **HUB_KERNELS_OFF,
        **kwargs,
        **(extra or {}),
    )
    info["num_params"] = sum(p.numel() for p in model.parameters())
    newly = sorted(loading.get("missing_keys") or []) + sorted(
        str(k) for k in (loading.get("mismatched_keys") or [])
    )
    if newly:
        shown = ", ".join(newly[:5]) + (", ..." if len(newly) > 5 else "")
        raise NewlyInitialisedWeights(
            f"{len(newly)} weights of {type(model).__name__} are not in the checkpoint and "
            f"were newly initialised: {shown}"
        )
    if not (extra or {}).get("distributed_config"):
        if on_device:  # built in host memory: from here on, the device's work
            on_device()
        model.to(device)  # a model split by a distributed_config is already on this rank's device
    model.eval()
    return model, tokenizer


def task_of_config(config):
    """``auto``'s answer from a config: image-text-to-text when transformers maps it to its
    image-text-to-text auto class (``AutoModelForImageTextToText``, checked first: Gemma 3 and
    Llama 4 are in both), else text-generation (a config that is neither then fails to load as a
    causal LM, as before)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    if getattr(config, "model_type", None) in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return IMAGE_TEXT_TO_TEXT
    auto_map = getattr(config, "auto_map", None) or {}
    return (
        IMAGE_TEXT_TO_TEXT
        if "AutoModelForImageTextToText" in auto_map and "AutoModelForCausalLM" not in auto_map
        else TEXT_GENERATION
    )


def task_of_pipeline_tag(tag):
    """``auto``'s answer from the Hub's ``pipeline_tag``: the tag itself when the probe runs that
    task, None when the Hub does not say; a tag of another task raises NotAProbedTask (an
    exclusion, not a verdict)."""
    if not tag or tag in TASKS:
        return tag or None
    raise NotAProbedTask(
        f"the Hub lists this model as {tag}, not {' or '.join(TASKS)}: the probe does not run "
        "that task (set task to text-generation or image-text-to-text to probe it anyway)"
    )


def build_inputs(tokenizer, prompt, chat_template):
    """Token ids of the prompt, through the chat template when the tokenizer has one ("auto").

    Returns (input_ids, attention_mask, chat_template_used)."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if chat_template == "required" and not has_template:
        raise NoChatTemplate("chat_template='required' but the tokenizer has no chat template")
    if has_template and chat_template in ("auto", "required"):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        encoded = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        return encoded["input_ids"], encoded["attention_mask"], True
    encoded = tokenizer(prompt, return_tensors="pt")
    return encoded["input_ids"], encoded["attention_mask"], False


def on_device(extra_inputs, device, model):
    """``extra_inputs`` (the image inputs; None for text) on ``device``, floating ones in
    ``model``'s dtype."""
    if not extra_inputs:
        return {}
    dtype = next(model.parameters()).dtype
    return {
        key: value.to(device, dtype=dtype) if value.is_floating_point() else value.to(device)
        for key, value in extra_inputs.items()
    }


#: How many of its best logits the device keeps for each generated step (``top_scores``), for the
#: reference check.
TOP_K_KEPT = 32


def top_scores(step_logits, k=TOP_K_KEPT):
    """One generated step's logits as the reference check needs them (``agreement.compare``), on
    the host: the ``k`` best token ids and their logits, and the log-sum-exp over the whole
    vocabulary (so their log-probabilities are exact), in float32; the raw logits, before any
    logits processor."""
    logits = step_logits.reshape(-1).float()
    values, ids = logits.topk(min(k, logits.shape[-1]))
    return {
        "ids": ids.tolist(),
        "logits": values.tolist(),
        "logsumexp": float(logits.logsumexp(-1)),
    }


def generate(
    model,
    tokenizer,
    input_ids,
    attention_mask,
    max_new_tokens,
    device,
    timer=None,
    cache="dynamic",
    no_grad=False,
    scores=None,
    extra_inputs=None,
):
    """Greedy generation; returns the new token ids (fewer than max_new_tokens when EOS came
    early). ``cache`` "static" asks transformers for its static KV cache
    (``cache_implementation="static"``). ``no_grad``: torch.no_grad() rather than
    inference_mode() (FSDP2-sharded models refuse inference tensors). ``scores``: a list that
    receives each generated step's ``top_scores``. ``extra_inputs``: an image-text-to-text
    model's image inputs (``build_image_inputs``)."""
    import torch

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    if scores is not None:
        extra.update(output_logits=True, return_dict_in_generate=True)
    with torch.no_grad() if no_grad else torch.inference_mode():
        try:
            output = model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad,
                streamer=timer,
                **on_device(extra_inputs, device, model),
                **extra,
            )
        except BaseException:
            # generate() ends its streamer only when it finishes: a census that stepped off torch's
            # dispatch stack mid-generation (``Census.following``) must step back on before this
            # mode restores the dispatch state
            if timer is not None:
                timer.end()
            raise
        if scores is not None:
            scores.extend(top_scores(step[0]) for step in output.logits)
            output = output.sequences
    return output[0, input_ids.shape[1] :].tolist()


#: The keys of ``run_stages``' result, in order (model and tokenizer only with keep_model).
RESULT_KEYS = (
    "status",
    "failure_stage",
    "exception",
    "model_type",
    "architectures",
    "num_params",
    "chat_template_used",
    "tokens_in",
    "tokens_out",
    "output_token_ids",
    "generated_text",
    "failed_step",
    "load_s",
    "first_token_s",
    "token_times",
    "generate_s",
    "decode_tokens_per_s",
    "input_ids",
    "step_scores",
    "compile_s",
    "graphs",
    "graph_breaks",
    "graph_break_reasons",
    "recompilations",
    "recompile_limit_hit",
    "compile_dynamic",
    "compile_cache",
    "matches_eager",
    "matches_eager_note",
    "task",
    "image_tokens",
    "image_sha256",
    "exclusion_reason",
    "model",
    "tokenizer",
)


class _Stage:
    """The stage running now (a failure is classified by it), announced to ``on_stage`` as it
    starts."""

    def __init__(self, on_stage=None):
        self.on_stage = on_stage
        self.name = None

    def enter(self, name):
        self.name = name
        if self.on_stage:
            self.on_stage(name)


def run_stages(
    model_id,
    revision="",
    dtype="bfloat16",
    prompt=DEFAULT_PROMPT,
    max_new_tokens=8,
    chat_template="auto",
    trust_remote_code=False,
    seed=0,
    device="cpu",
    synchronize=None,
    keep_model=False,
    mode="eager",
    cache="dynamic",
    compile_backend="inductor",
    load_kwargs=None,
    timer=None,
    on_stage=None,
    on_load=None,
    no_grad=False,
    task="auto",
    image_prompt=DEFAULT_IMAGE_PROMPT,
    on_device=None,
):
    """Load, template, generate, each guarded: every exception lands in the result with its
    stage.

    ``task``: text-generation (``prompt``), image-text-to-text (``image_prompt`` and the probe
    image, through the processor), or auto: decided from the config (``task_of_config``). A
    failure of the environment rather than the model (``NOT_A_VERDICT``: a processor that needs a
    missing torchvision) gives no verdict but ``exclusion_reason``.

    ``mode`` "compile" runs the generation through torch.compile (``compile_backend``): a failure
    raised by the compiler is stage "compile" when plain eager generates, else eager's own error
    at "generate" (dynamo's fake tensors meet a model's shape bug first, but the bug is not the
    compiler's); the first token's time carries the compilation (``compile_s``); graphs, breaks
    and recompilations are counted. ``mode`` "fused" runs it in TorchTPU's deferred-and-fused
    eager (``execution_context``; check ``fused_eager_missing`` first). In both, the same
    generation runs again in plain eager to say whether the tokens match (``matches_eager``; a
    rerun that raises is a note, ``matches_eager_note``).

    Hooks for a sharded rank: ``load_kwargs`` (its ``distributed_config``), ``timer`` (a
    StepTimer that also reports progress), ``on_stage(name)`` as each stage starts,
    ``on_load(model)`` once loaded, and ``no_grad`` (FSDP-sharded models refuse inference
    tensors).

    Returns a dict with ``RESULT_KEYS``: status, failure_stage, exception (the object), token
    counts and ids, the device's best logits per generated step (``step_scores``, for the
    reference check), the generated text, timings, and what was learned about the model."""
    result = dict.fromkeys(RESULT_KEYS)
    stage = _Stage(on_stage)
    try:
        stage.enter("load")
        loading = (
            model_id,
            revision,
            dtype,
            trust_remote_code,
            device,
            result,
            load_kwargs,
            task,
            on_device,
        )
        model, tokenizer = _timed_load(result, loading, synchronize, on_load)
        stage.enter("template")
        tokenizer, input_ids, attention_mask, extra_inputs = _template(
            result, model, tokenizer, prompt, image_prompt, chat_template
        )
        short = positions_short(model, result["tokens_in"], max_new_tokens)
        # before generating: the length asked does not fit, an exclusion rather than a failure
        if short:
            raise TooLongForPositions(short)
        stage.enter("generate")
        run = _Generation(
            model,
            tokenizer,
            input_ids,
            attention_mask,
            max_new_tokens,
            device,
            cache,
            seed,
            no_grad,
            extra_inputs,
        )
        timer = timer or StepTimer(synchronize)
        timer.device_clock = device_clock(getattr(device, "type", str(device).split(":")[0]), mode)
        run.in_mode(result, stage, mode, compile_backend, timer)
        if mode != "eager":
            _compare_with_eager(result, run)
        result["status"] = PASS
        if keep_model:
            result["model"], result["tokenizer"] = model, tokenizer
    except NOT_A_VERDICT as exc:  # the environment, not the model: no verdict
        result["exclusion_reason"] = str(exc)
        result["exception"] = exc
    except Exception as exc:  # noqa: BLE001 every failure is the result, classified by its stage
        result["status"] = classify(stage.name, exc)
        result["failure_stage"] = stage.name
        result["exception"] = exc
    return result


def _compare_with_eager(result, run):
    """``matches_eager``: the same generation again in plain eager, a check beside the verdict,
    never part of it: a rerun that raises leaves it null with the reason in
    ``matches_eager_note``, and the run's verdict is what the run did."""
    try:
        result["matches_eager"] = run.eagerly() == result["output_token_ids"]
    except Exception as exc:  # noqa: BLE001 whatever stops the rerun, the run itself generated
        result["matches_eager_note"] = f"the plain eager rerun failed: {type(exc).__name__}: {exc}"[
            :2000
        ]


def _timed_load(result, loading, synchronize, on_load):
    """The load stage: ``load`` (the processor for an image-text-to-text model), timed to the
    device's sync (``load_s``), then ``on_load(model)``; ``loading``: ``load``'s arguments."""
    start = time.perf_counter()
    model, tokenizer = load(*loading)
    if synchronize:
        synchronize()
    result["load_s"] = time.perf_counter() - start
    if on_load:
        on_load(model)
    return model, tokenizer


def _template(result, model, tokenizer, prompt, image_prompt, chat_template):
    """The template stage (``prompt_inputs``): the prompt's token ids (``tokens_in``,
    ``input_ids``), and for an image-text-to-text model its tokenizer and image inputs."""
    tokenizer, input_ids, attention_mask, extra_inputs = prompt_inputs(
        model, tokenizer, result, prompt, image_prompt, chat_template
    )
    result["tokens_in"] = int(input_ids.shape[1])
    result["input_ids"] = input_ids[0].tolist()
    return tokenizer, input_ids, attention_mask, extra_inputs


class _Generation:
    """One prompt's greedy generation, ready to run in the probe's mode or plainly eager (seeded
    alike)."""

    def __init__(
        self,
        model,
        tokenizer,
        input_ids,
        attention_mask,
        max_new_tokens,
        device,
        cache,
        seed,
        no_grad,
        extra_inputs,
    ):
        self.model, self.tokenizer = model, tokenizer
        self.args = (input_ids, attention_mask, max_new_tokens, device)
        self.cache, self.seed, self.no_grad, self.extra_inputs = cache, seed, no_grad, extra_inputs

    def run(self, timer=None, scores=None):
        import torch

        torch.manual_seed(self.seed)
        return generate(
            self.model,
            self.tokenizer,
            *self.args,
            timer,
            self.cache,
            self.no_grad,
            scores,
            self.extra_inputs,
        )

    def eagerly(self):
        """The same generation in plain eager (the model's own forward), for ``matches_eager``."""
        return self.run()

    def in_mode(self, result, stage, mode, compile_backend, timer):
        """The generate stage in ``mode``: tokens, text and timings into ``result``; a compile
        failure is blamed on stage "compile" only when plain eager generates (else eager's own
        error is raised)."""
        eager_forward = compile_forward(self.model, compile_backend) if mode == "compile" else None
        # the stack's dynamic setting, and the cache it made the generation use
        if mode == "compile":
            result.update(compile_settings(self.model, compile_backend, self.cache))
        result["step_scores"] = []  # the device's best logits per step, for the reference check
        start = time.perf_counter()
        try:
            with execution_context(mode):
                new_ids = self.run(timer, result["step_scores"])
        except Exception as exc:
            result["failed_step"] = len(timer.times)
            if mode == "compile":
                result.update(compile_counts())
                self.model.forward = eager_forward
                if is_compile_error(exc):  # the compiler's failure only if plain eager generates
                    eager_exc = self.eager_failure()
                    if eager_exc is not None:
                        # the model fails eagerly too: its own error, stage generate
                        raise eager_exc from None
                    stage.name = "compile"
            raise
        _outputs(result, self.tokenizer, new_ids, timer, start, time.perf_counter())
        if mode == "compile":
            result.update(compile_counts(), compile_s=result["first_token_s"])
            self.model.forward = eager_forward

    def eager_failure(self):
        """The exception plain eager generation raises, or None when it generates."""
        try:
            self.run()
        except Exception as exc:  # noqa: BLE001 whatever it is, it is the answer
            return exc
        return None


def _outputs(result, tokenizer, new_ids, timer, start, end):
    """What a generation that finished records: its tokens and text, and the timings ``timer``
    saw."""
    result["output_token_ids"] = new_ids
    result["tokens_out"] = len(new_ids)
    result["generated_text"] = tokenizer.decode(new_ids, skip_special_tokens=True)
    result["generate_s"] = end - start
    if timer.times:
        # each token on the device's own clock, where it has one: the perf phase's TPOT
        # (``performance.verdict_steps``)
        result["token_times"] = list(timer.device_times)
        result["first_token_s"] = timer.times[0] - start
        if len(timer.times) > 1 and timer.times[-1] > timer.times[0]:
            result["decode_tokens_per_s"] = (len(timer.times) - 1) / (
                timer.times[-1] - timer.times[0]
            )


def prompt_inputs(model, tokenizer, result, prompt, image_prompt, chat_template):
    """The template stage for ``result["task"]`` (``load`` filled it): (tokenizer, input_ids,
    attention_mask, extra_inputs). For image-text-to-text, ``tokenizer`` comes in as the
    processor and goes out as its tokenizer, ``extra_inputs`` holds the image inputs; ``result``
    gets chat_template_used, and for an image the probe image's hash and the image's share of the
    ids (``image_tokens``)."""
    if result["task"] != IMAGE_TEXT_TO_TEXT:
        input_ids, attention_mask, result["chat_template_used"] = build_inputs(
            tokenizer, prompt, chat_template
        )
        return tokenizer, input_ids, attention_mask, None
    processor = tokenizer
    image, result["image_sha256"] = probe_image()
    with vision_environment():  # a package the processor only asks for when it runs
        input_ids, attention_mask, extra_inputs, result["chat_template_used"] = build_image_inputs(
            processor, image_prompt, chat_template, image
        )
    token = image_token_id(model, processor)
    result["image_tokens"] = int((input_ids == token).sum()) if token is not None else None
    return processor.tokenizer, input_ids, attention_mask, extra_inputs
