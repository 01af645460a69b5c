"""What the probe raises for a failure it names (self-contained: part of every repro script's
body, as ``probe_core``): newly initialised weights, no chat template, no image processor, a task
it does not probe, a vision package missing, a prompt too long for the model's positions."""


class NewlyInitialisedWeights(RuntimeError):
    """The checkpoint does not cover the loaded model: some weights would be random. Not a PASS."""


class NoChatTemplate(ValueError):
    """chat_template='required' but the tokenizer has none."""


class NoImageProcessor(ValueError):
    """An image-text-to-text model whose folder has no image processor (AutoProcessor gave a
    tokenizer)."""


class NotAProbedTask(ValueError):
    """The model's task is neither text-generation nor image-text-to-text: no verdict, an
    exclusion."""


class TooLongForPositions(ValueError):
    """The prompt plus the asked ``max_new_tokens`` do not fit the model's positions
    (``positions_short``): the length asked of it, not the model, is wrong there: excluded on the
    length axis, no verdict."""


class VisionBackendMissing(RuntimeError):
    """The environment lacks a package this model's processor or the probe image needs (Pillow, a
    working torchvision, num2words): no verdict, an exclusion (the same model passes where it is
    installed)."""
