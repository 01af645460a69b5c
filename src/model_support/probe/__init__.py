"""One model -> one record: stages, downloads, devices, sharded runs, repro scripts, signatures."""

import warnings

# A probe kernel has no ipywidgets: tqdm.auto (transformers' and huggingface_hub's bars) warns
# "IProgress not found" into every executed probe notebook, which says nothing about the model.
# Plain bars are what we want.
warnings.filterwarnings("ignore", message="IProgress not found", module="tqdm")
