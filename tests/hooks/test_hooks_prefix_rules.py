"""The SWA cut's decisions in kvstore/hooks/cut.py, as plain logic (the real-server paths are in
test_hooks_swa_prefix.py, test_hooks_articles.py and test_prefix_resume.py)."""
from __future__ import annotations


from kvstore.hooks.cut import Candidate, applies, best, cut_point, end_cut


def test_applies_only_to_attention_only_swa_layouts():
    assert applies({"n_swa": "512"}, None)  # layout not learned yet: the store refuses a recurrent state itself
    assert applies({"n_swa": "512"}, "kv[18:f16/1024,f16/1024*18;vt0;rot0,0;ext0]+kv[6:f16/1024,f16/1024*6;vt0;rot0,0;ext0]")
    assert not applies({}, None)
    assert not applies({"n_swa": "0"}, None)
    assert not applies({"n_swa": "512"}, "kv[2:f16/512,f16/512*2;vt0;rot0,0;ext0]+rec[4:f32/512*2;f32/0*2]")


def test_cut_point_stays_inside_the_state_and_short_of_the_prompt_end():
    c = Candidate("prefix", "a", None, n_tokens=100, n_common=80)
    assert cut_point(c, 120) == 80
    assert cut_point(Candidate("parent", "p", None, n_tokens=100, n_common=100), 120) == 100  # its end
    # a prompt that is a prefix of the state: llama-server evaluates its last token itself
    assert cut_point(Candidate("prefix", "a", None, n_tokens=100, n_common=60), 60) == 59


def test_best_prefers_the_longest_common_prefix_then_own_parent_prefix():
    own = Candidate("restored", "n", None, 90, 70)
    par = Candidate("parent", "p", None, 70, 70)
    other = Candidate("prefix", None, "m", 200, 71)
    assert best([own, par, other], 32) is other
    assert best([own, par], 32) is own
    assert best([Candidate("prefix", None, "m", 200, 20)], 32) is None  # under one block


def test_end_cut_is_where_plan_cuts_a_returning_users_own_state():
    """What the wait prefetches with `--resume-at end` (broker._prefetch) must be the cut `plan` then restores."""
    assert end_cut(100, 130, 32) == 100  # the whole state, a checkpoint at its end
    assert end_cut(100, 100, 32) == 99  # the prompt is the state: llama-server evaluates its last token itself
    assert end_cut(20, 40, 32) is None  # under one block: `best` takes no such candidate, it is restored whole


def test_fork_point_is_stored_only_two_blocks_in_a_block_past_what_is_served_whole():
    from kvstore.hooks import fork

    assert fork.applies("kv[2:f16/512,f16/512*2;vt0;rot0,0;ext0]+rec[4:f32/512*2;f32/0*2]")
    assert fork.applies("rec[3:f32/1920*3;f32/8192*3]")
    assert not fork.applies("kv[18:f16/1024,f16/1024*18;vt0;rot0,0;ext0]") and not fork.applies(None)
    # An article of 84 tokens shared with the stored question, nothing stored whole: store at the fork.
    assert fork.point(n_prompt=96, shared=84, whole=0, block_size=32) == 84
    # The state at the fork is stored: the next question leaving a few tokens past it is served by it.
    assert fork.point(n_prompt=95, shared=87, whole=84, block_size=32) is None
    assert fork.point(n_prompt=200, shared=150, whole=84, block_size=32) == 150
    # Too little shared to be worth a save; never at the prompt's end (llama-server evaluates its last token).
    assert fork.point(n_prompt=96, shared=63, whole=0, block_size=32) is None
    assert fork.point(n_prompt=84, shared=84, whole=0, block_size=32) == 83
    # A name's first prompt (nothing stored to leave): a block before its end, where the next question on the same
    # article (its own tail under a block) still extends it; not for a prompt too short, nor a block from what is
    # served whole already.
    assert fork.guess(n_prompt=260, served=0, block_size=32) == 227
    assert fork.guess(n_prompt=96, served=0, block_size=32) is None
    assert fork.guess(n_prompt=260, served=200, block_size=32) is None
    assert fork.guess(n_prompt=300, served=200, block_size=32) == 267
    # The name is the prefix's: the same tokens, the same name; others, another.
    assert fork.name([1, 2, 3]) == fork.name([1, 2, 3]) != fork.name([1, 2, 4])
    assert fork.name([1, 2, 3]).startswith(fork.PREFIX)
