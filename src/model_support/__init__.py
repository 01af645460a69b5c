"""model_support: which Hugging Face models run on this accelerator stack, which fail, where and
why."""

from . import backend_env

__version__ = "0.1.0"

# Every process of ours imports this package before torch: it decides here that torch autoloads no
# backend (the probe's adapter loads the one its device needs), whatever the shell or a backend
# package set (backend_env).
backend_env.own()


def __getattr__(name: str):
    """``model_support.support(model_id, data_dir)``: a model's support card from a dataset
    (``analysis.support``; ``model-support support MODEL`` prints the same). Looked up on first
    use (PEP 562): the package's root imports none of its rooms, which import it for its version."""
    if name == "support":
        import importlib

        return importlib.import_module(".analysis.support", __name__).support
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
