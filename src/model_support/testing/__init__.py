"""Test data and test doubles the project makes itself: the offline fixture models (``fixtures``),
realistic synthetic sweep histories (``synthetic``) and the pretend accelerator (``pretend``: a device
backend written in Python, with a stack's faults). Used by the tests, the benchmarks and ``make
sweep``'s fixtures; at run time only torch's backend autoload reaches it (``pretend.load``, which does
nothing unless ``MODEL_SUPPORT_PRETEND`` is set)."""
