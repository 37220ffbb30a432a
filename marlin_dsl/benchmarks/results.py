"""The results of `marlin-dsl bench`: the bandwidth floor and the ratios of each row, the sorted
table, bench.json and bench.png (matplotlib, optional)."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Iterable, Sequence

from .cases import ACT_BYTES, FP16, KIND_ORDER, QMM

def floor_bytes(weight_bytes: int, m: int, k: int, n: int) -> int:
    """Bytes a GEMM must move at least: the weights once, x [M, K] and y [M, N] in float16."""
    return int(weight_bytes) + m * k * ACT_BYTES + m * n * ACT_BYTES


def floor_us(nbytes: int, bandwidth_bytes_per_s: float) -> float:
    return nbytes / bandwidth_bytes_per_s * 1e6



def finish_rows(rows: list[dict], bandwidth: float) -> None:
    """Fill in floor_bytes, floor_us, pct_floor_bw, vs_qmm and vs_fp16 (in place)."""
    base = {(r["kind"], r["K"], r["N"], r["M"]): r.get("kernel_us") for r in rows}
    for r in rows:
        fb = floor_bytes(r["weight_bytes"], r["M"], r["K"], r["N"])
        r["floor_bytes"] = fb
        r["floor_us"] = floor_us(fb, bandwidth)
        t = r.get("kernel_us")
        r["pct_floor_bw"] = 100.0 * r["floor_us"] / t if t else None
        for key, kind in (("vs_qmm", "mlx_q4"), ("vs_fp16", "fp16")):
            ref = base.get((kind, r["K"], r["N"], r["M"]))
            r[key] = ref / t if ref and t else None


def sort_rows(rows: list[dict], shapes: Sequence[tuple[int, int]] = ()) -> list[dict]:
    order = {tuple(s): i for i, s in enumerate(shapes)}
    return sorted(rows, key=lambda r: (order.get((r["K"], r["N"]), len(order)), r["K"], r["N"],
                                       -1 if r.get("M") is None else r["M"],
                                       KIND_ORDER.get(r["kind"], 9), r["format"], r["pipeline"]))


def fmt_us(v: float | None) -> str:
    if v is None or not math.isfinite(v):
        return "-"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x" if v < 100 else f"{v:.0f}x"


TABLE_HEADERS = ["format", "pipeline", "K", "N", "M", "kernel us", "e2e us", "floor us",
                 "% floor bw", "vs mx.qmm", "vs fp16", "check"]


def table_rows(rows: Iterable[dict]) -> list[list[str]]:
    out = []
    for r in rows:
        if r.get("error"):
            check = "ERROR"
        elif r.get("rel_error") is None:
            check = "-"
        else:
            check = f"{'ok' if r['ok'] else 'FAIL'} {r['rel_error']:.0e}"
        pct = r.get("pct_floor_bw")
        out.append([r["format"], r["pipeline"], str(r["K"]), str(r["N"]), "-" if r.get("M") is None else str(r["M"]),
                    fmt_us(r.get("kernel_us")) + ("*" if r.get("host_bound") else ""), fmt_us(r.get("e2e_us")), fmt_us(r.get("floor_us")),
                    "-" if pct is None else f"{pct:.1f}", _ratio(r.get("vs_qmm")),
                    _ratio(r.get("vs_fp16")), check])
    return out


def format_table(rows: Iterable[dict]) -> str:
    body = table_rows(rows)
    headers = TABLE_HEADERS
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]
    right = {2, 3, 4, 5, 6, 7, 8, 9, 10}

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *map(line, body)])



def finish_doc(doc: dict, shapes, bandwidth: float, started: float) -> None:
    doc["rows"][:] = sort_rows(doc["rows"], shapes)
    finish_rows([r for r in doc["rows"] if r.get("M") is not None], bandwidth)
    doc["elapsed_s"] = round(time.perf_counter() - started, 1)
    doc["failed"] = sum(1 for r in doc["rows"] if r.get("error") or r.get("ok") is False)



def write_json(doc: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "bench.json"
    path.write_text(json.dumps(doc, indent=1, default=float))
    return path



# ----- the plot --------------------------------------------------------------------------------

def best_pipelines(rows: Iterable[dict]) -> dict[tuple[int, int, str], str]:
    """(K, N, format) -> the pipeline with the smallest geometric-mean kernel time over the Ms
    it has measured at all of them."""
    times: dict[tuple[int, int, str, str], dict[int, float]] = {}
    for r in rows:
        if r["kind"] == "marlin" and r.get("kernel_us"):
            times.setdefault((r["K"], r["N"], r["format"], r["pipeline"]), {})[r["M"]] = r["kernel_us"]
    best: dict[tuple[int, int, str], tuple[int, float, str]] = {}
    for (k, n, fmt, pl), by_m in times.items():
        score = (-len(by_m), sum(math.log(v) for v in by_m.values()) / len(by_m), pl)
        key = (k, n, fmt)
        if key not in best or score < best[key]:
            best[key] = score
    return {key: score[2] for key, score in best.items()}


def plot_bench(doc: dict, path: Path | str) -> Path:
    """bench.png: a panel per (K, N), kernel time (log) against M (log), a line per format (its
    best pipeline at that shape), mx.quantized_matmul and float16 mx.matmul solid, each line's
    bandwidth floor dashed in its colour. Needs matplotlib (ImportError otherwise)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullLocator

    rows = [r for r in doc["rows"] if r.get("M") is not None and r.get("kernel_us")]
    shapes = [tuple(s) for s in doc["settings"]["shapes_kn"]]
    shapes = [s for s in shapes if any((r["K"], r["N"]) == s for r in rows)] or [(0, 0)]
    best = best_pipelines(rows)
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 5), squeeze=False)
    palette = plt.get_cmap("tab10").colors
    formats = [f for f in doc["settings"]["formats"]]
    colours = {FP16: "black", QMM: "dimgray"}
    for i, f in enumerate(formats):
        colours[f] = palette[i % len(palette)]
    for ax, (k, n) in zip(axes[0], shapes):
        here = [r for r in rows if (r["K"], r["N"]) == (k, n)]
        lines: list[tuple[str, str, list[dict]]] = []
        for kind, label in (("fp16", FP16), ("mlx_q4", QMM)):
            sel = [r for r in here if r["kind"] == kind]
            if sel:
                lines.append((label, label, sel))
        for fmt in formats:
            pl = best.get((k, n, fmt))
            sel = [r for r in here if r["kind"] == "marlin" and r["format"] == fmt and r["pipeline"] == pl]
            if sel:
                lines.append((f"{fmt} ({pl})", fmt, sel))
        for label, colour_key, sel in lines:
            sel = sorted(sel, key=lambda r: r["M"])
            m = [r["M"] for r in sel]
            colour = colours.get(colour_key, "tab:blue")
            width = 2.2 if colour_key in (FP16, QMM) else 1.4
            ax.plot(m, [r["kernel_us"] for r in sel], marker="o", markersize=3, linewidth=width,
                    color=colour, label=label)
            ax.plot(m, [r["floor_us"] for r in sel], linestyle="--", linewidth=1.0, color=colour, alpha=0.6)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ms_here = sorted({r["M"] for r in here})
        ax.set_xticks(ms_here)
        ax.set_xticklabels([str(v) for v in ms_here])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_title(f"K = {k}, N = {n}")
        ax.set_xlabel("M (rows of x)")
        ax.set_ylabel("kernel time per launch (us)")
        ax.grid(True, which="both", alpha=0.25)
        handles, labels = ax.get_legend_handles_labels()
        handles.append(Line2D([], [], linestyle="--", color="gray"))
        labels.append("bandwidth floor (dashed, same colour)")
        ax.legend(handles, labels, fontsize=7, loc="upper left")
    env = doc.get("environment", {})
    fig.suptitle(f"marlin-dsl bench: {env.get('device_name', env.get('device', '?'))}, MLX "
                 f"{env.get('mlx', '?')}, {str(env.get('date', ''))[:10]}; copy bandwidth "
                 f"{env.get('copy_bandwidth_gb_s', '?')} GB/s", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path

