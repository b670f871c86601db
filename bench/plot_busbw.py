#!/usr/bin/env python3
"""plot_busbw.py: busbw against message size, from the tables the benchmarks print.

Reads nccl-tests style tables (kolo-bench, mpi-allreduce-bench,
gloo-allreduce-bench: '#'-comment header lines naming 'nranks N', then rows
'size count type redop time(us) algbw busbw #wrong [cpu-s/GB]'; kolorun's
'[0]<stdout>:' prefix is stripped), plots the allreduce bus bandwidth of
each series against the size (log2 axis), one panel per panel name, and
writes a PNG (matplotlib, Agg backend: no display needed). Optionally also
writes a Markdown table of chosen sizes (--markdown).

    bench/plot_busbw.py --out docs/img/one_node_busbw.png --title "One node" \\
        -s "N=2|kolo, user memory=d/kolo-user-n2-r0.table,d/kolo-user-n2-r1.table" \\
        -s "N=2|Open MPI, in place=d/mpi-n2-r0.table" ...

A series is 'PANEL|LABEL=FILE[,FILE...]' (PANEL optional; the last "=" starts the files). With several
files (repeated runs) each size takes the run with the lowest time (best of
the runs) and its cpu-s/GB. busbw is recomputed from the time (the tables
print 2 decimals): size / time x 2(n-1)/n, n from the header's 'nranks N'.
--rate-gbit R plots busbw as a fraction of a link rate of R Gbit/s.
Debian's python3-matplotlib; standard library otherwise.
"""
import argparse
import math
import re
import sys

ROW = re.compile(r"^\s*(\d+)\s+\d+\s+\S+\s+\S+\s+([0-9.]+)\s+\S+\s+\S+\s+\S+(?:\s+(\S+))?\s*$")


def read_table(path):
    """{size: (time_us, cpu_s_per_gb or None)} and nranks from one table file."""
    rows, nranks = {}, None
    with open(path) as f:
        for line in f:
            line = re.sub(r"^\[\d+\]<stdout>:", "", line.rstrip("\n"))
            if line.startswith("#"):
                m = re.search(r"nranks (\d+)", line)
                if m and nranks is None:
                    nranks = int(m.group(1))
                continue
            m = ROW.match(line)
            if m:
                cpu = m.group(3)
                try:
                    cpu = float(cpu) if cpu is not None else None
                except ValueError:
                    cpu = None
                rows[int(m.group(1))] = (float(m.group(2)), cpu)
    return rows, nranks


def parse_series(spec):
    head, _, files = spec.rpartition("=")  # labels may hold "=" (N=2), paths not
    if not files:
        sys.exit("plot_busbw.py: a series is 'PANEL|LABEL=FILE[,FILE...]', got %r" % spec)
    panel, _, label = head.rpartition("|")
    best, nranks = {}, None
    for path in files.split(","):
        rows, n = read_table(path)
        nranks = nranks or n
        for size, (t, cpu) in rows.items():
            if t > 0 and (size not in best or t < best[size][0]):
                best[size] = (t, cpu)
    if not best:
        sys.exit("plot_busbw.py: no rows in %s" % files)
    if not nranks:
        sys.exit("plot_busbw.py: no 'nranks N' in the header of %s" % files)
    return {"panel": panel, "label": label, "rows": best, "nranks": nranks}


def busbw_gbps(size, t_us, n):
    return size / (t_us * 1e3) * 2 * (n - 1) / n


def size_label(b):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return "%d %s" % (b >> shift, unit)
    return "%d B" % b


def plot(series, out, title, rate_gbit, ylog):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    for s in series:
        if s["panel"] not in panels:
            panels.append(s["panel"])
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), squeeze=False,
                             sharey=True)
    markers = "os^vD<>p"
    for pi, panel in enumerate(panels):
        ax = axes[0][pi]
        sizes_all = set()
        for si, s in enumerate([s for s in series if s["panel"] == panel]):
            sizes = sorted(s["rows"])
            sizes_all.update(sizes)
            y = [busbw_gbps(b, s["rows"][b][0], s["nranks"]) for b in sizes]
            if rate_gbit:
                y = [v * 8 / rate_gbit for v in y]
            ax.plot(sizes, y, marker=markers[si % len(markers)], markersize=3.5, linewidth=1.3,
                    label=s["label"])
        ax.set_xscale("log", base=2)
        if ylog:
            ax.set_yscale("log")
        lo, hi = min(sizes_all), max(sizes_all)
        step = max(1, round(math.log2(hi / lo) / 8)) if hi > lo else 1
        ticks = [1 << e for e in range(int(math.log2(lo)), int(math.log2(hi)) + 1, step)]
        ax.set_xticks(ticks)
        ax.set_xticklabels([size_label(t) for t in ticks], rotation=45, ha="right", fontsize=8)
        ax.minorticks_off() if not ylog else None
        ax.set_xlabel("message size")
        if pi == 0:
            ax.set_ylabel("busbw / link rate" if rate_gbit else "busbw (GB/s)")
        ax.set_title(panel, fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=90)


def markdown(series, sizes, cpu_sizes, out):
    """One row per series: time at the smallest size, busbw at `sizes`, cpu-s/GB at `cpu_sizes`."""
    head = ["setting", "system", "4 B (us)" if sizes else "smallest (us)"]
    head += ["busbw %s" % size_label(b) for b in sizes]
    head += ["cpu-s/GB %s" % size_label(b) for b in cpu_sizes]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in series:
        rows = s["rows"]
        small = min(rows)
        cells = [s["panel"], s["label"], "%.1f" % rows[small][0]]
        for b in sizes:
            cells.append("%.2f" % busbw_gbps(b, rows[b][0], s["nranks"]) if b in rows else "-")
        for b in cpu_sizes:
            cpu = rows.get(b, (0, None))[1]
            cells.append("%.2f" % cpu if cpu is not None else "-")
        lines.append("| " + " | ".join(cells) + " |")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


def parse_size(s):
    m = re.fullmatch(r"(\d+)([KMG]?)", s)
    if not m:
        sys.exit("plot_busbw.py: bad size %r" % s)
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-s", "--series", action="append", required=True,
                    help="PANEL|LABEL=FILE[,FILE...] (repeatable)")
    ap.add_argument("--out", help="PNG to write")
    ap.add_argument("--title", default="")
    ap.add_argument("--rate-gbit", type=float, default=0, help="plot busbw / R (link rate in Gbit/s)")
    ap.add_argument("--linear", action="store_true", help="linear busbw axis (default: log)")
    ap.add_argument("--markdown", help="also write a Markdown table here")
    ap.add_argument("--sizes", default="64K 1M 16M 64M", help="busbw columns of --markdown")
    ap.add_argument("--cpu-sizes", default="16M 64M", help="cpu-s/GB columns of --markdown")
    a = ap.parse_args()
    series = [parse_series(s) for s in a.series]
    if a.out:
        plot(series, a.out, a.title, a.rate_gbit, not a.linear)
    if a.markdown:
        markdown(series, [parse_size(x) for x in a.sizes.split()],
                 [parse_size(x) for x in a.cpu_sizes.split()], a.markdown)


if __name__ == "__main__":
    main()
