"""model_support: which Hugging Face models run on this accelerator stack, which fail, where and why."""

__version__ = "0.1.0"
