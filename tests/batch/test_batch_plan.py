"""The batch planner's rule (kvstore/batch/plan.py) as plain logic: which shared prefixes it primes, their exact
tokens, the send order, and the ideal, on seeded synthetic token lists (the real-server runs are in test_batch.py)."""
from __future__ import annotations

import random

from kvstore.batch.plan import CHUNK, Planner


def brute_ideal(prompts):
    seen = set()
    for p in prompts:
        for k in range(1, len(p) + 1):
            seen.add(tuple(p[:k]))
    return len(seen)


def test_articles_times_questions_one_prefix_per_article_any_order():
    rng = random.Random(7)
    system = [rng.randrange(50_000) for _ in range(40)]
    articles = [[rng.randrange(50_000) for _ in range(rng.randrange(200, 400))] for _ in range(6)]
    questions = [[9, 9] + [rng.randrange(50_000) for _ in range(rng.randrange(5, 30))] for _ in range(5)]
    reqs = [(a, q) for a in range(6) for q in range(5)]
    rng.shuffle(reqs)
    prompts = [system + articles[a] + questions[q] for a, q in reqs]
    planner = Planner(min_saving=128)
    for p in prompts:
        planner.add(p)
    plan = planner.finish()
    # One prefix per article (the system prompt alone saves 40 x 29 tokens too: it is the articles' parent).
    inner = {id(plan.of[i]) for i in range(len(reqs))}
    assert len(inner) == 6, [p.depth for p in plan.prefixes]
    for i, (a, q) in enumerate(reqs):
        node = plan.of[i]
        # exactly the article's common part: the system prompt, the article and the questions' shared [9, 9]
        assert list(node.tokens) == system + articles[a] + [9, 9]
        assert node.n_requests == 5
        outer = node.parent
        assert outer is not None and list(outer.tokens) == system and outer.parent is None
    # Requests of one article are sent one after another.
    order = [reqs[i][0] for i in plan.order]
    assert all(order[k] == order[k - 1] for k in range(1, len(order)) if k % 5), order
    assert plan.ideal == brute_ideal(prompts)
    assert plan.prompt_tokens == sum(map(len, prompts))
    planner.close()


def test_nothing_shared_means_no_prefix_and_input_order():
    rng = random.Random(3)
    prompts = [[i] + [rng.randrange(50_000) for _ in range(100)] for i in range(10)]
    planner = Planner()
    for p in prompts:
        planner.add(p)
    plan = planner.finish()
    assert plan.prefixes == [] and plan.of == [None] * 10
    assert plan.order == list(range(10))
    assert plan.ideal == brute_ideal(prompts)


def test_small_savings_are_not_primed():
    """Two requests sharing 3 blocks save 48 tokens: below min_saving, so no prime (a prime costs a save and a
    restore); with min_saving 32 they get one."""
    shared = list(range(3 * CHUNK))
    prompts = [shared + [1, 2, 3], shared + [4, 5, 6]]
    for min_saving, expect in ((128, 0), (32, 1)):
        planner = Planner(min_saving=min_saving)
        for p in prompts:
            planner.add(p)
        plan = planner.finish()
        assert len(plan.prefixes) == expect
        if expect:
            assert list(plan.prefixes[0].tokens) == shared


def test_ideal_matches_brute_force_on_random_tries():
    rng = random.Random(11)
    for _ in range(20):
        base = [[rng.randrange(5) for _ in range(rng.randrange(0, 40))] for _ in range(4)]
        prompts = [rng.choice(base) + [rng.randrange(5) for _ in range(rng.randrange(1, 20))] for _ in range(15)]
        planner = Planner(min_saving=1)
        for p in prompts:
            planner.add(p)
        plan = planner.finish()
        assert plan.ideal == brute_ideal(prompts)
        for i, p in enumerate(prompts):  # every prefix a request carries is a prefix of its prompt
            node = plan.of[i]
            while node is not None:
                assert p[:len(node.tokens)] == list(node.tokens)
                node = node.parent
