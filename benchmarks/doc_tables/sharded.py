"""benchmarks/sharded_state.py's records: sharded optimizer state against the replicated sync."""

from __future__ import annotations

from typing import Callable

from .common import Table, ceil2, fill, md_table, ranks_phrase, span, trained_at

SHARDED_MODES = (("replicated_adamdir", "replicated `adam_direction_sync`"),
                 ("replicated_topk_adamw", "replicated `topk_sync` + AdamW"),
                 ("sharded_topk", 'sharded, `change="topk"`'),
                 ("sharded_topk_1pct_change", 'sharded, `"topk"` at 1 % of the region'),
                 ("sharded_lazy", 'sharded, `change="lazy"`'),
                 ("sharded_dense", 'sharded, `change="dense"`'))


def kilobytes(x: float) -> str:
    return f"{x / 1e3:,.0f}" if x >= 1e6 else f"{x / 1e3:.1f}"


def sharded_state(P: int) -> Callable[[dict], str]:
    def render(recs: dict) -> str:
        data = recs[f"sharded_state_p{P}.json"]
        rows_, cores = data["rows"], data["machine"].get("cpu_count", 2)
        head = fill(f"P = {P}, {ranks_phrase(P, cores)}: "
                    f"`python benchmarks/{data['machine']['command']}` "
                    f"(`benchmarks/results/sharded_state_p{P}.{{json,png}}`, every run trained "
                    f"{trained_at(data)}):")
        base, rep = rows_["replicated_adamdir"], rows_["replicated_topk_adamw"]
        rows = []
        for mode, label in SHARDED_MODES:
            r, model = rows_[mode], rows_[mode].get("model_bytes")
            sent = f"{kilobytes(r['bytes_per_step'])} kB" + (
                f" ({kilobytes(model['typical'])})" if model else "")
            loss_a, loss_b = r["val_loss"] / base["val_loss"], r["val_loss"] / rep["val_loss"]
            ratio = r["step_s"] / base["step_s"]
            rows.append([label, f"{r['val_loss']:.4f}", "1" if r is base else f"{loss_a:.3f}",
                         "1" if r is rep else f"{loss_b:.3f}", f"{1e3 * r['step_s']:.0f} ms",
                         "1" if r is base else f"{ratio:.2f}", sent,
                         f"{r['adamw_state_bytes'] / 1e6:.2f} MB"])
        return head + "\n\n" + md_table(
            ["mode", "final val loss", "x adam_direction", "x topk + AdamW", "step",
             "x adam_direction", "bytes/step (model)", "AdamW state"], rows)
    return render


#: the rank counts of the sharded-state records
SHARDED_PS = (2, 4)


SHARDED = ("sharded_topk", "sharded_topk_1pct_change", "sharded_lazy", "sharded_dense")


def ratios(rows: dict, modes, over: str, key: str, pct_: bool = False) -> list[float]:
    """``key`` of each mode over ``over``'s, at every P (``pct_``: as % above 1)."""
    out = [r[m][key] / r[over][key] for r in rows.values() for m in modes]
    return [100 * (x - 1) for x in out] if pct_ else out


def goal(targets: dict, key: str) -> str:
    """A sharded-state goal as the records' ``goals.targets`` state it: one value, or one
    per P."""
    values = {P: t[key] for P, t in targets.items()}
    if len(set(values.values())) == 1:
        return f"{next(iter(values.values())):g}"
    return " / ".join(f"{v:g}" for v in values.values()) + " at P = " + " / ".join(
        map(str, values))


def memory_bullet(rows: dict, targets: dict) -> str:
    exact = all(P * r[m]["adamw_state_bytes"] == r["replicated_topk_adamw"]["adamw_state_bytes"]
                for P, r in rows.items() for m in SHARDED)
    adamw = ", ".join(f"{ratios({P: r}, SHARDED[:1], 'replicated_topk_adamw', 'adamw_state_bytes')[0]:.3f}"
                      f" at P = {P}" for P, r in rows.items())
    state = ratios(rows, SHARDED[:1], "replicated_adamdir", "state_bytes_per_rank")
    kept = ratios(rows, SHARDED[2:], "replicated_adamdir", "state_bytes_per_rank")
    rss = lambda kind: [x["peak_rss_mb"] for r in rows.values() for m, x in r.items()  # noqa: E731
                        if m.startswith(kind)]
    return (f"**Memory**: the AdamW state per rank is 1/P of the replicated one"
            f"{', exactly' if exact else ''} ({adamw}; goal at most "
            f"{goal(targets, 'adamw_state_ratio')}). The whole "
            f"optimizer state per rank, against the replicated `adam_direction_sync`'s, is "
            f"{' and '.join(f'{s:.2f}' for s in state)} with `change=\"topk\"` (which keeps "
            f"the change's residual too), {span(kept)} with `\"lazy\"` or `\"dense\"`: the "
            "gradient residual (N floats) is each rank's own and stays. The "
            f"processes' peak resident memory ({span(rss('sharded'), '.0f')} MB sharded, "
            f"{span(rss('replicated'), '.0f')} MB replicated) is mostly JAX, XLA and the corpus "
            "at this model size, not the state.")


def bytes_bullet(rows: dict, targets: dict) -> str:
    sent = ratios(rows, SHARDED[:3], "replicated_topk_adamw", "bytes_per_step")
    off = [abs(r[m]["bytes_per_step"] / r[m]["model_bytes"]["typical"] - 1)
           for r in rows.values() for m in ("sharded_topk", "sharded_dense")]
    in_range = all(x["model_bytes"]["min"] <= x["bytes_per_step"] <= x["model_bytes"]["max"]
                   for r in rows.values() for m, x in r.items() if m in SHARDED)
    return (f"**Bytes**: at most {ceil2(max(sent))}x the replicated 1 % sync's (goal "
            f"{goal(targets, 'bytes_ratio')}x), nothing "
            "dense on the wire but with `change=\"dense\"`; "
            f"{'every count within the model' + chr(39) + 's range, ' if in_range else ''}"
            f"`\"topk\"` and `\"dense\"` within {ceil2(100 * max(off), 1)} % of its typical count "
            "(lazy below it: the ranks' selections overlap, so a region's union holds fewer "
            "than k).")


def loss_bullet(rows: dict) -> str:
    rep, base = "replicated_topk_adamw", "replicated_adamdir"
    return ("**Loss**: the sharded sync does what the replicated `topk_sync` + AdamW does. With "
            "the change sent lazily or dense it ends at "
            f"{span(ratios(rows, SHARDED[2:], rep, 'val_loss'), '.3f')}x that run's loss; the "
            "owner's top-k of the change ends "
            f"{span(ratios(rows, SHARDED[:1], rep, 'val_loss', True), '.1f', ' %')} higher (at "
            f"1 % of the region, {span(ratios(rows, SHARDED[1:2], rep, 'val_loss', True), '.1f', ' %')}"
            "). Against `adam_direction_sync` the sharded sync ends "
            f"{span(ratios(rows, SHARDED, base, 'val_loss', True), '.1f', ' %')} higher, and the "
            f"replicated `topk_sync` + AdamW {span(ratios(rows, (rep,), base, 'val_loss', True), '.1f', ' %')}"
            ": syncing each rank's Adam direction is the better algorithm at 1 %, and it needs "
            "every rank's own moments, which is the replicated state.")


def step_bullet(rows: dict, cores: dict, targets: dict) -> str:
    per_p = "; ".join(
        f"P = {P} ({ranks_phrase(P, cores[P])}): "
        f"{span(ratios({P: r}, SHARDED[:3], 'replicated_adamdir', 'step_s'))}x, `\"dense\"` "
        f"{span(ratios({P: r}, SHARDED[3:], 'replicated_adamdir', 'step_s'))}x"
        for P, r in rows.items())
    return (f"**Step** over the replicated `adam_direction_sync` step (goal "
            f"{goal(targets, 'step_ratio')}x), {per_p}.")


def sharded_state_goals(recs: dict) -> str:
    """What the sharded-state records show against the issue's goals: memory, bytes, loss
    and step, over every P measured."""
    data = [recs[f"sharded_state_p{P}.json"] for P in SHARDED_PS]
    rows = {d["P"]: d["rows"] for d in data}
    cores = {d["P"]: d["machine"].get("cpu_count", 2) for d in data}
    targets = {d["P"]: d["goals"]["targets"] for d in data}  # sharded_state.py's, per P
    bullets = (memory_bullet(rows, targets), bytes_bullet(rows, targets), loss_bullet(rows),
               step_bullet(rows, cores, targets))
    return "\n".join(fill(b, bullet="* ") for b in bullets)


# this topic's tables: name, page, records, renderer
TABLES = (
    Table("sharded_state_goals", "docs/topics/sharded_state.md",
          tuple(f"sharded_state_p{P}.json" for P in SHARDED_PS), sharded_state_goals),
    *(Table(f"sharded_state_p{P}", "docs/topics/sharded_state.md", (f"sharded_state_p{P}.json",),
            sharded_state(P)) for P in SHARDED_PS),
)
