"""Prometheus helpers of workbench.observe.metrics that need no server."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from workbench.observe.metrics import Sample, histogram_quantile

EXPOSITION = """# HELP vllm:nixl_xfer_time_seconds Histogram of transfer duration
# TYPE vllm:nixl_xfer_time_seconds histogram
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.001"} 3.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.01"} 6.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="1.0"} 8.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="10.0"} 10.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="+Inf"} 10.0
vllm:nixl_xfer_time_seconds_count{engine="0"} 10.0
vllm:nixl_xfer_time_seconds_sum{engine="0"} 12.5
"""


def _samples() -> list[Sample]:
    return [Sample(s.name, dict(s.labels), float(s.value))
            for fam in text_string_to_metric_families(EXPOSITION) for s in fam.samples]


def test_histogram_quantile_interpolates_like_prometheus():
    s, name = _samples(), "vllm:nixl_xfer_time_seconds"
    assert histogram_quantile(s, name, 0.3) == pytest.approx(0.001)
    assert histogram_quantile(s, name, 0.45) == pytest.approx(0.0055)
    assert histogram_quantile(s, name, 0.9) == pytest.approx(5.5)
    assert histogram_quantile(s, "absent", 0.5) is None
    with pytest.raises(ValueError):
        histogram_quantile(s, name, 1.5)
