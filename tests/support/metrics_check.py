"""A scrape checked by both Prometheus exposition parsers."""

from __future__ import annotations

import httpx


def metric_families(url: str) -> dict:
    """``/metrics`` parsed by both Prometheus parsers: the text format 0.0.4 by default and
    OpenMetrics when asked for; each family appears once, with HELP, in both."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
    from prometheus_client.parser import text_string_to_metric_families as text_parse

    text = httpx.get(url + "/metrics").text
    om = httpx.get(url + "/metrics", headers={"accept": "application/openmetrics-text"}).text
    assert om.rstrip().endswith("# EOF")
    fams = {f.name: f for f in text_parse(text)}
    om_fams = {f.name: f for f in om_parse(om)}
    assert set(om_fams) == set(fams) and all(f.documentation for f in fams.values())
    assert text.count("# TYPE ") == len(fams)
    return om_fams
