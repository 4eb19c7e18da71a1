#!/usr/bin/env python3
"""Plots mhcrun runs and traces as PNG files, without a display (issue 17).

Curves: one subplot per metric, iteration on the x axis, one line per file:

  tools/plot_metrics.py RUN.jsonl [RUN2.jsonl ...] -o OUT.png
      [--labels a,b] [--metrics lm_loss,grad_norm,tokens_per_second]

Each RUN is an `mhcrun --metrics` JSON-lines file, with either the
snake_case keys (lm_loss, grad_norm, ...) or the older spaced ones ("lm
loss", "grad norm", "num-zeros", ...), which are read as their snake_case
names; a golden-values file (goldens/*/golden_values_*.json, Megatron's
layout written by tools/metrics_to_golden.py) is read too. The default
metrics are lm_loss, grad_norm and tokens_per_second, and mtp_loss when a
file has it. Per-rank lists (peak_bytes_per_rank) are plotted as their
maximum over ranks, bytes as MiB.

Timeline: a Chrome trace-event file (`mhcc --trace`, `mhcrun --trace`) as a
Gantt chart, one row per rank (and per overlapping lane: sends and receives
below the rank's compute), colored by kind:

  tools/plot_metrics.py --timeline TRACE.json -o timeline.png

Bad input gives one line on stderr naming the file (and line) and exit 2;
the PNG is written to a temporary file beside OUT and renamed, so a failed
run leaves no partial image. Same input, same bytes (fixed size and dpi, no
version stamp in the PNG)."""
import argparse
import json
import math
import os
import sys
import tempfile

PROG = "plot_metrics"

# mhcrun's keys before and after the snake_case rename.
OLD_KEYS = {
    "lm loss": "lm_loss",
    "mtp loss": "mtp_loss",
    "grad norm": "grad_norm",
    "num-zeros": "num_zeros",
    "tokens per second": "tokens_per_second",
    "elapsed ms": "elapsed_ms",
    "learning rate": "learning_rate",
    "peak bytes per rank": "peak_bytes_per_rank",
    "peak bytes max": "peak_bytes_max",
    "device reserved bytes per rank": "device_reserved_bytes_per_rank",
}

# Every metric --metrics knows, with its axis title.
TITLES = {
    "lm_loss": "lm loss",
    "mtp_loss": "mtp loss",
    "grad_norm": "grad norm",
    "num_zeros": "zeros among the gradients",
    "tokens_per_second": "tokens per second",
    "tflops": "TFLOP/s",
    "elapsed_ms": "ms per iteration",
    "learning_rate": "learning rate",
    "peak_bytes_per_rank": "peak MiB (max over ranks)",
    "peak_bytes_max": "peak MiB (max over ranks)",
    "device_reserved_bytes_per_rank": "device reserved MiB\n(max over ranks)",
    "validation_lm_loss": "validation lm loss",
    "validation_mtp_loss": "validation mtp loss",
}
DEFAULT_METRICS = ["lm_loss", "mtp_loss", "grad_norm", "tokens_per_second"]

# Timeline: slice kind from the name Instr::describe() gives (FWD(s0,mb1),
# SEND act s0->s1 ...), else from the trace category.
KIND_OF_NAME = {
    "FWD": "forward",
    "BWD": "backward",
    "B": "backward",
    "W": "weight grad",
    "SEND": "send",
    "RECV": "recv",
    "OPTIM": "optimizer",
    "FREE": "free",
}
KIND_OF_CATEGORY = {"compute": "compute", "comm": "send", "optimizer": "optimizer", "free": "free"}
KIND_COLORS = {  # Okabe-Ito, readable by the color-blind
    "forward": "#0072B2",
    "backward": "#D55E00",
    "weight grad": "#E69F00",
    "compute": "#56B4E9",
    "send": "#009E73",
    "recv": "#CC79A7",
    "optimizer": "#000000",
    "other": "#999999",
}
# Lanes within a rank, top to bottom.
LANE_OF_KIND = {"send": 1, "recv": 2}
LANE_SUFFIX = {0: "", 1: " send", 2: " recv"}

LINE_STYLES = ["-", (0, (5, 2)), (0, (1, 1.5)), (0, (5, 2, 1, 2))]
FIG_WIDTH_IN = 8.0
DPI = 100


class BadInput(Exception):
    """One line for stderr: what is wrong, and where."""


def snake(key):
    return OLD_KEYS.get(key, key.replace(" ", "_").replace("-", "_"))


def number(value, where, key):
    """A plottable float from a JSON value: lists (per rank) give their max,
    null (a non-finite number as nlohmann writes it) gives NaN."""
    if value is None:
        return math.nan
    if isinstance(value, bool):
        raise BadInput(f'{where}: "{key}" is not a number')
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, list) and value and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
    ):
        return float(max(value))
    raise BadInput(f'{where}: "{key}" is not a number or a list of numbers')


def read_text(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file")
    except IsADirectoryError:
        raise BadInput(f"{path}: is a directory")
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not text (not UTF-8)")
    except OSError as e:
        raise BadInput(f"{path}: cannot read: {e.strerror}")


def golden_rows(path, doc):
    """Megatron's golden values ({"lm loss": {"values": {"1": ...}}, ...}) as
    rows, or None if DOC is not in that layout."""
    if not doc or not all(isinstance(v, dict) and isinstance(v.get("values"), dict) for v in doc.values()):
        return None
    rows = {}
    for key, series in doc.items():
        for step, value in series["values"].items():
            try:
                iteration = int(step)
            except ValueError:
                raise BadInput(f'{path}: golden "{key}" has a step "{step}" that is not an integer')
            rows.setdefault(iteration, {"iteration": iteration})[snake(key)] = number(
                value, f"{path}: step {step}", key
            )
    return [rows[i] for i in sorted(rows)]


def read_metrics(path):
    """The rows of one metrics file: dicts of snake_case key -> float."""
    text = read_text(path)
    lines = text.splitlines()
    if not any(line.strip() for line in lines):
        raise BadInput(f"{path}: empty: no metrics lines")
    # A golden-values file is one JSON object over several lines.
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and "iteration" not in doc:
            rows = golden_rows(path, doc)
            if rows is not None:
                return rows
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except ValueError as e:
            raise BadInput(f"{where}: not a JSON line ({e.msg})")
        if not isinstance(row, dict):
            raise BadInput(f"{where}: not a JSON object")
        if "iteration" not in row:
            raise BadInput(f'{where}: no "iteration"')
        iteration = row["iteration"]
        if isinstance(iteration, bool) or not isinstance(iteration, (int, float)):
            raise BadInput(f'{where}: "iteration" is not a number')
        values = {"iteration": float(iteration)}
        for key, value in row.items():
            if key != "iteration":
                values[snake(key)] = number(value, where, key)  # the message names the file's key
        rows.append(values)
    return rows


def atomic_png(fig, out):
    """Saves FIG to OUT through a temporary file in OUT's folder."""
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise BadInput(f"{out}: no such folder {folder}")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".plot_metrics.", suffix=".png", dir=folder)
    except OSError as e:
        raise BadInput(f"{out}: cannot write in {folder}: {e.strerror}")
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png", dpi=DPI, metadata={"Software": None})
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise BadInput(f"{out}: cannot write: {e.strerror}")
        raise


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "mhcc"
    matplotlib.rcParams["path.simplify"] = False
    import matplotlib.pyplot as plt

    return plt


def plot_curves(args):
    files = args.files
    if args.labels is not None:
        labels = args.labels.split(",")
        if len(labels) != len(files):
            plural = lambda n, word: f"{n} {word}" + ("" if n == 1 else "s")
            raise BadInput(f"--labels: {plural(len(labels), 'label')} for {plural(len(files), 'file')}")
    else:
        labels = [os.path.basename(f) for f in files]
    runs = [read_metrics(f) for f in files]
    present = set()
    for rows in runs:
        for row in rows:
            present.update(row)
    present.discard("iteration")
    if args.metrics is not None:
        metrics = [snake(m.strip()) for m in args.metrics.split(",") if m.strip()]
        if not metrics:
            raise BadInput("--metrics: no metric named")
        for m in metrics:
            if m not in TITLES and m not in present:
                raise BadInput(f"--metrics: unknown metric '{m}' (known: {', '.join(TITLES)})")
            if m not in present:
                raise BadInput(f"--metrics: no file has {m} ({', '.join(files)})")
    else:
        metrics = [m for m in DEFAULT_METRICS if m in present]
        if not metrics:
            raise BadInput(f"{files[0]}: none of {', '.join(DEFAULT_METRICS)} in any file; pick some with --metrics")

    plt = pyplot()
    fig, axes = plt.subplots(
        len(metrics), 1, figsize=(FIG_WIDTH_IN, 2.4 * len(metrics)), sharex=True, squeeze=False
    )
    for ax, metric in zip(axes[:, 0], metrics):
        for k, (rows, label) in enumerate(zip(runs, labels)):
            points = [(r["iteration"], r[metric]) for r in rows if metric in r]
            if not points:
                continue
            xs, ys = zip(*points)
            if "bytes" in metric:
                ys = [y / 2**20 for y in ys]
            # Dashes tell apart runs whose curves coincide (bit-identical layouts).
            ax.plot(xs, ys, label=label, linewidth=1.3, linestyle=LINE_STYLES[k % len(LINE_STYLES)],
                    marker="." if len(xs) <= 40 else None)
        ax.set_ylabel(TITLES.get(metric, metric.replace("_", " ")))
        ax.grid(True, linewidth=0.4, alpha=0.6)
    axes[0, 0].legend(loc="best", fontsize="small")
    axes[-1, 0].set_xlabel("iteration")
    axes[-1, 0].xaxis.get_major_locator().set_params(integer=True)
    fig.tight_layout()
    atomic_png(fig, args.output)


def read_trace(path):
    """The complete ("X") events of a Chrome trace, and the track names."""
    text = read_text(path)
    if not text.strip():
        raise BadInput(f"{path}: empty: no trace events")
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise BadInput(f"{path}:{e.lineno}: not JSON ({e.msg})")
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise BadInput(f'{path}: not a Chrome trace (no "traceEvents" list)')
    names, slices = {}, []
    for i, e in enumerate(events):
        where = f"{path}: traceEvents[{i}]"
        if not isinstance(e, dict):
            raise BadInput(f"{where}: not an object")
        if e.get("ph") == "M" and e.get("name") in ("thread_name", "process_name"):
            name = (e.get("args") or {}).get("name")
            if isinstance(name, str):
                names[(e.get("name"), e.get("pid"), e.get("tid"))] = name
            continue
        if e.get("ph") != "X":
            continue
        for key in ("ts", "dur"):
            v = e.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise BadInput(f'{where}: "X" event without a numeric "{key}"')
        if e["dur"] < 0:
            raise BadInput(f"{where}: negative duration {e['dur']}")
        slices.append(e)
    if not slices:
        raise BadInput(f'{path}: no trace events (no "X" complete events)')
    return slices, names


def slice_kind(e):
    name = str(e.get("name", ""))
    head = name.split("(")[0].split(" ")[0]
    if head in KIND_OF_NAME:
        kind = KIND_OF_NAME[head]
    else:
        kind = KIND_OF_CATEGORY.get(str(e.get("cat", "")), "other")
    return kind


def mb_label(name):
    """'FWD(s1,mb3)' -> '3': the microbatch, written on wide enough bars."""
    if "mb" not in name or "(" not in name:
        return ""
    tail = name.split("mb", 1)[1]
    digits = "".join(c for c in tail[:6] if c.isdigit()) if tail[:1].isdigit() else ""
    return digits


def plot_timeline(args):
    path = args.timeline
    slices, names = read_trace(path)
    t0 = min(e["ts"] for e in slices)
    t1 = max(e["ts"] + e["dur"] for e in slices)
    # Chrome traces count microseconds; the axis shows ms unless that is tiny.
    unit, scale = ("ms", 1e-3) if t1 - t0 >= 1000 else ("us", 1.0)
    span = max((t1 - t0) * scale, 1e-12)
    pids = sorted({e.get("pid", 0) for e in slices}, key=str)

    def track_name(pid, tid):
        thread = names.get(("thread_name", pid, tid), f"tid {tid}")
        if len(pids) > 1:
            return names.get(("process_name", pid, None), f"pid {pid}") + " / " + thread
        return thread

    # Rows: per track, lanes (compute, send, recv); slices that still overlap
    # within a lane go to further sub-rows (greedy, by start time).
    tracks = {}
    for e in slices:
        kind = slice_kind(e)
        if kind == "free":  # instantaneous bookkeeping, nothing to draw
            continue
        track = (e.get("pid", 0), e.get("tid", 0))
        tracks.setdefault(track, {}).setdefault(LANE_OF_KIND.get(kind, 0), []).append((e, kind))
    if not tracks:
        raise BadInput(f"{path}: no trace events to draw (only FREE slices)")
    # Times print with 3 decimals (%.3f us): touching slices may overlap by that.
    slack = max(2e-3, (t1 - t0) * 1e-6)
    rows = []  # (label, [(start_us, dur_us, kind, name)])
    for track in sorted(tracks, key=lambda t: (str(t[0]), str(t[1]))):
        for lane in sorted(tracks[track]):
            sub = []  # per sub-row: (end, bars)
            for e, kind in sorted(tracks[track][lane], key=lambda p: (p[0]["ts"], p[0]["dur"])):
                start, dur = e["ts"] - t0, e["dur"]
                bar = (start, dur, kind, str(e.get("name", "")))
                for row in sub:
                    if row[0] <= start + slack:
                        row[0] = start + dur
                        row[1].append(bar)
                        break
                else:
                    sub.append([start + dur, [bar]])
            for k, (_, bars) in enumerate(sub):
                label = track_name(*track) + LANE_SUFFIX.get(lane, "") + (f" ({k + 1})" if k else "")
                rows.append((label, bars))

    plt = pyplot()
    height = 1.3 + 0.32 * len(rows)
    fig, ax = plt.subplots(figsize=(FIG_WIDTH_IN * 1.25, height))
    kinds_seen = []
    for y, (_, bars) in enumerate(rows):
        for start, dur, kind, name in bars:
            start, dur = start * scale, dur * scale
            if kind not in kinds_seen:
                kinds_seen.append(kind)
            ax.broken_barh(
                [(start, max(dur, span * 5e-4))], (y - 0.4, 0.8),
                facecolors=KIND_COLORS[kind], edgecolor="white", linewidth=0.3,
            )
            text = mb_label(name) if kind in ("forward", "backward", "weight grad", "compute") else ""
            if text and dur > span * 0.012:
                ax.text(start + dur / 2, y, text, ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([label for label, _ in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, span)
    ax.set_xlabel(f"{unit} (numbers on bars: microbatch)", fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    title = names.get(("process_name", pids[0], None))
    ax.set_title(os.path.basename(path) + (f": {title}" if title else ""), fontsize=9, loc="left")
    ax.grid(True, axis="x", linewidth=0.4, alpha=0.5)
    order = [k for k in KIND_COLORS if k in kinds_seen]
    handles = [plt.Rectangle((0, 0), 1, 1, color=KIND_COLORS[k]) for k in order]
    ax.legend(handles, order, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=len(order),
              fontsize=7, frameon=False, borderaxespad=0.2, handlelength=1.2)
    fig.tight_layout()
    atomic_png(fig, args.output)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints the usage too)
        raise BadInput(message)


def parse(argv):
    p = Parser(prog="plot_metrics.py", description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", metavar="RUN.jsonl", help="mhcrun --metrics files (or golden values)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.png", help="the PNG to write")
    p.add_argument("--labels", help="comma-separated legend labels, one per file (default: the file names)")
    p.add_argument("--metrics", help="comma-separated snake_case metrics: " + ", ".join(TITLES))
    p.add_argument("--timeline", metavar="TRACE.json", help="draw this Chrome trace as a Gantt chart instead")
    args = p.parse_args(argv)
    if args.timeline is not None:
        if args.files or args.labels is not None or args.metrics is not None:
            raise BadInput("--timeline TRACE.json draws one trace: no metrics files, --labels or --metrics with it")
    elif not args.files:
        raise BadInput("no metrics file given (RUN.jsonl ..., or --timeline TRACE.json)")
    return args


def ensure_matplotlib():
    """Debian's python3-matplotlib is seen by /usr/bin/python3, not
    necessarily by another python3 earlier on PATH (pyenv): rerun under it."""
    try:
        import matplotlib  # noqa: F401
        return
    except ImportError:
        pass
    system = "/usr/bin/python3"
    if os.path.exists(system) and os.path.realpath(sys.executable) != os.path.realpath(system) \
            and not os.environ.get("PLOT_METRICS_REEXEC"):
        os.environ["PLOT_METRICS_REEXEC"] = "1"
        os.execv(system, [system, os.path.abspath(__file__)] + sys.argv[1:])
    print(f"{PROG}: needs matplotlib (Debian's python3-matplotlib; run tools/setup.sh)", file=sys.stderr)
    sys.exit(1)


def main(argv):
    try:
        args = parse(argv)
        ensure_matplotlib()
        if args.timeline is not None:
            plot_timeline(args)
        else:
            plot_curves(args)
    except BadInput as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
