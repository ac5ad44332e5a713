"""A step's local work: the update profiles, the fused Adam pass."""

from __future__ import annotations

import statistics
import numpy as np

from .common import Table, fill, md_table, measured_at, pct, size_label

PIECES = (("sgd", "SGD only"), ("add", "+ accumulate"), ("select", "+ top-k"),
          ("allreduce", "+ allreduce"), ("residual", "+ residual"), ("update", "+ update"))


def update_profile_cpu(recs: dict) -> str:
    """benchmarks/update_profile.py, SGD: the cumulative pieces of a sparse update and the
    whole transforms' steps (ms), and each piece's own milliseconds at the largest N."""
    data = recs["update_profile_cpu.json"]
    rs, density = data["records"], data["records"][0]["density"]
    head = (f"**Result** (`benchmarks/results/update_profile_cpu.json`, plot "
            f"`benchmarks/results/update_profile_cpu.png`; measured "
            f"{measured_at(data)}, quiet wait {data['waited_s']:g} s; ms, "
            f"d = {pct(density)}):")
    syncs = ("topk_sync", "dense_sync", "oktopk_sync")
    rows = [[size_label(r["size"]), *(f"{r['cumulative_ms'][p]:.2f}" for p, _ in PIECES),
             *(f"{r['transform_ms'][t]:.2f}" for t in syncs)] for r in rs]
    last = rs[-1]
    pieces = ", ".join(f"{label.lstrip('+ ')} {last['piece_ms'][p]:.1f}" for p, label in PIECES[1:])
    tail = (f"Each piece's own milliseconds (its cumulative step less the one before) at "
            f"{size_label(last['size'])}: {pieces}.")
    return (fill(head, 90) + "\n\n"
            + md_table(["N", *(label for _, label in PIECES), *(f"`{t}`" for t in syncs)], rows)
            + "\n\n" + fill(tail, 90))


#: adam_fused.py's variants: (key, label) of the whole step and of the optimizer work alone
ADAM_FUSED_STEP = (("none+adamw", "no sync, clip + AdamW"),
                   ("topk+adamw", "`topk_sync(1%)` + clip + AdamW"),
                   ("adamdir_unfused", "`adam_direction_sync(topk_sync(1%))`, unfused"),
                   ("adamdir_fused", "`adam_direction_sync(topk_sync(1%))`, fused"))
ADAM_FUSED_PASS = (("adamw", "`optax.adamw` update + `apply_updates` (XLA's one fused pass)"),
                   ("accumulate_topk", "`accumulate_topk` (what every `topk_sync` step makes)"),
                   ("adam+accumulate_topk unfused", "Adam pass + `split_like` + `accumulate_topk`"),
                   ("adam_accumulate fused", "`adam_accumulate` with the top-k (fused)"))


def adam_fused(recs: dict) -> str:
    """benchmarks/adam_fused.py: the LM's step and the optimizer work alone, CPU and wall ms
    (medians of interleaved rounds), and what the fused pass saves."""
    data = recs["adam_fused_lm.json"]
    step, pass_ = data["step"], data["pass"]
    cpu = lambda part, k: 1e3 * part[k]["cpu_median_s"]  # noqa: E731
    wall = lambda part, k: 1e3 * part[k]["median_s"]  # noqa: E731
    base = "topk+adamw"
    head = fill(f"Measured {measured_at(data)} by `python benchmarks/{data['machine']['command']}` "
                f"(load average {data['loadavg_before']:.1f} before and "
                f"{data['loadavg_after']:.1f} after), medians of {data['args']['rounds']} "
                "interleaved rounds; CPU is the process's CPU time over all its threads, wall "
                "the wall clock, in ms:")
    steps = md_table(["LM training step", "CPU", "wall", "CPU vs `topk+adamw`",
                      "wall vs `topk+adamw`"],
                     [[label, f"{cpu(step, k):.1f}", f"{wall(step, k):.1f}",
                       f"{cpu(step, k) / cpu(step, base):.2f}x",
                       f"{wall(step, k) / wall(step, base):.2f}x"] for k, label in ADAM_FUSED_STEP])
    passes = md_table(["optimizer work alone, 10.9M entries, 102 leaves", "CPU", "wall"],
                      [[label, f"{cpu(pass_, k):.1f}", f"{wall(pass_, k):.1f}"]
                       for k, label in ADAM_FUSED_PASS])
    fused, unfused = "adam_accumulate fused", "adam+accumulate_topk unfused"
    topk_work = cpu(pass_, "adamw") + cpu(pass_, "accumulate_topk")
    bullets = [
        f"**The pass alone**: the fused pass costs {cpu(pass_, fused) / cpu(pass_, unfused):.2f}x "
        f"the unfused one in CPU time ({wall(pass_, fused) / wall(pass_, unfused):.2f}x wall), "
        f"{cpu(pass_, fused) / topk_work:.2f}x AdamW plus `accumulate_topk`, the work "
        "`topk_sync` + AdamW does.",
        f"**The whole step**: the fused step's CPU time is "
        f"{cpu(step, 'adamdir_fused') / cpu(step, base):.2f}x `topk_sync(1%)` + AdamW's, "
        f"against {cpu(step, 'adamdir_unfused') / cpu(step, base):.2f}x unfused (the issue's "
        f"goal: {ADAM_FUSED_TARGET}x); wall {wall(step, 'adamdir_fused') / wall(step, base):.2f}x and "
        f"{wall(step, 'adamdir_unfused') / wall(step, base):.2f}x."]
    return "\n\n".join([head, steps, passes, "\n".join(fill(b, bullet="- ") for b in bullets)])


#: the fused step's CPU time against ``topk_sync(1%)`` + AdamW's that its issue asked for
ADAM_FUSED_TARGET = 1.1
#: N-float streams of the fused Adam pass with float32 ages (5 read, 4 written), and how many
#: of them are the ages (read and written): docs/topics/adam_direction.md, "The ages as int16"
ADAM_PASS_STREAMS, ADAM_PASS_AGE_STREAMS = 9, 2


def numpy_name(c_type: str) -> str:
    """A C++ element type as NumPy names it (``float`` -> ``float32``, ``int16_t`` -> ``int16``)."""
    return {"float": "float32", "double": "float64"}.get(c_type, c_type.removesuffix("_t"))


def adam_pass_time(recs: dict) -> str:
    """benchmarks/adam_pass_time.py: the fused pass with int16 ages against the float32-age
    kernel of an older revision, paired round by round."""
    data = recs["adam_pass_time.json"]
    base, this = data["records"]
    q = statistics.quantiles(data["paired_ratios"], n=4)
    resolved = not q[0] <= 1.0 <= q[2]
    size = lambda c_type: np.dtype(numpy_name(c_type)).itemsize  # noqa: E731
    less = ADAM_PASS_AGE_STREAMS * (1 - size(this["age_type"]) / size(base["age_type"])) \
        / ADAM_PASS_STREAMS
    return fill(
        f"**Measured** {measured_at(data)}, the fused pass with the top-k at 1 % on the LM's N, "
        f"one pinned core, this tree's kernel ({numpy_name(this['age_type'])} ages) against "
        f"the {numpy_name(base['age_type'])}-age kernel of {data['base']} built from the same source file, "
        f"{len(data['paired_ratios'])} rounds taking turns (ABBA): per-round medians "
        f"{base['median_ms']:.1f} ms against {this['median_ms']:.1f} ms, minima "
        f"{base['min_ms']:.1f} against {this['min_ms']:.1f} ms; the paired ratio's median "
        f"**{data['paired_ratio_median']:.2f}** (quartiles {q[0]:.2f}-{q[2]:.2f}): "
        + ("resolved on this machine." if resolved else "the quartiles hold 1, so this shared "
           f"2-core VM does not resolve the {100 * less:.0f} % of the streams less per round.")
        + f" Command: `python benchmarks/{data['machine']['command']}`; record "
        "`benchmarks/results/adam_pass_time.{json,png}`.", bullet="- ")


def update_profile_adam(recs: dict) -> str:
    """benchmarks/update_profile.py --adam: ``topk_sync`` with SGD, with clip + AdamW, and
    the Adam-direction sync (ms per step)."""
    data = recs["update_profile_adam.json"]
    rs = data["records"]
    head = (f"With Adam (`benchmarks/results/update_profile_adam.json`, plot "
            f"`benchmarks/results/update_profile_adam.png`; measured "
            f"{measured_at(data)}; ms per step, d = {pct(rs[0]['density'])}):")
    rows = [[size_label(r["size"]), *(f"{r['transform_ms'][t]:.1f}" for t in (
        "topk_sync", "topk_sync+adamw", "adam_direction_sync"))] for r in rs]
    return fill(head, 90) + "\n\n" + md_table(
        ["N", "`topk_sync` + SGD", "`topk_sync` + clip + AdamW", "`adam_direction_sync(topk_sync)`"],
        rows)


# this topic's tables: name, page, records, renderer
TABLES = (
    Table("update_profile_cpu", "benchmarks/README.md", ("update_profile_cpu.json",),
          update_profile_cpu),
    Table("adam_fused_lm", "docs/topics/adam_direction.md", ("adam_fused_lm.json",), adam_fused),
    Table("adam_pass_time", "docs/topics/adam_direction.md", ("adam_pass_time.json",),
          adam_pass_time),
    Table("update_profile_adam", "benchmarks/README.md", ("update_profile_adam.json",),
          update_profile_adam),
)
