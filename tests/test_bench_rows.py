"""bench's arithmetic over rows: the "x its tokens evaluated alone" figure (bench/workloads.py `alone_ratio`),
W2's side-by-side table (bench/__main__.py `w2_matrix`), and what a restart carries (bench/targets.py)."""
from bench import workloads
from bench.targets import carry_counters
from bench.__main__ import add_alone_ratios, w2_label, w2_matrix


def row(workload, target, evals):
    return {"workload": workload, "target": target, "returning_evals": evals}


def test_alone_ratio_sets_ttft_against_the_one_at_a_time_rate():
    # One at a time: 10 ms per token (the median of 8, 10 and 30 ms/token).
    alone = row("W1 one at a time", "kv", [[0.5, 50, 400.0], [0.5, 50, 500.0], [0.9, 30, 900.0]])
    # In flight: 50 tokens (0.5 s alone) answered after 1.0 s; 20 tokens (0.2 s alone) after 0.3 s; 40 after 1.2 s.
    busy = row("W1", "kv", [[1.0, 50, 1000.0], [0.3, 20, 300.0], [1.2, 40, 1200.0]])
    assert workloads.eval_ms_per_token(alone) == 10.0
    assert workloads.alone_ratio(busy, alone) == 2.0  # median of 2.0, 1.5 and 3.0


def test_rows_get_the_figure_only_with_their_own_targets_one_at_a_time_run():
    rows = [row("W1", "a", [[1.0, 10, 100.0]]), row("W1 one at a time", "a", [[0.1, 10, 50.0]]),
            row("W1", "b", [[1.0, 10, 100.0]]), row("W1 one at a time", "c", [[0.1, 10, 50.0]])]
    add_alone_ratios(rows)
    assert rows[0]["ttft_returning_over_alone_eval_p50"] == 20.0  # 1 s over 10 tokens at 5 ms
    assert "ttft_returning_over_alone_eval_p50" not in rows[1]  # the one-at-a-time row itself
    assert "ttft_returning_over_alone_eval_p50" not in rows[2]  # no run of its own target alone
    assert workloads.alone_ratio(row("W1", "x", []), rows[1]) is None


def test_w2_matrix_puts_each_variant_in_its_row_and_each_target_in_its_column():
    def w2(order, parents, naming, inflight, target, ratio):
        return {"workload": w2_label(order, parents, naming, inflight), "target": target, "ideal": 100,
                "ratio_to_ideal": ratio}

    rows = [w2("question-major", False, "article", 2, "plain", 3.5),
            w2("article-major", False, "question", 1, "plain", 1.0),
            w2("article-major", True, "question", 1, "kv", 1.04),
            w2("question-major", False, "article", 2, "kv", 1.0),
            {"workload": "W1", "target": "plain", "ideal": 7, "ratio_to_ideal": 2.0}]
    lines = w2_matrix(rows)
    assert "`ideal` 100 tokens" in lines[0]  # W1's ideal is not W2's
    assert lines[1] == ("| W2 row (order, what the state is named after, requests in flight) | plain | kv +parents "
                        "| kv |")
    # The polite client's row first, then by requests in flight; a variant a target did not run shows "-".
    assert lines[3] == "| article-major, name = question, 1 in flight | 1.000 | 1.040 | - |"
    assert lines[4] == "| question-major, name = article, 2 in flight | 3.500 | - | 1.000 |"
    assert len(lines) == 5
    assert w2_matrix(rows[:1]) == []  # one variant: nothing to set side by side


def test_a_restart_carries_counters_and_not_gauges():
    """W3 restarts its targets: counters add up over the restarts, a gauge (the store's bytes) is the live value
    (before, W3's `--max-size` rows summed the store's bytes before and after the restart: 111.2 MiB of objects
    reported under a 76.8 MiB cap that the disk kept)."""
    carried: dict = {}
    before = {"kvstore_store_bytes": 70.0, 'kvstore_evictions_total{reason="cap"}': 3.0,
              "kvstore_restore_seconds_count": 5.0}
    carry_counters(carried, before, {"kvstore_store_bytes", "kvstore_queue_length"})
    assert carried == {'kvstore_evictions_total{reason="cap"}': 3.0, "kvstore_restore_seconds_count": 5.0}
    carry_counters(carried, {'kvstore_evictions_total{reason="cap"}': 2.0}, {"kvstore_store_bytes"})
    assert carried['kvstore_evictions_total{reason="cap"}'] == 5.0
