"""Test data the project makes itself: the offline fixture models (``fixtures``) and realistic
synthetic sweep histories (``synthetic``). Used by the tests, the benchmarks and ``make sweep``'s
fixtures; nothing at run time imports it."""
