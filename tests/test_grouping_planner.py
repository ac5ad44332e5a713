"""The layer-grouping planner (jax_sparse_sync.model.grouping): pure Python.

Hand-worked cases use a = 1 ms, b = 1 us/byte and one byte per entry, so
1000 entries take 1 ms on the wire alone; times in the comments are in ms.
"""

from __future__ import annotations

import json
import random
import time

import pytest

from jax_sparse_sync.model import grouping as gp

MS = 1e-3
A, B = 1e-3, 1e-6


def one_byte(n):
    return float(n)


def layers_of(ready_ms, entries, compute_ms=None, leaves=None, names=()):
    n = len(ready_ms)
    return gp.LayerTimes(
        leaves=tuple(leaves if leaves is not None else range(10, 10 + n)),
        ready_s=tuple(r * MS for r in ready_ms), entries=tuple(entries),
        dense_bytes=tuple(4 * e for e in entries),
        compute_s=(compute_ms if compute_ms is not None else ready_ms[-1]) * MS, names=names)


def ms(values):
    return [v / MS for v in values]


def alg1_types(layers, link, message_bytes=one_byte, local_s=lambda n: 0.0):
    return gp._algorithm1(gp._Model(layers, link, message_bytes, local_s))[1]


def kinds(p):
    return [g.kind for g in p.groups]


# --- Algorithm 1: the conditions Q1..Q4 on hand-worked timelines -------------------------------


def test_q1_normal():
    # Leaf 10 ready at 0, 1000 B: wire 0..2 (a + b m). Leaf 11 ready at 3.
    # Q1: tau_c + t_c = 0 + 2 <= 3 -> normal; leaf 11 starts at 3, ends 5.
    layers = layers_of([0, 3], [1000, 1000])
    link = gp.Link(a=A, b=B, gamma=1.5)
    assert alg1_types(layers, link) == ["normal", "simultaneous"]  # the last: s[1] = l_s
    p = gp.plan("asc", layers, link, one_byte)
    assert p.leaf_groups() == ((10,), (11,))
    # the last group found nothing in flight: relabelled normal (same timeline)
    assert kinds(p) == ["normal", "normal"]
    assert ms([g.end_s for g in p.groups]) == pytest.approx([2.0, 5.0])
    assert p.predicted_s == pytest.approx(5 * MS)


def test_q2_merge_with_one_stream():
    # max_concurrent = 1 (one stream: simultaneous == normal).
    # Leaf 10 ready 0 (1000 B), leaf 11 ready 0.5 (1000 B).
    # Leaf 10 alone: wire 0..2. Q1: 2 <= 0.5 false. Q2: 0.5 < 0 + a = 1 true.
    # Q3 (simultaneous at 0): 0 + 2 < 0.5 false. Q4: tau_c = 0 < 0.5 true -> merged.
    # Merged group: ready 0.5, wire 0.5 .. 0.5 + 1 + 2 = 3.5.  WFBP: 0..2, 2..4 -> 4.
    layers = layers_of([0, 0.5], [1000, 1000])
    link = gp.Link(a=A, b=B, gamma=1.5, max_concurrent=1)
    assert alg1_types(layers, link) == ["merged", "normal"]
    p = gp.plan("asc", layers, link, one_byte)
    assert p.leaf_groups() == ((10, 11),) and kinds(p) == ["normal"]
    g = p.groups[0]
    assert g.entries == 2000 and g.message_bytes == 2000.0
    assert ms([g.ready_s, g.start_s, g.end_s]) == pytest.approx([0.5, 0.5, 3.5])
    assert p.predicted_s == pytest.approx(3.5 * MS)
    assert gp.plan("mg", layers, link, one_byte).leaf_groups() == ((10, 11),)
    assert gp.plan("wfbp", layers, link, one_byte).predicted_s == pytest.approx(4 * MS)


def test_q2_merge_beaten_by_simultaneous_pair_in_the_simulator():
    # The same leaves on two streams: Algorithm 1 still says merge (3.5), but the
    # simulator finds the simultaneous pair faster, since the second startup overlaps
    # the first transfer: op10 startup 0..1, op11 startup 0.5..1.5; op10 alone 1..1.5
    # (0.5 of its 1 ms of bytes); both at 1.5x from 1.5: op10's 0.5 left ends at
    # 1.5 + 0.75 = 2.25, op11 has done 0.5 by then and ends alone at 2.75.
    layers = layers_of([0, 0.5], [1000, 1000])
    link = gp.Link(a=A, b=B, gamma=1.5, max_concurrent=2)
    assert alg1_types(layers, link) == ["merged", "normal"]
    p = gp.plan("asc", layers, link, one_byte)
    assert p.leaf_groups() == ((10,), (11,)) and kinds(p) == ["normal", "simultaneous"]
    assert ms([g.end_s for g in p.groups]) == pytest.approx([2.25, 2.75])
    assert p.predicted_s == pytest.approx(2.75 * MS)


def test_q3_simultaneous_pair_hidden_by_the_next_backward():
    # Leaf 10 ready 0, 3000 B; leaf 11 ready 1, 500 B; leaf 12 ready 4.5, 1000 B.
    # Leaf 10: wire 0..4; Q1: 4 <= 1 false; Q2: 1 < 0 + 1 false -> (simultaneous,
    # but it is the first group: normal).
    # Leaf 11 as normal waits: wire 4..5.5. Q1: 5.5 <= 4.5 false; Q2: 4.5 < 4 + 1 true;
    # Q3: started at its ready time 1 with the penalty of eq. 13,
    # (1.5 - 1) * 3 * (1 - (1 - 0) / 4) = 1.125: 1 + 1 + 0.5 + 1.125 = 3.625 < 4.5 true
    # -> simultaneous.
    # Simulated: op10 startup 0..1, alone 1..2 (1 of 3 done); op11 startup 1..2;
    # both at 1.5x from 2: op11's 0.5 ends at 2.75, op10 has 1.5 left, ends 4.25 < 4.5:
    # the pair is hidden. Leaf 12: 4.5 .. 4.5 + 1 + 1 = 6.5.
    # MG merges 11 into 12 (4.5 < 4 + 1): 4.5 .. 7; WFBP: 4..5.5, 5.5..7.5.
    layers = layers_of([0, 1, 4.5], [3000, 500, 1000])
    link = gp.Link(a=A, b=B, gamma=1.5)
    assert alg1_types(layers, link) == ["normal", "simultaneous", "simultaneous"]
    p = gp.plan("asc", layers, link, one_byte)
    assert p.leaf_groups() == ((10,), (11,), (12,))
    assert kinds(p) == ["normal", "simultaneous", "normal"]
    assert ms([g.start_s for g in p.groups]) == pytest.approx([0, 1, 4.5])
    assert ms([g.end_s for g in p.groups]) == pytest.approx([4.25, 2.75, 6.5])
    assert p.predicted_s == pytest.approx(6.5 * MS)
    mg = gp.plan("mg", layers, link, one_byte)
    assert mg.leaf_groups() == ((10,), (11, 12)) and mg.predicted_s == pytest.approx(7 * MS)
    assert gp.plan("wfbp", layers, link, one_byte).predicted_s == pytest.approx(7.5 * MS)


def test_q4_false_both_ready_when_the_link_frees():
    # One stream. Leaf 10 ready 0, 2000 B: wire 0..3. Leaf 11 ready 1, leaf 12 ready 2
    # (1000 B each). Leaf 10: Q1 3 <= 1 false, Q2 1 < 1 false -> first group, normal.
    # Leaf 11 waits: wire 3..5. Q1: 5 <= 2 false; Q2: 2 < 3 + 1 true; Q3 (one stream:
    # starts at 3 anyway) 3 + 2 < 2 false -> merged; Q4: tau_c = 3 < 2 false: both are
    # ready when the link frees (eq. 34-36, still MG). Group (11, 12): 3 .. 3 + 1 + 2 = 6.
    # WFBP: 3..5, 5..7.
    layers = layers_of([0, 1, 2], [2000, 1000, 1000])
    link = gp.Link(a=A, b=B, gamma=1.5, max_concurrent=1)
    assert alg1_types(layers, link) == ["normal", "merged", "simultaneous"]
    p = gp.plan("asc", layers, link, one_byte)
    assert p.leaf_groups() == ((10,), (11, 12)) and kinds(p) == ["normal", "normal"]
    assert ms([g.start_s for g in p.groups]) == pytest.approx([0, 3])
    assert ms([g.end_s for g in p.groups]) == pytest.approx([3, 6])
    assert p.predicted_s == pytest.approx(6 * MS)
    assert gp.plan("wfbp", layers, link, one_byte).predicted_s == pytest.approx(7 * MS)


# --- simulate -----------------------------------------------------------------------------------


def test_two_simultaneous_equal_messages_share_the_link():
    layers = layers_of([0, 0], [1000, 1000])
    link = gp.Link(a=A, b=B, gamma=1.5)
    p = gp.simulate(layers, [((10,), "normal"), ((11,), "simultaneous")], link, one_byte)
    m = 1000
    for g in p.groups:
        assert g.start_s == 0.0
        assert g.end_s == pytest.approx(A + 1.5 * B * m)
    assert p.predicted_s == pytest.approx(A + 1.5 * B * m)
    assert p.method == "custom"


def test_normal_group_waits_for_the_previous():
    layers = layers_of([0, 0], [1000, 2000])
    p = gp.simulate(layers, [((10,), "normal"), ((11,), "normal")],
                    gp.Link(a=A, b=B, gamma=1.5), one_byte)
    assert ms([g.start_s for g in p.groups]) == pytest.approx([0, 2])
    assert ms([g.end_s for g in p.groups]) == pytest.approx([2, 5])


def test_three_simultaneous_groups_contend_as_slowdown_n():
    # Three at once with max_concurrent = 3, gamma = 1.5: slowdown(3) = 2.
    layers = layers_of([0, 0, 0], [1000, 1000, 1000])
    link = gp.Link(a=A, b=B, gamma=1.5, max_concurrent=3)
    assert link.slowdown(3) == 2.0
    p = gp.simulate(layers, [((10,), "normal"), ((11,), "simultaneous"),
                             ((12,), "simultaneous")], link, one_byte)
    assert ms([g.end_s for g in p.groups]) == pytest.approx([3, 3, 3])


def test_a_burst_passes_at_once_on_a_link_idle_long_enough():
    # burst_s = 4 ms of bytes; the link is idle from the step's start (a full bucket).
    # One group of 10 ms of bytes ready at 5: 5 + a 1 + (10 - 4) = 12 (16 without).
    layers = layers_of([5], [10000])
    assert gp.simulate(layers, [((10,), "normal")], gp.Link(a=A, b=B, burst_s=4 * MS),
                       one_byte).predicted_s == pytest.approx(12 * MS)
    assert gp.simulate(layers, [((10,), "normal")], gp.Link(a=A, b=B),
                       one_byte).predicted_s == pytest.approx(16 * MS)
    # A message smaller than the bucket costs its startup alone.
    small = gp.simulate(layers_of([5], [3000]), [((10,), "normal")],
                        gp.Link(a=A, b=B, burst_s=4 * MS), one_byte)
    assert small.predicted_s == pytest.approx(6 * MS)


@pytest.mark.parametrize("second_ready_ms,second_end_ms", [
    (8, 17),    # idle 7 -> 8 (the link freed at 7): 1 ms of bytes refilled; 8 + 1 + (9 - 1)
    (20, 26),   # idle 7 -> 20: the bucket full again (4 ms); 20 + 1 + (9 - 4)
    (2, 17),    # ready while the first is on the wire: starts as it ends, at 7, no credit
])
def test_the_bucket_refills_only_while_the_link_is_idle(second_ready_ms, second_end_ms):
    # First group: ready at 0, 10 ms of bytes, 4 of them at once: ends at 0 + 1 + 6 = 7.
    # Second group: 9 ms of bytes (9000 entries; its message = its entries), normal.
    layers = layers_of([0, second_ready_ms], [10000, 9000])
    p = gp.simulate(layers, [((10,), "normal"), ((11,), "normal")],
                    gp.Link(a=A, b=B, burst_s=4 * MS), one_byte)
    assert ms([g.end_s for g in p.groups]) == pytest.approx([7, second_end_ms])


def test_a_group_started_beside_another_gets_no_burst():
    # Two simultaneous groups at 0 (gamma 1.5): the first drains the bucket (4 ms of its
    # 10), so it holds 6 ms of bytes, the second 10. Both in their byte phase from 1 ms:
    # each at 1.5x, the first ends at 1 + 9 = 10; the second has 10 - 6 = 4 left, alone:
    # 14.
    layers = layers_of([0, 0], [10000, 10000])
    p = gp.simulate(layers, [((10,), "normal"), ((11,), "simultaneous")],
                    gp.Link(a=A, b=B, gamma=1.5, burst_s=4 * MS), one_byte)
    assert ms([g.end_s for g in p.groups]) == pytest.approx([10, 14])


def test_local_work_shifts_later_readiness():
    # 0.5 ms of local work per group, serial with the backward pass.
    # Group 10: ready 1 + 0.5 = 1.5; leaf 11's gradient (2) moves to 2.5, plus its own
    # local work: 3.0; the backward pass ends at 4 + 1 = 5.
    layers = layers_of([1, 2], [1000, 1000], compute_ms=4)
    link = gp.Link(a=A, b=B)
    p = gp.simulate(layers, [((10,), "normal"), ((11,), "normal")], link, one_byte,
                    local_s=lambda n: 0.5 * MS)
    assert ms([g.ready_s for g in p.groups]) == pytest.approx([1.5, 3.0])
    assert ms([g.start_s for g in p.groups]) == pytest.approx([1.5, 3.5])  # waits for 10
    assert ms([g.end_s for g in p.groups]) == pytest.approx([3.5, 5.5])
    assert p.predicted_s == pytest.approx(5.5 * MS)
    assert p.compute_s == pytest.approx(4 * MS)
    # Fused: one local step of 0.5: ready 2.5, wire 2.5..5.5; backward ends 4.5.
    fused = gp.simulate(layers, [((10, 11), "normal")], link, one_byte,
                        local_s=lambda n: 0.5 * MS)
    assert ms([fused.groups[0].ready_s, fused.groups[0].end_s]) == pytest.approx([2.5, 5.5])
    # predicted_s covers the backward pass when the wire ends first
    short = gp.simulate(layers_of([1, 2], [10, 10], compute_ms=20),
                        [((10,), "normal"), ((11,), "normal")], link, one_byte,
                        local_s=lambda n: 0.5 * MS)
    assert short.predicted_s == pytest.approx(21 * MS)


def test_max_concurrent_one_serialises_simultaneous_groups():
    layers = layers_of([0, 0, 0], [1000, 1000, 1000])
    groups = [((10,), "normal"), ((11,), "simultaneous"), ((12,), "simultaneous")]
    p = gp.simulate(layers, groups, gp.Link(a=A, b=B, gamma=1.5, max_concurrent=1), one_byte)
    assert ms([g.start_s for g in p.groups]) == pytest.approx([0, 2, 4])
    assert ms([g.end_s for g in p.groups]) == pytest.approx([2, 4, 6])
    # Two streams: the third waits for a slot (the first two end together at 2.5).
    p2 = gp.simulate(layers, groups, gp.Link(a=A, b=B, gamma=1.5, max_concurrent=2), one_byte)
    assert ms([g.start_s for g in p2.groups]) == pytest.approx([0, 0, 2.5])
    assert ms([g.end_s for g in p2.groups]) == pytest.approx([2.5, 2.5, 4.5])


def test_a_later_group_waits_for_the_oldest_in_flight():
    # Two streams; 10 (3000 B) and 11 (100 B) start at 0, 12 (1000 B) is ready at 0 too.
    # Startups 0..1; both at 1.5x: 11's 0.1 ms ends at 1.15, 10 has done 0.1 and ends
    # alone at 1.15 + 2.9 = 4.05. 12 waits for the OLDEST (10), not for 11: 4.05 .. 6.05.
    layers = layers_of([0, 0, 0], [3000, 100, 1000])
    p = gp.simulate(layers, [((10,), "normal"), ((11,), "simultaneous"),
                             ((12,), "simultaneous")],
                    gp.Link(a=A, b=B, gamma=1.5, max_concurrent=2), one_byte)
    assert ms([g.start_s for g in p.groups]) == pytest.approx([0, 0, 4.05])
    assert ms([g.end_s for g in p.groups]) == pytest.approx([4.05, 1.15, 6.05])


def test_numpy_scalars_are_accepted():
    np = pytest.importorskip("numpy")
    layers = gp.LayerTimes(leaves=(np.int64(1), np.int64(0)),
                           ready_s=(np.float32(0.0), np.float32(0.0005)),
                           entries=(np.int64(1000), np.int32(1000)),
                           dense_bytes=(np.int64(4000), np.int64(4000)),
                           compute_s=np.float64(0.001))
    assert all(type(e) is int for e in layers.entries)
    assert all(type(r) is float for r in layers.ready_s)
    link = gp.Link(a=np.float32(1e-3), b=np.float64(1e-6), max_concurrent=np.int64(2))
    assert type(link.max_concurrent) is int and type(link.a) is float
    p = gp.plan("asc", layers, link, lambda n: np.float64(n))
    assert json.loads(json.dumps(p.to_json()))["groups"]


def test_startup_is_not_contended():
    # op10 ready 0 (2000 B), op11 ready 1.5 (1000 B), gamma 2: op11's startup 1.5..2.5
    # runs while op10 transfers alone (1..2.5 -> 1.5 of 2 done); then both at 2x:
    # op10's 0.5 left ends at 3.5, op11 has done 0.5 by then and ends alone at 4.
    layers = layers_of([0, 1.5], [2000, 1000])
    p = gp.simulate(layers, [((10,), "normal"), ((11,), "simultaneous")],
                    gp.Link(a=A, b=B, gamma=2.0), one_byte)
    assert ms([g.end_s for g in p.groups]) == pytest.approx([3.5, 4.0])


def test_first_group_is_normal_and_empty_messages_take_the_startup():
    layers = layers_of([0, 0], [0, 1000])
    p = gp.simulate(layers, [((10,), "simultaneous"), ((11,), "normal")],
                    gp.Link(a=A, b=B), one_byte)
    assert kinds(p) == ["normal", "normal"]
    assert ms([g.end_s for g in p.groups]) == pytest.approx([1, 3])


def test_message_bytes_is_the_callers_compressed_size():
    layers = layers_of([0, 1], [1000, 3000])
    sparse = lambda n: 56 + 8 * (n // 100)  # noqa: E731  1% density, 8 B/entry, header
    p = gp.simulate(layers, [((10, 11), "normal")], gp.Link(a=A, b=B), sparse)
    assert p.groups[0].message_bytes == 56 + 8 * 40
    assert p.groups[0].end_s == pytest.approx(1 * MS + A + B * (56 + 320))


@pytest.mark.parametrize("groups, match", [
    ([((11,), "normal"), ((10,), "normal")], "groups"),
    ([((10,), "normal")], "groups"),
    ([((10,), "normal"), ((11,), "normal"), ((11,), "normal")], "groups"),
    ([((10, 11), "merged")], "kind"),
    ([((), "normal"), ((10, 11), "normal")], "empty"),
    ([(10, "normal")], "groups"),
])
def test_simulate_rejects_bad_groups(groups, match):
    with pytest.raises(ValueError, match=match):
        gp.simulate(layers_of([0, 1], [1, 1]), groups, gp.Link(a=A, b=B), one_byte)


def test_bad_inputs_name_the_field():
    for kwargs, field in [(dict(a=-1.0, b=B), "Link.a"), (dict(a=A, b=-1.0), "Link.b"),
                          (dict(a=A, b=B, gamma=0.9), "Link.gamma"),
                          (dict(a=A, b=B, max_concurrent=0), "Link.max_concurrent"),
                          (dict(a=float("nan"), b=B), "Link.a"),
                          (dict(a=A, b=B, burst_s=-1e-3), "Link.burst_s"),
                          (dict(a=A, b=B, burst_s=float("inf")), "Link.burst_s")]:
        with pytest.raises(ValueError, match=field):
            gp.Link(**kwargs)
    with pytest.raises(ValueError) as err:
        gp.plan("horovod", layers_of([0], [1]), gp.Link(a=A, b=B), one_byte)
    assert all(m in str(err.value) for m in gp.GROUPINGS)
    with pytest.raises(ValueError, match="ready_s"):
        layers_of([2, 1], [1, 1])
    with pytest.raises(ValueError, match="compute_s"):
        layers_of([0, 2], [1, 1], compute_ms=1)
    with pytest.raises(ValueError, match="entries"):
        gp.LayerTimes((0, 1), (0.0, 0.0), (1,), (4, 4), 0.0)
    with pytest.raises(ValueError, match="leaves"):
        gp.LayerTimes((0, 0), (0.0, 0.0), (1, 1), (4, 4), 0.0)
    with pytest.raises(ValueError, match="bucket_mb"):
        gp.plan("bucket", layers_of([0], [1]), gp.Link(a=A, b=B), one_byte, bucket_mb=0)
    with pytest.raises(ValueError, match="message_bytes"):
        gp.plan("wfbp", layers_of([0], [1]), gp.Link(a=A, b=B), lambda n: -1.0)


# --- the baselines ------------------------------------------------------------------------------


def test_none_wfbp_bucket_shapes():
    mib = 2 ** 20
    dense = (10 * mib, 10 * mib, 10 * mib, 30 * mib, 5 * mib, 5 * mib)
    layers = gp.LayerTimes(leaves=(5, 4, 3, 2, 1, 0), ready_s=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5),
                           entries=tuple(d // 4 for d in dense), dense_bytes=dense,
                           compute_s=0.6)
    link = gp.Link(a=A, b=1e-9)
    none = gp.plan("none", layers, link, one_byte)
    assert none.leaf_groups() == ((5, 4, 3, 2, 1, 0),) and kinds(none) == ["normal"]
    assert none.groups[0].start_s == pytest.approx(0.5)  # after the last gradient
    wfbp = gp.plan("wfbp", layers, link, one_byte)
    assert wfbp.leaf_groups() == tuple((x,) for x in layers.leaves)
    assert set(kinds(wfbp)) == {"normal"}
    bucket = gp.plan("bucket", layers, link, one_byte, bucket_mb=25)
    # 10+10 | 10 (+30 > 25) | 30 alone (bigger than a bucket) | 5+5
    assert bucket.leaf_groups() == ((5, 4), (3,), (2,), (1, 0))
    by_id = dict(zip(layers.leaves, dense))
    for g in bucket.groups:
        assert len(g.leaves) == 1 or sum(by_id[x] for x in g.leaves) <= 25 * mib
    assert set(kinds(bucket)) == {"normal"}
    assert len(gp.plan("bucket", layers, link, one_byte, bucket_mb=1000).groups) == 1


def test_mg_merges_by_the_merge_rule():
    # Leaves ready every 0.2 ms, startup 1 ms: each next leaf is ready before the
    # current group's startup would end, so MG fuses everything; with leaves 5 ms
    # apart nothing is merged.
    link = gp.Link(a=A, b=B)
    close = layers_of([0, 0.2, 0.4, 0.6], [100] * 4)
    assert gp.plan("mg", close, link, one_byte).leaf_groups() == ((10, 11, 12, 13),)
    far = layers_of([0, 5, 10, 15], [100] * 4)
    assert len(gp.plan("mg", far, link, one_byte).groups) == 4


def test_empty_layers():
    layers = gp.LayerTimes((), (), (), (), 0.01)
    for method in gp.GROUPINGS:
        p = gp.plan(method, layers, gp.Link(a=A, b=B), one_byte)
        assert p.groups == () and p.predicted_s == 0.01


# --- properties ---------------------------------------------------------------------------------


def random_instance(rng, max_leaves=12):
    n = rng.randint(1, max_leaves)
    ready = sorted(rng.uniform(0, 10 * MS) for _ in range(n))
    if rng.random() < 0.3:  # bursts of leaves ready together
        ready = sorted(round(r, 3) for r in ready)
    entries = [rng.choice([1, 50, 1000, 5000, 20000]) for _ in range(n)]
    leaves = list(range(n))
    rng.shuffle(leaves)
    layers = gp.LayerTimes(tuple(leaves), tuple(ready), tuple(entries),
                           tuple(4 * e for e in entries), ready[-1] + rng.uniform(0, 2 * MS))
    link = gp.Link(a=rng.choice([0.0, 1e-5, 1e-4, 1e-3]), b=rng.choice([0.0, 1e-8, 1e-7, 1e-6]),
                   gamma=rng.uniform(1.0, 2.0), max_concurrent=rng.choice([1, 2, 2, 3]),
                   burst_s=rng.choice([0.0, 0.0, 5e-4, 3e-3]))
    header, per_entry = rng.choice([0, 56]), rng.choice([4, 8])
    message_bytes = lambda n: header + per_entry * n  # noqa: E731
    fixed, per = rng.choice([(0.0, 0.0), (2e-5, 1e-9), (0.0, 1e-8)])
    local_s = lambda n: fixed + per * n  # noqa: E731
    return layers, link, message_bytes, local_s


def test_random_instances_asc_never_slower_and_plans_cover_every_leaf():
    rng = random.Random(1234)
    for _ in range(200):
        layers, link, message_bytes, local_s = random_instance(rng)
        plans = {m: gp.plan(m, layers, link, message_bytes, local_s, bucket_mb=0.01)
                 for m in gp.GROUPINGS}
        for method, p in plans.items():
            assert p.method == method
            flat = tuple(x for g in p.leaf_groups() for x in g)
            assert flat == layers.leaves, method  # every leaf once, in backward order
            assert all(g.leaves for g in p.groups)
            assert p.predicted_s >= layers.compute_s
            assert p.predicted_s >= max(g.end_s for g in p.groups)
            for g in p.groups:
                assert g.start_s >= g.ready_s and g.end_s >= g.start_s + link.a - 1e-15
            assert p.groups[0].kind == "normal"
            if method != "asc":
                assert set(kinds(p)) == {"normal"}
            # the plan is what simulate predicts for its groups
            again = gp.simulate(layers, [(g.leaves, g.kind) for g in p.groups], link,
                                message_bytes, local_s, method=method)
            assert again == p
        best_other = min(p.predicted_s for m, p in plans.items() if m != "asc")
        assert plans["asc"].predicted_s <= min(plans["mg"].predicted_s,
                                               plans["wfbp"].predicted_s) + 1e-12
        assert plans["asc"].predicted_s <= best_other + 1e-12


def test_resumed_simulation_equals_a_fresh_one():
    # The planners resume simulations from a snapshot and stop once the state
    # matches the base plan's: the result must be bit for bit a fresh simulation's.
    rng = random.Random(7)
    for _ in range(100):
        layers, link, message_bytes, local_s = random_instance(rng, max_leaves=20)
        model = gp._Model(layers, link, message_bytes, local_s)
        n = len(layers.leaves)
        his = sorted(rng.sample(range(1, n), rng.randint(0, n - 1))) + [n]
        kinds_ = [0] + [rng.randint(0, 1) for _ in his[1:]]
        base = gp._evaluate(model, his, kinds_)
        for g in range(1, len(his)):
            flipped = kinds_[:g] + [1 - kinds_[g]] + kinds_[g + 1:]
            cands = [(his, flipped, g + 1)]
            if g + 1 < len(his):
                cands.append((his[:g] + his[g + 1:], kinds_[:g] + kinds_[g + 1:], g + 1))
            lo = his[g - 1]
            if his[g] - lo > 1:
                cut = rng.randint(lo + 1, his[g] - 1)
                cands.append((his[:g] + [cut] + his[g:], kinds_[:g + 1] + [1] + kinds_[g + 1:],
                              g + 2))
            for h, k, sync in cands:
                resumed = gp._evaluate(model, h, k, base, g, sync)
                fresh = gp._evaluate(model, h, k)
                assert (resumed.starts, resumed.ends, resumed.ready) == \
                    (fresh.starts, fresh.ends, fresh.ready)
                assert resumed.predicted == fresh.predicted


def test_plans_are_deterministic_and_fast_for_200_leaves():
    rng = random.Random(3)
    n = 200
    ready = sorted(rng.uniform(0, 0.2) for _ in range(n))
    entries = [rng.choice([64, 1000, 100_000, 2_000_000]) for _ in range(n)]
    layers = gp.LayerTimes(tuple(range(n)), tuple(ready), tuple(entries),
                           tuple(4 * e for e in entries), ready[-1] + 0.01)
    link = gp.Link(a=1e-4, b=1e-8, gamma=1.5)
    message_bytes = lambda n: 56 + 0.08 * n  # noqa: E731
    local_s = lambda n: 1e-5 + 1e-9 * n  # noqa: E731
    t0 = time.perf_counter()
    p = gp.plan("asc", layers, link, message_bytes, local_s)
    elapsed = time.perf_counter() - t0
    assert elapsed < 3.0  # about 0.1 s on an idle core; generous for a loaded machine
    assert gp.plan("asc", layers, link, message_bytes, local_s) == p
    for method in ("mg", "wfbp", "bucket", "none"):
        assert p.predicted_s <= gp.plan(method, layers, link, message_bytes,
                                        local_s).predicted_s + 1e-12


# --- the plan object ----------------------------------------------------------------------------


def test_json_round_trip_and_table():
    layers = layers_of([1, 2, 4, 6, 8], [3000, 500, 2000, 500, 1500], compute_ms=9,
                       leaves=(4, 3, 2, 1, 0),
                       names=("head.w", "head.b", "mlp.w", "mlp.b", "embed"))
    p = gp.plan("asc", layers, gp.Link(a=A, b=B, gamma=1.5, max_concurrent=3), one_byte)
    d = json.loads(json.dumps(p.to_json()))
    assert gp.GroupingPlan.from_json(d) == p
    assert p.max_concurrent == 3  # the executor holds simultaneous groups to it
    d.pop("max_concurrent")  # a plan saved before the field: the Link default
    assert gp.GroupingPlan.from_json(d).max_concurrent == 2
    assert p.leaf_groups() == tuple(g.leaves for g in p.groups)
    table = p.table()
    assert str(p) == table
    lines = table.splitlines()
    assert len(lines) == len(p.groups) + 2  # header, one row a group, the total
    for i, g in enumerate(p.groups):
        row = lines[i + 1]
        assert row.split()[0] == str(i)
        assert g.names[0] in row and g.kind in row and f"{g.end_s / MS:.3f}" in row
    assert f"{p.predicted_s / MS:.3f} ms" in lines[-1] and "asc" in lines[-1]


def test_table_abbreviates_long_groups_and_uses_ids_without_names():
    n = 40
    layers = gp.LayerTimes(tuple(range(100, 100 + n)), (0.0,) * n, (10,) * n, (40,) * n, 0.0)
    p = gp.plan("none", layers, gp.Link(a=A, b=B), one_byte)
    row = p.table().splitlines()[1]
    assert "100, 101 .. 139 (40)" in row
    assert len(row) < 120


# --- Link.link_b: the link's own bound on simultaneous operations -------------------------------


def test_link_b_bounds_simultaneous_operations():
    # Two 1000-byte operations ready at 0, both simultaneous. The contention model
    # alone: each a + 1.5 b m = 2.5 ms (together 2/1.5 = 1.33x the bytes of one).
    # With link_b = b (one operation fills the link): each a + 2 b m = 3 ms.
    layers = layers_of([0, 0], [1000, 1000])
    groups = [((10,), "normal"), ((11,), "simultaneous")]
    free = gp.simulate(layers, groups, gp.Link(a=A, b=B, gamma=1.5), one_byte)
    assert ms([g.end_s for g in free.groups]) == pytest.approx([2.5, 2.5])
    bound = gp.simulate(layers, groups, gp.Link(a=A, b=B, gamma=1.5, link_b=B), one_byte)
    assert ms([g.end_s for g in bound.groups]) == pytest.approx([3.0, 3.0])
    # a link twice as fast as one operation leaves gamma = 1.5 in charge
    half = gp.simulate(layers, groups, gp.Link(a=A, b=B, gamma=1.5, link_b=B / 2), one_byte)
    assert ms([g.end_s for g in half.groups]) == pytest.approx([2.5, 2.5])
    assert gp.Link(a=A, b=B, gamma=1.5, link_b=B).slowdown(3) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="link_b"):
        gp.Link(a=A, b=B, link_b=-1.0)


def test_link_b_no_plan_beats_the_link():
    # Whatever the plan, the bytes take at least link_b * sum(bytes) after the first
    # leaf is ready (ASC-WFBP's S_max bound); without the bound asc can beat it.
    rng = random.Random(3)
    for _ in range(20):
        n = rng.randint(3, 30)
        ready = sorted(rng.uniform(0, 20) for _ in range(n))
        entries = [rng.randint(1, 5000) for _ in range(n)]
        layers = layers_of(ready, entries)
        link = gp.Link(a=A, b=B, gamma=1.5, link_b=B)
        floor = ready[0] * MS + B * sum(entries)
        for method in gp.GROUPINGS:
            assert gp.plan(method, layers, link, one_byte).predicted_s >= floor - 1e-12


# --- the simpler plan within the noise (min_gain) and the per-group cost -----------------------


def two_leaves():
    # Leaf 10 ready at 0, leaf 11 at 3, 1000 B each. One group (none): ready at 3,
    # wire 3..6 (a + 2000 b). WFBP: 0..2 and 3..5, so 5: a gain of 1/6 = 16.7 %.
    return layers_of([0, 3], [1000, 1000])


def test_min_gain_picks_the_one_group_plan_when_the_gain_is_within_it():
    layers, link = two_leaves(), gp.Link(a=A, b=B, gamma=1.5)
    assert gp.plan("none", layers, link, one_byte).predicted_s == pytest.approx(6 * MS)
    fastest = gp.plan("asc", layers, link, one_byte)
    assert len(fastest.groups) == 2 and fastest.predicted_s == pytest.approx(5 * MS)
    # gain 16.7 % > 10 %: the grouped plan
    grouped = gp.plan("asc", layers, link, one_byte, min_gain=0.10)
    assert grouped.leaf_groups() == ((10,), (11,)) and grouped.method == "asc"
    # gain 16.7 % <= 20 %: the simpler plan, one group (the ungrouped sync)
    simple = gp.plan("asc", layers, link, one_byte, min_gain=0.20)
    assert simple.leaf_groups() == ((10, 11),)
    assert simple.predicted_s == pytest.approx(6 * MS)
    # the bound is inclusive: a gain of exactly 1/6 keeps the simpler plan
    assert len(gp.plan("asc", layers, link, one_byte, min_gain=1 / 6).groups) == 1
    assert len(gp.plan("asc", layers, link, one_byte, min_gain=1 / 6 - 1e-6).groups) == 2
    # the other methods are what they are: the margin is asc's
    assert len(gp.plan("wfbp", layers, link, one_byte, min_gain=0.5).groups) == 2


def test_min_gain_weighs_the_gain_over_one_group_not_over_fewer_groups():
    # Three leaves at 0, 2.5, 5 of 1000 B, compute ends at 5, one operation at a time.
    # WFBP: 0..2, 2.5..4.5, 5..7 = 7. Two groups ({10, 11}, {12}): 2.5..5.5, 5.5..7.5
    # = 7.5 (WFBP 6.7 % faster). One group: 5..9 (WFBP 22 % faster).
    layers = layers_of([0, 2.5, 5], [1000, 1000, 1000])
    link = gp.Link(a=A, b=B, gamma=1.5, max_concurrent=1)
    assert gp.simulate(layers, [((10, 11), "normal"), ((12,), "normal")], link,
                       one_byte).predicted_s == pytest.approx(7.5 * MS)
    assert gp.plan("asc", layers, link, one_byte).predicted_s == pytest.approx(7 * MS)
    # a margin above the 2-group plan's 6.7 % but below the one group's 22 %: the
    # fastest plan, not the 2-group one (only the ungrouped plan is preferred)
    p = gp.plan("asc", layers, link, one_byte, min_gain=0.10)
    assert len(p.groups) == 3 and p.predicted_s == pytest.approx(7 * MS)
    one = gp.plan("asc", layers, link, one_byte, min_gain=0.25)
    assert one.leaf_groups() == ((10, 11, 12),) and one.predicted_s == pytest.approx(9 * MS)


def test_a_per_group_fixed_cost_changes_the_pick():
    # 1.5 ms of local work a group, serial with the backward pass: one group is ready
    # at 3 + 1.5, ends 7.5; WFBP: 1.5..3.5, then leaf 11 at 3 + 1.5 + 1.5 = 6, ends 8.
    layers, link = two_leaves(), gp.Link(a=A, b=B, gamma=1.5)
    assert len(gp.plan("asc", layers, link, one_byte).groups) == 2
    costly = gp.plan("asc", layers, link, one_byte, local_s=lambda n: 1.5 * MS)
    assert costly.leaf_groups() == ((10, 11),)
    assert costly.predicted_s == pytest.approx(7.5 * MS)
    assert gp.plan("wfbp", layers, link, one_byte,
                   local_s=lambda n: 1.5 * MS).predicted_s == pytest.approx(8 * MS)


@pytest.mark.parametrize("bad", [-0.01, 1.0, 2, float("nan"), float("inf"), True, "0.1", None])
def test_min_gain_rejects_bad_values(bad):
    # the message names the function, the argument and the fix (None is no default here)
    with pytest.raises(ValueError, match=r"^grouping\.plan: min_gain must be a fraction") as e:
        gp.plan("asc", two_leaves(), gp.Link(a=A, b=B), one_byte, min_gain=bad)
    assert "Pass e.g. min_gain=0.05" in str(e.value) and "or None" not in str(e.value)
