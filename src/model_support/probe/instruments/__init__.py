"""What watches a probe's run while it runs (docs/design.md, "Where the numbers go wrong"): the
flight recorder (the last operators dispatched to the device, in a file that outlives the
process: a silent abort still names its operator) and the host cost (device-to-host syncs and CPU
fallbacks per decode token, from the adapter's own counters). Beside them the census
(``probe.census``). Nothing here imports torch at import time: the sweep's runner reads the
recorder's file."""
