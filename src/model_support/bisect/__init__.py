"""Which release changed a model's verdict: two sweeps' stacks compared, a row's repro script rerun
in overlay environments that differ in one package, and that package's releases bisected
(docs/bisect.md).

stacks (the packages whose versions differ, a row's repro script, the changed rows), releases (a
package's versions from the index or a wheelhouse), envs (overlay environments built with uv, cached
per package version), search (the bisect itself), results (``bisect.json`` beside ``sweep.json``).
"""
