"""benchmarks/hash_partition_balance.py on a small size: its counts and its claim."""

import json

import numpy as np
from benchmark_scripts import load_benchmark


def _benchmark():
    return load_benchmark("hash_partition_balance")


def test_counts_are_exact_and_hash_is_balanced_where_ranges_are_not(tmp_path):
    bench = _benchmark()
    data = bench.main(["--size", "256K", "--nranks", "4", "8", "--out", str(tmp_path / "hp")])
    assert (tmp_path / "hp.png").stat().st_size > 0
    saved = json.loads((tmp_path / "hp.json").read_text())
    assert {"commit", "command"} <= set(saved["machine"])
    assert len(data["records"]) == len(bench.WORKLOADS) * 2
    for r in data["records"]:
        p, k = r["nranks"], r["k"]
        supports = [bench.support(r["workload"], r["size"], k, q, 0) for q in range(p)]
        assert all(len(s) == k and len(np.unique(s)) == k for s in supports)
        union = np.unique(np.concatenate(supports))
        assert r["union"] == len(union)
        for scheme, s in r["schemes"].items():
            assert sum(s["merged"]) == r["union"] and sum(s["received"]) == p * k, scheme
        # the hash owner is the library's: an owner's merged count, recounted
        hashed = bench.hash_owner_np(union, p)
        assert r["schemes"]["hash"]["merged"] == np.bincount(hashed, minlength=p).tolist()
        assert r["schemes"]["hash"]["merged_max_over_mean"] <= 1.15
        if r["workload"] != "uniform":
            assert r["schemes"]["contiguous"]["merged_max_over_mean"] > 1.5
            assert (r["max_rank_bytes_sent"]["hash_partition"]
                    < r["max_rank_bytes_sent"]["split_allgather"])
