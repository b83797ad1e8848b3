"""The replay's report: JSON, plots (PNG and SVG, matplotlib) and one self-contained HTML
page with every configuration side by side.

Plots, each with one line (or bar) per configuration:

* ``utilization``: used over capacity of every resource class over the trace's time;
* ``hosts``: compute nodes in use and live instances over time;
* ``acceptance``: instances accepted and refused (cumulative) over time;
* ``refusals``: refused instances by cause;
* ``latency``: the distribution (CDF) of create request times;
* ``fragmentation``: stranded capacity over time (free amounts on nodes that can take
  no flavor of the trace), per class as a share of its capacity.

The HTML page embeds the SVGs inline and the summary tables; it needs no other file.
"""

from __future__ import annotations

import html
import io
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from berth.simulate.run import RunResult

PLOTS = ("utilization", "hosts", "acceptance", "refusals", "latency", "fragmentation")
_STYLES = ("-", "--", ":", "-.")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "berth", "figure.dpi": 100})  # stable SVG ids
    return plt


def _times(r: RunResult) -> list[float]:
    """Sample times in hours when the trace spans more than 2 hours, else seconds."""
    scale = 3600.0 if _hours(r) else 1.0
    return [s.time / scale for s in r.samples]


def _color(classes: list[str], rc: str) -> str:
    """One color per resource class in every configuration (the line style tells them
    apart)."""
    return f"C{classes.index(rc) % 10}"


def _hours(r: RunResult) -> bool:
    return bool(r.samples) and r.samples[-1].time > 7200


def _xlabel(results: Sequence[RunResult]) -> str:
    return "trace time (h)" if results and _hours(results[0]) else "trace time (s)"


def plot_utilization(ax: Any, results: Sequence[RunResult]) -> None:
    classes = sorted({rc for r in results for rc in r.classes})
    for i, r in enumerate(results):
        for rc in r.classes:
            ys = [100.0 * s.utilization.get(rc, 0.0) for s in r.samples]
            ax.plot(_times(r), ys, _STYLES[i % len(_STYLES)], color=_color(classes, rc),
                    label=f"{r.label}: {rc}")
    ax.set_ylabel("utilization (%)")
    ax.set_title("Resource utilization")


def plot_hosts(ax: Any, results: Sequence[RunResult]) -> None:
    for i, r in enumerate(results):
        ax.plot(_times(r), [s.hosts_in_use for s in r.samples], _STYLES[i % len(_STYLES)],
                label=f"{r.label}: hosts in use")
    ax.set_ylabel("compute nodes in use")
    ax.set_title("Hosts in use")


def plot_acceptance(ax: Any, results: Sequence[RunResult]) -> None:
    for i, r in enumerate(results):
        style = _STYLES[i % len(_STYLES)]
        ax.plot(_times(r), [s.accepted for s in r.samples], style, label=f"{r.label}: accepted")
        ax.plot(_times(r), [s.refused for s in r.samples], style, label=f"{r.label}: refused")
    ax.set_ylabel("instances (cumulative)")
    ax.set_title("Accepted and refused instances")


def plot_refusals(ax: Any, results: Sequence[RunResult]) -> None:
    causes = sorted({c for r in results for c in r.causes})
    if not causes:  # no bars: no axis of counts, no legend of empty entries
        ax.text(0.5, 0.5, "no instance was refused", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title("Refusals by cause (none)")
        return
    width = 0.8 / max(1, len(results))
    for i, r in enumerate(results):
        xs = [j + i * width for j in range(len(causes))]
        ax.bar(xs, [r.causes.get(c, 0) for c in causes], width, label=r.label, color=f"C{i}")
    ax.set_ylim(bottom=0)
    ax.set_xticks([j + width * (len(results) - 1) / 2 for j in range(len(causes))])
    ax.set_xticklabels(causes, rotation=20, ha="right")
    ax.set_ylabel("refused instances")
    ax.set_title("Refusals by cause" + ("" if causes else " (none)"))


def plot_latency(ax: Any, results: Sequence[RunResult]) -> None:
    import numpy as np

    for i, r in enumerate(results):
        if not r.request_seconds:
            continue
        ms = np.sort(np.array(r.request_seconds) * 1000.0)
        ax.plot(ms, np.arange(1, len(ms) + 1) / len(ms) * 100.0, _STYLES[i % len(_STYLES)],
                label=r.label)
    ax.set_xscale("log")
    # Plain numbers (2, 3, 5 ms), not 2×10⁰.
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plain = FuncFormatter(lambda value, _pos: f"{value:g}")
    ax.xaxis.set_major_formatter(plain)
    low, high = ax.get_xlim()
    # The 2..9 ticks labelled too within about a decade; beyond, only the decades.
    ax.xaxis.set_minor_formatter(plain if low > 0 and high / low < 30 else NullFormatter())
    ax.set_xlabel("create request time (ms)")
    ax.set_ylabel("requests (%)")
    ax.set_title("Scheduling time per request (CDF)")


def plot_fragmentation(ax: Any, results: Sequence[RunResult]) -> None:
    classes = sorted({rc for r in results for rc in r.classes})
    for i, r in enumerate(results):
        for rc in r.classes:
            total = r.capacity.get(rc, 0)
            if not total:
                continue
            ys = [100.0 * s.stranded.get(rc, 0) / total for s in r.samples]
            ax.plot(_times(r), ys, _STYLES[i % len(_STYLES)], color=_color(classes, rc),
                    label=f"{r.label}: {rc}")
    ax.set_ylabel("stranded capacity (% of total)")
    ax.set_title("Fragmentation: free capacity no flavor of the trace can use")


_PLOTTERS: dict[str, Callable[[Any, Sequence[RunResult]], None]] = {
    "utilization": plot_utilization, "hosts": plot_hosts, "acceptance": plot_acceptance,
    "refusals": plot_refusals, "latency": plot_latency, "fragmentation": plot_fragmentation,
}


def figure(name: str, results: Sequence[RunResult]) -> Any:
    """One plot as a matplotlib figure."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    _PLOTTERS[name](ax, results)
    if name not in ("latency", "refusals"):
        ax.set_xlabel(_xlabel(results))
    ax.grid(True, alpha=0.3)
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def write_plots(results: Sequence[RunResult], outdir: str) -> list[str]:
    """Every plot as ``NAME.png`` and ``NAME.svg`` under ``outdir``; the paths."""
    plt = _pyplot()
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in PLOTS:
        fig = figure(name, results)
        for ext in ("png", "svg"):
            path = out / f"{name}.{ext}"
            fig.savefig(path, format=ext, metadata={"Date": None} if ext == "svg" else None)
            written.append(str(path))
        plt.close(fig)
    return written


def svg_of(name: str, results: Sequence[RunResult]) -> str:
    """One plot as inline SVG text."""
    plt = _pyplot()
    fig = figure(name, results)
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def summary_rows(results: Sequence[RunResult]) -> list[tuple[str, list[str]]]:
    """The summary table: one row per measure, one column per configuration."""
    def pct(x: float) -> str:
        return f"{100.0 * x:.2f}%"

    rows: list[tuple[str, list[str]]] = [
        ("compute nodes", [str(r.hosts) for r in results]),
        ("events", [str(r.events) for r in results]),
        ("create requests (accepted)", [f"{r.requests} ({r.requests_accepted})" for r in results]),
        ("instances requested", [str(r.instances_requested) for r in results]),
        ("instances accepted", [str(r.instances_accepted) for r in results]),
        ("acceptance rate", [pct(r.acceptance) for r in results]),
        ("first refusal", [(f"t={r.first_refusal['time']:g}s, event {r.first_refusal['event']} "
                            f"({r.first_refusal['id']}), {r.first_refusal['flavor']}: "
                            f"{r.first_refusal['cause']}")
                           if r.first_refusal else "none" for r in results]),
        ("refusals by cause", [", ".join(f"{c} {n}" for c, n in r.causes.most_common()) or "none"
                               for r in results]),
        ("peak hosts in use", [str(r.peak().get("hosts_in_use", 0)) for r in results]),
        ("mean hosts in use", [f"{r.peak().get('mean_hosts_in_use', 0):.1f}" for r in results]),
    ]
    classes = sorted({rc for r in results for rc in r.classes})
    for rc in classes:
        rows.append((f"peak {rc} utilization",
                     [pct(r.peak().get("utilization", {}).get(rc, 0.0)) for r in results]))
    for key in ("p50", "p95", "p99", "max"):
        rows.append((f"create request {key} (ms)",
                     [f"{r.latency().get(key, 0.0):.2f}" for r in results]))
    rows.append(("largest flavor fitting at the end",
                 [str(r.samples[-1].largest_fit) if r.samples else "-" for r in results]))
    rows.append(("replay wall time (s)", [f"{r.wall_seconds:.1f}" for r in results]))
    rows.append(("events per second", [f"{r.events / r.wall_seconds:.0f}" if r.wall_seconds
                                       else "-" for r in results]))
    return rows


def text_report(results: Sequence[RunResult]) -> str:
    """The summary table as text."""
    rows = summary_rows(results)
    width = max(len(name) for name, _ in rows)
    cols = [max(len(r.label), *(len(v[i]) for _, v in rows)) for i, r in enumerate(results)]
    lines = [" " * width + "  " + "  ".join(r.label.ljust(c) for r, c in zip(results, cols))]
    for name, values in rows:
        lines.append(name.ljust(width) + "  " + "  ".join(v.ljust(c) for v, c in zip(values, cols)))
    return "\n".join(lines)


def write_json(results: Sequence[RunResult], path: str) -> None:
    """Every configuration's result as one JSON document."""
    Path(path).write_text(json.dumps({"configurations": [r.to_dict() for r in results]},
                                     indent=2) + "\n", encoding="utf-8")


def html_report(results: Sequence[RunResult], *, title: str = "Berth simulation") -> str:
    """One self-contained HTML page: the summary table and every plot (inline SVG)."""
    esc = html.escape
    head = "".join(f"<th>{esc(r.label)}</th>" for r in results)
    body_rows = "".join(
        f"<tr><th scope='row'>{esc(name)}</th>" + "".join(f"<td>{esc(v)}</td>" for v in values)
        + "</tr>" for name, values in summary_rows(results))
    configs = "".join(f"<li><b>{esc(r.label)}</b>: {esc(r.config_note)}</li>" for r in results)
    figures = "".join(f"<figure id='{name}'>{svg_of(name, results)}</figure>" for name in PLOTS)
    trace = esc(results[0].trace) if results else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: left; }}
thead th {{ background: #eef; }}
.plots {{ display: grid; grid-template-columns: repeat(auto-fit, minmax(560px, 1fr)); gap: 1em; }}
figure {{ margin: 0; }} figure svg {{ width: 100%; height: auto; }}
</style></head><body>
<h1>{esc(title)}</h1>
<p>Trace: <code>{trace}</code>. Each configuration replayed the same events through Berth's
scheduler (request filters, placement's allocation candidates, filters, weighers, claims,
builds and deletes).</p>
<ul>{configs}</ul>
<table><thead><tr><th></th>{head}</tr></thead><tbody>{body_rows}</tbody></table>
<div class="plots">{figures}</div>
</body></html>
"""
