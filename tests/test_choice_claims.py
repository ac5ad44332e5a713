"""The README's "Which sync do I use" table and docs/choosing.md: the numbers their rows
state, read from the records they cite (the README's headline table is generated:
tests/test_headlines.py).

A row's number is parsed from its page, so an edit of either the page or a record that
leaves them apart fails here.
"""

import json
import math
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def row(situation: str, page: str = "README.md") -> str:
    """The page's table row that starts with ``situation``."""
    text = (ROOT / page).read_text()
    line = next((ln for ln in text.splitlines() if ln.startswith(f"| {situation}")), None)
    assert line is not None, f"{page} has no table row for {situation!r}"
    return line


def finals(name: str) -> dict[str, float]:
    data = json.loads((RESULTS / name).read_text())
    return {r["mode"]: r[f"final_{data['metric']}"] for r in data["table"]}


def test_adam_row_states_the_cnn_gap_of_chain_topk_adamw():
    line = row("Adam or AdamW")
    assert "`benchmarks/results/convergence_cnn.json`" in line
    stated = float(re.search(r"ends ([\d.]+) points below dense on the CNN", line).group(1))
    f = finals("convergence_cnn.json")
    assert stated == round(f["dense"] - f["topk_1pct"], 1)
    # "the Adam-direction sync above it"
    assert f["topk_1pct_adamdir"] > f["topk_1pct"]


def test_long_lm_row_states_the_share_of_the_p8_gap_closed():
    line = row("long LM runs at 8 or more ranks")
    m = re.search(r"closes (\d+) % of the remaining loss gap at P = 8: ([\d.]+) above dense's "
                  r"validation loss against the row above's ([\d.]+) \(one seed", line)
    assert m, line
    # both sides from the one record the row cites (its base mode is the row above's sync)
    f = finals("convergence_lm_lrin_meanvwarm_P8.json")
    before = f["topk_1pct_adamdir_mask_ramp"] - f["dense"]
    after = f["topk_1pct_adamdir_mask_ramp_lrin_meanvwarm"] - f["dense"]
    assert (int(m[1]), m[2], m[3]) == (round(100 * (1 - after / before)), f"{after:.3f}",
                                       f"{before:.3f}")


def test_sharded_row_states_state_bytes_and_loss_of_its_records():
    line = row("optimizer state too large to replicate")
    bytes_bound = float(re.search(r"bytes at most ([\d.]+)x", line).group(1))
    loss_bound = float(re.search(r"loss within ([\d.]+) %", line).group(1))
    for P in (2, 4):
        rows = json.loads((RESULTS / f"sharded_state_p{P}.json").read_text())["rows"]
        replicated = rows["replicated_topk_adamw"]
        sharded = {k: v for k, v in rows.items() if k.startswith("sharded_")}
        # "AdamW state per rank 1/P", exactly
        assert all(P * r["adamw_state_bytes"] == replicated["adamw_state_bytes"]
                   for r in sharded.values())
        # every change but the dense one (which sends the region's change densely)
        most = max(r["bytes_per_step"] for k, r in sharded.items() if k != "sharded_dense")
        assert most / replicated["bytes_per_step"] <= bytes_bound
        # the change sent lazily or dense: the replicated topk_sync + AdamW's loss
        for mode in ("sharded_lazy", "sharded_dense"):
            ratio = rows[mode]["val_loss"] / replicated["val_loss"]
            assert abs(ratio - 1) <= loss_bound / 100, (P, mode, ratio)


def test_the_ramp_helps_with_every_optimizer():
    line = row("`warmup=jss.density_ramp(d, steps_per_stage=25)`", "docs/choosing.md")
    assert "helps with every optimizer" in line
    cnn, lm = finals("convergence_cnn.json"), finals("convergence_lm.json")
    for without, with_ in (("topk_1pct", "topk_1pct_ramp"),
                           ("topk_1pct_adamdir", "topk_1pct_adamdir_ramp"),
                           ("topk_0.1pct_adamdir", "topk_0.1pct_adamdir_ramp")):
        assert cnn[with_] > cnn[without], with_
    assert lm["topk_1pct_adamdir_ramp"] < lm["topk_1pct_adamdir"]


def test_masking_row_states_the_lm_without_masking():
    line = row("`adam_direction_sync(..., momentum_masking=", "docs/choosing.md")
    loss, gap = re.search(r"without it ([\d.]+), \+([\d.]+) %", line).groups()
    lm = finals("convergence_lm.json")
    assert float(loss) == round(lm["topk_1pct_adamdir_ramp"], 3)
    assert float(gap) == round(100 * (lm["topk_1pct_adamdir_ramp"] / lm["dense"] - 1), 1)


def test_threshold_reuse_row_states_the_cnn_finals():
    line = row('`topk_sync(selection="threshold_reuse")`', "docs/choosing.md")
    m = re.search(r"it ended ([\d.]+) against ([\d.]+) % at 1 %, ([\d.]+) against ([\d.]+) % at "
                  r"0.1 %, within ([\d.]+) points of the exact top-k and both far below dense's "
                  r"([\d.]+) %", line)
    assert m, "the threshold_reuse row's sentence changed: update this test with it"
    cnn = finals("convergence_cnn.json")
    *stated, within, dense = [float(x) for x in m.groups()]
    assert stated == [round(cnn[k], 2) for k in ("topk_1pct_reuse", "topk_1pct",
                                                  "topk_0.1pct_reuse", "topk_0.1pct")]
    assert dense == round(cnn["dense"], 2)
    assert within == round(max(abs(cnn[f"topk_{d}_reuse"] - cnn[f"topk_{d}"])
                                for d in ("1pct", "0.1pct")), 1)


def test_slow_link_row_states_the_outer_step_records():
    line = row("a link far slower than the step", "docs/choosing.md")
    m = re.search(r"at H = 5 sends (\d+)x fewer bytes than DDP dense, reaches its loss "
                  r"([\d.]+)x sooner at 100 Mbit/s \(([\d.]+) of the ideal; "
                  r"`outer_step_lm_100mbit_p2_h5.json`\), at H = 10 (\d+)x fewer bytes and "
                  r"([\d.]+) % above its loss; dense DiLoCo .* reaches it at ([\d.]+) of the "
                  r"ideal at 1 Gbit/s", line)
    assert m, line

    def modes(name):
        return {r["mode"]: r for r in json.loads((RESULTS / name).read_text())["records"]}
    h5, slow, fast = (modes(f"outer_step_lm_{n}.json") for n in
                      ("100mbit_p2_h5", "100mbit_p2", "1gbit_p2"))
    sparse5, sparse10, dense = h5["diloco_h5_chunked_topk"], slow["diloco_h10_chunked_topk"], slow["dense"]
    assert m.groups() == (
        f"{dense['bytes_per_rank'] / sparse5['bytes_per_rank']:.0f}",
        f"{sparse5['speedup_over_dense']:.1f}", f"{sparse5['fraction_of_ideal']:.2f}",
        f"{dense['bytes_per_rank'] / sparse10['bytes_per_rank']:.0f}",
        f"{100 * (sparse10['final_metric'] / dense['final_metric'] - 1):.2f}",
        f"{fast['diloco_h10_dense']['fraction_of_ideal']:.2f}")


def test_slow_link_row_recommends_the_sweeps_best_outer_optimizers():
    line = row("a link far slower than the step", "docs/choosing.md")
    dense_lr, *sparse = re.search(
        r"`outer=optax.sgd\(([\d.]+)\)` at small H; or sparse with error feedback: "
        r"`sync=jss.chunked_topk_sync\(density=([\d.]+), value_bits=(\d+), "
        r"residual_decay=([\d.]+)\)`, `outer=optax.sgd\(([\d.]+)\)`", line).group(1, 2, 3, 4, 5)
    sweep = json.loads((RESULTS / "outer_step_sweep_lm_p2.json").read_text())
    best = {s: min((r for r in sweep["records"] if r["outer_sync"] == s),
                   key=lambda r: r["final_metric"]) for s in ("dense", "chunked_topk")}
    assert (best["dense"]["outer_lr"], best["dense"]["outer_momentum"]) == (float(dense_lr), 0)
    b = best["chunked_topk"]
    argv = sweep["commands"][b["mode"]]
    density, bits, decay, lr = sparse
    assert (b["outer_lr"], b["outer_momentum"], b["ef_decay"]) == (float(lr), 0, float(decay))
    assert (argv[argv.index("--outer-density") + 1], argv[argv.index("--outer-bits") + 1]) == \
        (density, bits)


def test_mesh_row_states_the_bytes_saved_against_psum():
    line = row("`shard_map` / `pmap` over a device mesh")
    stated = re.search(r"(\d+)x fewer bytes than `psum` at 1 % \(`benchmarks/results/"
                       r"shard_map_cpu8.json`\)", line)
    assert stated, line
    points = json.loads((RESULTS / "shard_map_cpu8.json").read_text())["points"]
    ratios = [p["algorithms"]["dense"]["bytes_sent_per_device"][0]
              / p["algorithms"]["allgather"]["bytes_sent_per_device"][0]
              for p in points if p["density"] == 0.01]
    assert ratios and stated[1] == f"{min(ratios):.0f}"


def test_shared_memory_rows_state_the_sparse_allreduce_against_mpi_allreduce():
    data = json.loads((RESULTS / "allreduce_shm.json").read_text())
    by = {(r["P"], r["density"], r["algorithm"]): r["median_s"] for r in data["records"]}
    speedups = [by[(P, d, "dense")] / by[(P, d, a)] for P in data["procs"]
                for d in data["densities"] for a in ("allgather", "recursive_doubling")]
    span = f"{min(speedups):.1f}-{max(speedups):.1f}x"
    assert f"still {span} faster than `MPI_Allreduce`" in row("shared memory or a fast interconnect")
    assert f"({span} `MPI_Allreduce` at N = {data['N'] >> 20}M" in row(
        "one host over shared memory", "docs/choosing.md")


def test_wire_row_states_the_share_of_bytes_of_bf16_values_and_auto_indices():
    line = row("the link is the bottleneck even at 1 %")
    stated = re.search(r"([\d.]+) of the bytes at 1 % \(P = 4, 16M, allgather\)", line)
    assert stated, line
    r = next(r for r in json.loads((RESULTS / "wire_formats_p4.json").read_text())["records"]
             if r["density"] == 0.01 and r["algorithm"] == "allgather")
    share = (r["index_bytes_auto"] + r["value_bytes_bfloat16"]) / (
        r["index_bytes_int32"] + r["value_bytes_float32"])
    assert stated[1] == f"{share:.2f}"


def test_hash_partition_row_states_balance_and_times_of_its_records():
    line = row("gradients concentrated on a few rows")
    m = re.search(r"share within ([\d.]+)x of the mean where Ok-Topk's regions reach ([\d.]+)x.*"
                  r"core per rank, ([\d.]+)-([\d.]+)x faster than Ok-Topk's steady step on "
                  r"embedding rows, ([\d.]+)-([\d.]+)x slower on uniform supports.*: "
                  r"([\d.]+)-([\d.]+)x Ok-Topk's time on uniform supports at P = 2 and 4, "
                  r"([\d.]+)-([\d.]+)x where its regions went stale at P = 4", line)
    assert m, line
    balance = json.loads((RESULTS / "hash_partition_balance.json").read_text())["records"]
    hash_share = max(max(r["schemes"]["hash"]["merged_max_over_mean"],
                         r["schemes"]["hash"]["received_max_over_mean"]) for r in balance)
    regions = max(r["schemes"]["oktopk_fresh"]["merged_max_over_mean"] for r in balance)

    def times(name):
        return {(r["workload"], r["nranks"]): {k: v["median_s"] for k, v in r["methods"].items()}
                for r in json.loads((RESULTS / name).read_text())["records"]}
    core = times("hash_partition_time_4M_h100.json")
    loaded = {**times("oktopk_hash_partition_time_p2.json"),
              **times("oktopk_hash_partition_time_p4.json")}
    faster = [t["oktopk_reuse"] / t["hash_partition"] for (w, _), t in core.items()
              if w == "embedding_rows"]
    slower = [t["hash_partition"] / t["oktopk_reuse"] for (w, _), t in core.items() if w == "uniform"]
    uniform = [t["oktopk_hash_reuse"] / t["oktopk_reuse"] for (w, _), t in loaded.items()
               if w == "uniform"]
    stale = [t["oktopk_hash_reuse"] / t["oktopk_stale"] for (w, P), t in loaded.items()
             if w != "uniform" and P == 4]
    one, two = lambda v: f"{v:.1f}", lambda v: f"{v:.2f}"  # noqa: E731
    assert m.groups()[:2] == (f"{math.ceil(hash_share * 1000 - 1e-9) / 1000:.3f}", f"{regions:.2f}")
    assert m.groups()[2:] == (one(min(faster)), one(max(faster)), one(min(slower)),
                              one(max(slower)), two(min(uniform)), two(max(uniform)),
                              two(min(stale)), two(max(stale)))


def test_oktopk_row_states_the_words_its_record_counted():
    line = row("many ranks, k-sized traffic whatever P")
    assert ("sends 2k(P-1)/P to 6k(P-1)/P words a rank, allgather 2k(P-1) "
            "(`benchmarks/results/oktopk_volume.json`)") in line
    data = json.loads((RESULTS / "oktopk_volume.json").read_text())
    k = data["k"]
    for r in data["records"]:
        P, sent = r["P"], r["payload_words_sent_mean"]
        if r["variant"] in ("oktopk", "oktopk_reuse"):  # the mean rank's payload, in bounds
            assert 2 * k * (P - 1) / P <= sent <= 6 * k * (P - 1) / P, (P, r["variant"], sent)
        elif r["variant"] == "topka":
            assert sent == 2 * k * (P - 1), (P, sent)


def test_choosing_adam_row_states_the_largest_gap_over_seeds():
    line = row("Adam or AdamW", "docs/choosing.md")
    cnn, lm = re.search(r"never more than ([\d.]+) points \(CNN\) or ([\d.]+) % of the loss "
                        r"\(LM\) behind it in any of 3 seeds", line).groups()

    def gaps(name, relative):
        seeds = json.loads((RESULTS / name).read_text())["seed_finals"]
        dense = seeds["dense"]
        return [(s[k] / dense[k] - 1) * 100 if relative else dense[k] - s[k]
                for mode, s in seeds.items() if mode != "dense" for k in s]
    up = lambda v: f"{math.ceil(10 * v - 1e-9) / 10:.1f}"  # noqa: E731  (never more than)
    assert (cnn, lm) == (up(max(gaps("convergence_cnn_seeds.json", False))),
                         up(max(gaps("convergence_lm_seeds.json", True))))
    assert len(json.loads((RESULTS / "convergence_cnn_seeds.json").read_text())
               ["seed_finals"]["dense"]) == 3


def test_choosing_union_row_states_union_is_worse_than_each_ranks_choice():
    line = row('`topk_sync(selection="union")`', "docs/choosing.md")
    assert "worse than each rank's own choice" in line
    f = finals("convergence_lm_union_P8.json")
    assert f["topk_1pct_adamdir_mask_ramp_union_meanvwarm"] > f["topk_1pct_adamdir_mask_ramp_meanvwarm"]


def test_choosing_oktopk_row_states_the_count_band_of_the_drift_record():
    line = row("many ranks and you want traffic of O(k)", "docs/choosing.md")
    assert "its count stays in [0.5k, 2k]: `benchmarks/results/oktopk_threshold_drift.json`" in line
    reuse = json.loads((RESULTS / "oktopk_threshold_drift.json").read_text())["summary"][
        "threshold_reuse"]
    assert reuse["global_fraction_in_wide_band"] == 1.0


def test_choosing_leak_row_states_the_leak_records_gaps_against_the_seed_spread():
    line = row("`topk_sync(residual_decay=g)`", "docs/choosing.md")
    at1 = re.search(r"at 1 % 0\.99 ends ([-+][\d.]+) %, 0\.95 ([-+][\d.]+) %, 0\.95 fading to none "
                    r"over the run ([-+][\d.]+) %, all inside the ([\d.]+)-point spread", line).groups()
    at01 = re.search(r"at 0\.1 % 0\.99 ends ([-+][\d.]+) %, outside that spread there "
                     r"\(([\d.]+) points\), 0\.999 ([-+][\d.]+) %", line).groups()
    f = finals("convergence_lm_leak_P8.json")
    seeds = json.loads((RESULTS / "convergence_lm_seeds.json").read_text())["seed_finals"]

    def vs_no_leak(density, suffixes):
        base = f[f"topk_{density}_adamdir_mask_ramp_meanvwarm"]
        return [100 * (f[f"topk_{density}_adamdir_mask_ramp_meanvwarm_{s}"] / base - 1)
                for s in suffixes]

    def spread(density):  # of the paired gap to dense over the seeds
        gaps = [100 * (v / seeds["dense"][k] - 1)
                for k, v in seeds[f"topk_{density}_adamdir_mask_ramp"].items()]
        return max(gaps) - min(gaps)
    leaks1, leaks01 = vs_no_leak("1pct", ("decay99", "decay95", "decayfade95")), vs_no_leak(
        "0.1pct", ("decay99", "decay999"))
    assert at1 == (*(f"{g:+.2f}" for g in leaks1), f"{spread('1pct'):.2f}")
    assert at01 == (f"{leaks01[0]:+.2f}", f"{spread('0.1pct'):.2f}", f"{leaks01[1]:+.2f}")
    assert all(abs(g) < spread("1pct") for g in leaks1)  # "all inside"
    assert leaks01[0] > spread("0.1pct")  # "outside that spread"
