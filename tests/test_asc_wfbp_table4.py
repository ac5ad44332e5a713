"""benchmarks/asc_wfbp_table4.py: ASC-WFBP's Table IV from the real BERT-Base
architecture (one model keeps it fast: eval_shape of BERT traces in seconds; the
CNNs take longer and run in the benchmark itself)."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import asc_wfbp_models  # noqa: E402
import asc_wfbp_table4 as t4  # noqa: E402


@pytest.fixture(scope="module")
def bert():
    return asc_wfbp_models.gradient_layers("bert_base")


def test_bert_tensors_are_the_papers(bert):
    # Table III: 206 gradient tensors, ~110M parameters (HuggingFace BertForPreTraining)
    assert len(bert.names) == 206
    assert bert.parameters == 110_106_428
    # backward order: the masked-LM head first, the word embeddings (tied to the
    # decoder, ready at their earliest use) last
    assert bert.names[0] == "mlm_bias/bias" and bert.names[-1] == "word_embeddings/embedding"
    assert list(bert.ready_flops) == sorted(bert.ready_flops)
    assert bert.ready_flops[-1] == pytest.approx(bert.total_flops)
    # per token: 12 layers of 12 d^2 multiply-adds plus the tied decoder's d * vocab
    d, tokens = 768, 64
    matmuls = 2 * tokens * (12 * 12 * d * d + d * 30522 + d * d) + 2 * d * d + 2 * d * 2
    assert matmuls < bert.total_flops < 1.01 * matmuls


def test_bert_cells(bert):
    pred = t4.predict("bert_base", bert)
    recs = {r["plan"]: r for r in t4.records("bert_base", pred)}
    asc, mg, wfbp = (recs[c]["predicted_s"] for c in ("asc_wfbp", "mg_wfbp", "wfbp"))
    assert asc <= mg <= wfbp
    assert abs(asc / 0.924 - 1) < 0.15                   # Table IV
    assert abs(recs["asc_wfbp"]["s_over_s_max"] - 10.6 / 11.5) < 0.10  # Table V
    assert recs["asc_wfbp"]["s_max"] == pytest.approx(11.5, abs=0.2)
    # without the link bound the contention model beats the paper's own S_max
    t_f, t_b = pred["t_f"], pred["t_b"]
    floor = t_f + t4.paper_link().link_b * 4 * bert.parameters
    assert pred["asc_unbounded_s"] < floor <= asc


def test_projection_of_our_lm():
    import grouping_projection as gpj

    recs = gpj.project(["transformer_lm"], networks=["10gbe_p32"], syncs=["dense", "topk_1%"])
    assert len(recs) == 2 * len(gpj.PLANS)
    for sync in ("dense", "topk_1%"):
        by = {r["plan"]: r for r in recs if r["sync"] == sync}
        # asc is never predicted slower than the plans it is compared with
        assert by["asc"]["predicted_s"] <= min(by[p]["predicted_s"] for p in ("none", "wfbp", "mg"))
        for r in by.values():
            assert 0 < r["s_over_s_max"] <= 1 + 1e-9  # the link bound holds
            assert r["predicted_s"] >= r["t_f_s"] + r["t_b_s"]
    dense = next(r for r in recs if r["sync"] == "dense")
    # the cost model's Rabenseifner volume of the whole gradient: 2 (P-1)/P 4N + header
    n = 10_893_568
    assert dense["wire_bytes_ungrouped"] == pytest.approx(2 * 31 * 4 * n / 32, rel=1e-4)
    sparse = next(r for r in recs if r["sync"] == "topk_1%")
    assert sparse["algorithm"] == "allgather"
    assert sparse["wire_bytes_ungrouped"] == pytest.approx(31 * 8 * round(0.01 * n), rel=1e-4)
