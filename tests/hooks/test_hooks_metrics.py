"""The Prometheus text of /metrics (`Metrics.prometheus`), read back with prometheus_client's own parser: every
metric name users scrape, the cache kinds as labels, save/restore latency as histograms."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from kvstore.hooks.metrics import COUNTERS, KINDS, Metrics


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_metrics_text_parses_with_every_name_and_latency_histograms():
    m = Metrics()
    for kind in ("miss", "restored", "restored", "slot"):
        m.kind(kind)
    m.inc("restore_failures")
    m.inc("bytes_saved", 1234)
    m.timed("save", 0.02)
    m.timed("save", 3.0)
    m.timed("restore", 0.2)
    text = m.prometheus(queue_length=2, store={"stored_bytes": 4096, "names": 3})
    fams, vals = families(text), samples(text)

    assert {"kvstore_requests", "kvstore_hits", "kvstore_misses"} <= set(fams)
    assert all(fams[f"kvstore_{k}"].type == "counter" for k in COUNTERS)
    assert vals[("kvstore_requests_total", (("kind", "restored"),))] == 2
    assert vals[("kvstore_hits_total", (("kind", "slot"),))] == 1
    assert ("kvstore_hits_total", (("kind", "miss"),)) not in vals  # a miss is no hit
    assert vals[("kvstore_misses_total", ())] == 1
    assert {k for k in KINDS} == {dict(lab)["kind"] for (n, lab) in vals if n == "kvstore_requests_total"}
    assert vals[("kvstore_restore_failures_total", ())] == 1
    assert vals[("kvstore_bytes_saved_total", ())] == 1234
    assert vals[("kvstore_save_failures_total", ())] == 0

    for op, n, total in (("save", 2, 3.02), ("restore", 1, 0.2)):
        assert fams[f"kvstore_{op}_seconds"].type == "histogram"
        assert vals[(f"kvstore_{op}_seconds_count", ())] == n
        assert abs(vals[(f"kvstore_{op}_seconds_sum", ())] - total) < 1e-9
        assert vals[(f"kvstore_{op}_seconds_bucket", (("le", "+Inf"),))] == n
    assert vals[("kvstore_save_seconds_bucket", (("le", "0.025"),))] == 1  # 0.02 s, not 3 s
    assert vals[("kvstore_save_seconds_bucket", (("le", "5.0"),))] == 2

    assert fams["kvstore_queue_length"].type == "gauge" and vals[("kvstore_queue_length", ())] == 2
    assert vals[("kvstore_store_bytes", ())] == 4096 and vals[("kvstore_store_names", ())] == 3
    # /kvstore/stats keeps its counters as before
    snap = m.snapshot()
    assert snap["save_count"] == 2 and abs(snap["save_seconds"] - 3.02) < 1e-9 and snap["kinds"]["restored"] == 2


def test_metrics_without_store_leave_its_gauges_out():
    text = Metrics().prometheus(queue_length=0, store=None)
    names = set(families(text))
    assert "kvstore_store_bytes" not in names and "kvstore_queue_length" in names
    assert samples(text)[("kvstore_save_seconds_count", ())] == 0
