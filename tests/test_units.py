"""One convention per unit, labelled right everywhere: sizes on disk and on the wire are decimal
(KB, MB, GB = 1e3, 1e6, 1e9 bytes, as the Hub and ``cache.max_gb`` count), memory is binary and
says so (MiB)."""

from __future__ import annotations

import re
import shutil

import pytest

from model_support.display import size_text
from model_support.errors import StorageFull
from model_support.probe import run
from model_support.record import schema
from model_support.sweep import budget, diskspace


def test_a_size_is_decimal_and_says_so():
    assert [size_text(n) for n in (999, 1000, 1_500_000, 10**9, 2**30, 16_100_000_000)] == [
        "999 bytes",
        "1 KB",
        "1.5 MB",
        "1 GB",
        "1.07 GB",
        "16.1 GB",
    ]


def test_the_room_check_and_the_cache_budget_count_a_gb_alike(tmp_path):
    """The data folder's free space is told in the same GB as the cache budget (1e9 bytes; it
    said 2^30)."""
    cache = budget.CacheBudget(str(tmp_path), max_gb=1)
    assert (
        cache.too_large_reason(10**9 + 10**7) == "too large for the cache budget: 1.01 GB > 1 GB."
    )
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(StorageFull) as refused:
        diskspace.check_room(tmp_path, probes=4 * free // diskspace.BYTES_PER_MODEL, report=False)
    said = re.search(r"has ([\d.]+) (GB|MB|KB) free", str(refused.value))
    told = float(said.group(1)) * {"GB": 1e9, "MB": 1e6, "KB": 1e3}[said.group(2)]
    assert abs(told - free) / free < 0.02, (str(refused.value), free)


def test_memory_is_labelled_mib_where_it_is_shown_and_declared():
    record = schema.empty_record(
        model_id="org/m", status="PASS", peak_host_mem_mb=512.0, peak_device_mem_mb=None
    )
    assert "512.000 MiB / -" in run.summary_html(record)
    docs = {f.name: f.doc for f in schema.DECLARATION}
    assert docs["peak_host_mem_mb"].endswith("in MiB") and docs["peak_device_mem_mb"].endswith(
        "in MiB"
    )
