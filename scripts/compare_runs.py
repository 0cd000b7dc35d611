"""Swarm experiments side by side: isolated vs ring vs grid vs full, or a codec sweep.

Each variant is one ``swarm run`` (a coordinator and ``peers`` peer processes on
this host) per seed, with the same settings except what the variant changes, and
the same budget of env steps per peer. "isolated" is the same peers with gossip
and replay sharing off (no gossip round falls within the budget), so every
difference is the communication.

    python scripts/compare_runs.py topology               # isolated, ring, grid, full (6 peers)
    python scripts/compare_runs.py codec                  # identity, fp16, int8, qsgd, topk:0.15, ef+topk:0.15:fp16
    python scripts/compare_runs.py codec --steps 6000 --seeds 0 1 --set dqn.lr=0.004

Writes ``<out>/results.csv`` (one row per variant and seed, each ``run_dir``
relative to ``<out>``), ``<out>/table.md`` (means over seeds) and
``<out>/compare.png`` (return against env steps per variant; final greedy return
against gossip bytes sent per peer) as each run ends, keeps every run folder under
``<out>/runs/`` and the comparison's settings in ``<out>/settings.json``, and ends
with one JSON line. Another call into the same ``--out`` (to finish a sweep cut
short, or to add variants or seeds) runs only the variant and seed pairs that
results.csv does not have yet, and the table and plot cover all of its rows; it
refuses an ``--out`` that holds a comparison of other settings. The settings default to
the learning benchmark's parameter-averaging swarm (``SWARM_PARAMS`` in
``scripts/bench_learning.py``, what its ``--swarm params`` runs) without its
topology and codec, with a greedy evaluation of 5 episodes every 500 env steps
(so ``--steps`` must be at least that). ``--set`` overrides them, except the keys
the experiment varies and ``seed`` and ``name``, which it refuses: each run sets
those itself; "isolated" also refuses ``gossip.exchange = gradients`` (the relay
would share gradients). A peer counts as solved at its first greedy evaluation that
reaches its run's ``eval.solve_return`` (from the run's ``config.json``: the env's
reward_threshold unless ``--set`` gives one; an env with neither leaves the solve
figures empty). A figure a run does not have (no evaluation, no finished
episode) is left empty in the CSV, ``-`` in the table and null in the JSON.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import re
import time
import warnings
from pathlib import Path

import numpy as np

from bench_learning import SWARM_PARAMS, _sigterm_exits, changed_keys
from swarm.cli import user_path
from swarm.errors import ConfigError, SwarmError
from swarm.experiment import load_spec, run_experiment
from swarm.experiment.launch import new_run_dir, read_csv
from swarm.scripting import check_seeds, run_script

VARIANTS: dict[str, dict[str, list[str]]] = {
    "topology": {
        "isolated": ["buffer.sharing=false"],   # and gossip.interval beyond the budget: see main()
        "ring": ["gossip.topology=ring"],
        "grid": ["gossip.topology=grid"],
        "full": ["gossip.topology=full"],
    },
    "codec": {
        "identity": ["gossip.codec=identity"],
        "fp16": ["gossip.codec=fp16"],
        "int8": ["gossip.codec=int8"],
        "qsgd": ["gossip.codec=qsgd"],
        "topk:0.15": ["gossip.codec=topk:0.15"],
        "ef+topk:0.15:fp16": ["gossip.codec=ef+topk:0.15:values=fp16"],
    },
}
#: At 4 peers a 2x2 grid is a ring; the topology experiment runs 6 (a 2x3 grid).
EXTRA = {"topology": ["peers=6"], "codec": ["peers=4"]}
#: The benchmark's parameter-averaging swarm without the settings the experiments vary
#: (with gossip.exchange = gradients, "isolated" peers would still share gradients).
BASE = [s for s in SWARM_PARAMS if not s.startswith(("peers=", "gossip.topology=", "gossip.codec="))]
#: results.csv's columns
FIELDS = ["variant", "seed", "final_mean_return", "final_eval_return", "solve_return", "first_solve_steps",
          "peers_solved", "gossip_mb_per_peer", "mb_per_peer", "max_cpu_s", "run_dir"]


def _mean(values: list) -> float | None:
    """The mean, or None if any value is missing (None or NaN)."""
    if not values or any(v is None or math.isnan(float(v)) for v in values):
        return None
    return float(np.mean([float(v) for v in values]))


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _num(v: str) -> float | None:
    """A figure of results.csv: None where it is empty (the run did not have it)."""
    return None if v == "" else float(v)


def one_run(sets: list[str], root: Path) -> dict:
    """Run ``swarm run`` with ``sets``; the run's figures, averaged over its peers."""
    root.mkdir(parents=True, exist_ok=True)
    log = io.StringIO()
    with _sigterm_exits():   # a SIGTERM ends the script as one, not as the launcher's KeyboardInterrupt
        result = run_experiment(None, sets, runs_root=root, stream=log)
    run_dir, rows = result.run_dir, result.summary
    if result.exit_code != 0:
        raise SystemExit(f"swarm run failed ({result.exit_code}) in {run_dir}:\n{log.getvalue()[-3000:]}")
    spec = load_spec(run_dir / "config.json")
    solve = spec.eval.solve_return   # the run's own: its env's reward_threshold unless --set
    solved = []
    if solve is not None:
        for r in range(spec.peers):
            solved += [int(e["env_steps"]) for e in read_csv(run_dir / f"peer{r}" / "evals.csv")
                       if float(e["eval_return"]) >= solve][:1]
    return {
        "final_mean_return": _mean([r.get("final_mean_return") for r in rows]),
        "final_eval_return": _mean([r.get("eval_return") for r in rows]),
        "solve_return": solve,
        "first_solve_steps": min(solved) if solved else None,
        "peers_solved": len(solved) if solve is not None else None,
        "gossip_mb_per_peer": float(np.mean([r.get("gossip_bytes_out", 0) for r in rows])) / 1e6,
        "mb_per_peer": float(np.mean([r.get("bytes_out", 0) for r in rows])) / 1e6,
        "max_cpu_s": max(float(r.get("cpu_s") or 0.0) for r in rows),
        "run_dir": str(run_dir),
    }


def run_curves(run_dir: Path) -> list[tuple[list[int], list[float]]]:
    """Each peer's running mean return against its env steps, from its metrics.csv."""
    curves = []
    for metrics in sorted(run_dir.glob("peer*/metrics.csv")):
        eps = read_csv(metrics)
        curves.append(([int(e["env_steps"]) for e in eps], [float(e["mean_return"]) for e in eps]))
    return curves


def mean_curve(curves: list[tuple[list[int], list[float]]], steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean over peers (and seeds) of the running mean return, on a common grid of env steps."""
    grid = np.linspace(0, steps, 101)[1:]
    ys = [np.interp(grid, x, y, left=np.nan) for x, y in curves if x]
    if not ys:
        return grid, np.full_like(grid, np.nan)
    with warnings.catch_warnings():   # before any peer's first episode ends, every value is NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        return grid, np.nanmean(ys, axis=0)


def plot(by_variant: dict[str, list[dict[str, str]]], out: Path, steps: int, title: str) -> bool:
    """``out/compare.png`` of results.csv's rows (False, and no plot, without matplotlib)."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, runs in by_variant.items():
        x, y = mean_curve([c for r in runs for c in run_curves(out / r["run_dir"])], steps)
        line, = left.plot(x, y, label=name)
        right.scatter([float(r["gossip_mb_per_peer"]) for r in runs],
                      [float(r["final_eval_return"] or "nan") for r in runs], color=line.get_color(), label=name)
    left.set(xlabel="env steps per peer", ylabel="return (mean of last 10 episodes, mean over peers)",
             title=title)
    right.set(xlabel="gossip MB sent per peer", ylabel="final greedy return (mean over peers)",
              title="return against bytes (one dot per seed)")
    if any(float(r["gossip_mb_per_peer"]) > 0 for runs in by_variant.values() for r in runs):
        right.set_xscale("symlog", linthresh=0.01)
    for ax in (left, right):
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "compare.png", dpi=100)
    plt.close(fig)
    return True


def report(out: Path, experiment: str, steps: int, rows: list[dict[str, str]]) -> tuple[str, dict, bool]:
    """Write ``out/table.md`` (means over seeds) and ``out/compare.png`` of every row of
    results.csv; the table, the means per variant, and whether there is a plot."""
    by_variant = {name: [r for r in rows if r["variant"] == name] for name in VARIANTS[experiment]}
    by_variant = {name: runs for name, runs in by_variant.items() if runs}

    def mean(runs: list[dict[str, str]], key: str) -> float | None:
        return _mean([_num(r[key]) for r in runs])

    seeds = sorted({int(r["seed"]) for r in rows})
    lines = [f"{experiment}, {steps} env steps per peer, seeds {seeds} (means over seeds)", "",
             "| variant | mean return | greedy return | first solve (steps) | peers solved | gossip MB/peer "
             "| CPU s (max/peer) |", "|---|---|---|---|---|---|---|"]
    summary = {}
    for name, runs in by_variant.items():
        solves = [float(r["first_solve_steps"]) for r in runs if r["first_solve_steps"] != ""]
        row = {"final_mean_return": mean(runs, "final_mean_return"),
               "final_eval_return": mean(runs, "final_eval_return"),
               "first_solve_steps": float(np.mean(solves)) if solves else None,
               "solved_runs": len(solves), "peers_solved": mean(runs, "peers_solved"),
               "gossip_mb_per_peer": mean(runs, "gossip_mb_per_peer"),
               "max_cpu_s": mean(runs, "max_cpu_s")}
        summary[name] = row
        first = (f"{row['first_solve_steps']:.0f} ({len(solves)}/{len(runs)} runs)" if solves
                 else f"- (0/{len(runs)} runs)")
        lines.append(f"| {name} | {_fmt(row['final_mean_return'])} | {_fmt(row['final_eval_return'])} | {first} | "
                     f"{_fmt(row['peers_solved'])} | {row['gossip_mb_per_peer']:.2f} | {row['max_cpu_s']:.1f} |")
    table = "\n".join(lines)
    (out / "table.md").write_text(table + "\n")
    return table, summary, plot(by_variant, out, steps, f"{experiment}: return per variant")


def write_results(path: Path, rows: list[dict]) -> None:
    """results.csv with ``rows``, replaced whole: a kill while it is written leaves the one before."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


def earlier_rows(out: Path, settings: dict) -> list[dict[str, str]]:
    """The rows of results.csv in ``out`` (none in a new folder), once ``out/settings.json``
    says they are of ``settings``; a ConfigError saying why not."""
    if not (out / "settings.json").exists():
        if (out / "results.csv").exists():
            raise ConfigError("holds a results.csv but no settings.json saying of what settings (an older "
                              "compare_runs wrote it): give another --out")
        return []
    try:
        had = json.loads((out / "settings.json").read_text())
        items = [f"experiment={had['experiment']}", *had["settings"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"cannot read its settings.json ({e}): give another --out") from None
    now = [f"experiment={settings['experiment']}", *settings["settings"]]
    if items != now:
        there, here = [x for x in items if x not in now], [x for x in now if x not in items]
        diff = (f"there: {' '.join(there) or '-'}; here: {' '.join(here) or '-'}" if there or here
                else "the same ones in another order")
        raise ConfigError(f"holds a comparison of other settings ({diff}): give another --out, or those "
                          "settings to add runs to it")
    return read_csv(out / "results.csv")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiment", choices=sorted(VARIANTS))
    ap.add_argument("--steps", type=int, default=4000,
                    help="env steps per peer in every run (at least the evaluation interval, 500)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--only", nargs="+", metavar="VARIANT",
                    help="run only these variants: " + "; ".join(f"{e}: {', '.join(v)}" for e, v in VARIANTS.items()))
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    help="a spec override for every run, e.g. --set dqn.lr=0.004 (not of a key the experiment "
                         "varies, nor seed or name)")
    ap.add_argument("--out", type=lambda v: Path(user_path(v)), default=None,
                    help="output folder (default a new runs/compare-<experiment>-<time>, with -1, -2 ... added "
                         "when another comparison took that name)")
    args = ap.parse_args()
    if args.steps < 1:
        ap.error("--steps must be >= 1")
    check_seeds(ap, args.seeds)
    variants = VARIANTS[args.experiment]
    unknown = sorted(set(args.only or []) - set(variants))
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; {args.experiment} has {sorted(variants)}")
    if args.only:
        variants = {k: v for k, v in variants.items() if k in args.only}
    # the variants' settings and each run's seed and name come after --set, so a --set of
    # one of those keys would be silently overridden
    varied = changed_keys([x for sets in VARIANTS[args.experiment].values() for x in sets])
    if args.experiment == "topology":
        varied.add("gossip.interval")   # "isolated" sets it
    taken = sorted(changed_keys(args.overrides) & (varied | {"seed", "name"}))
    if taken:
        ap.error(f"--set {', '.join(taken)}: each run sets it itself ({args.experiment} varies "
                 f"{', '.join(sorted(varied))}; the seed comes from --seeds, the name from the variant)")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        ap.error(f"--out {args.out}: is a file, not a folder")
    common = (BASE + EXTRA[args.experiment]
              + [f"budget.env_steps={args.steps}", "budget.stop_when_solved=false", "eval.every=500",
                 "eval.episodes=5"] + args.overrides)

    # every run's settings checked before any starts (a bad one would fail deep in the runs)
    plan: list[tuple[str, int, str, list[str]]] = []
    for name, sets in variants.items():
        if name == "isolated":
            sets = sets + [f"gossip.interval={args.steps + 1}"]
        tag = re.sub(r"[^A-Za-z0-9._-]", "_", name)     # a run name and folder
        for seed in args.seeds:
            run_sets = common + sets + [f"seed={seed}", f"name={args.experiment}-{tag}"]
            try:
                spec = load_spec(None, run_sets)
            except ConfigError as e:
                ap.error(f"{name}, seed {seed}: {e}")
            if name == "isolated" and spec.gossip.exchange != "params":
                # the relay sends gradients every turn whatever gossip.interval, and counts
                # them outside the gossip bytes: "isolated" would share and read 0 MB
                ap.error(f"isolated: gossip.exchange = {spec.gossip.exchange}: its peers would still share "
                         "gradients; the topology experiment needs gossip.exchange = params")
            if spec.eval.every == 0:
                ap.error("eval.every = 0: the comparison reports each run's greedy evaluations")
            if args.steps < spec.eval.every:
                ap.error(f"--steps {args.steps} is below eval.every = {spec.eval.every}: no run would evaluate "
                         "its greedy policy")
            plan.append((name, seed, tag, run_sets))
    settings = {"experiment": args.experiment, "settings": common}
    rows: list[dict[str, str]] = []   # results.csv's, as it holds them
    if args.out is not None and args.out.is_dir():
        try:
            rows = earlier_rows(args.out, settings)
        except ConfigError as e:
            ap.error(f"--out {args.out}: {e}")
    # the last check: a refused command line leaves no folder behind
    if args.out is None:   # one of its own, as `swarm run` makes: another started this second has -1
        try:
            out = new_run_dir(Path("runs"), f"compare-{args.experiment}")
        except SwarmError as e:
            ap.error(f"{e}; give another folder with --out")
    else:
        out = args.out
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            ap.error(f"--out {out}: cannot create it ({e.strerror or e})")
    if not (out / "settings.json").exists():
        (out / "settings.json").write_text(json.dumps(settings, indent=1) + "\n")
    print(f"{args.experiment}: {list(variants)}, seeds {args.seeds}, {args.steps} env steps per peer\n"
          f"settings: {' '.join(common)}", flush=True)

    results = out / "results.csv"
    done = {(r["variant"], r["seed"]) for r in rows}
    shown = None
    for name, seed, tag, run_sets in plan:
        if (name, str(seed)) in done:
            print(f"{name} seed {seed}: in {results} already, not run again", flush=True)
            continue
        t0 = time.monotonic()
        r = one_run(run_sets, out / "runs" / f"{tag}-{seed}")
        r.update(variant=name, seed=seed, run_dir=os.path.relpath(r["run_dir"], out))
        print(f"{name} seed {seed}: return {_fmt(r['final_mean_return'])}, eval {_fmt(r['final_eval_return'])}, "
              f"first solve {r['first_solve_steps'] or '-'}, {r['gossip_mb_per_peer']:.2f} MB gossip per "
              f"peer, {r['max_cpu_s']:.1f} s CPU ({time.monotonic() - t0:.0f} s)", flush=True)
        write_results(results, rows + [r])   # kept as each run ends: a sweep cut short loses only its last run
        rows = read_csv(results)
        shown = report(out, args.experiment, args.steps, rows)
    # with every pair done already, the table and plot of results.csv as it is
    table, summary, plotted = shown or report(out, args.experiment, args.steps, rows)
    print("\n" + table)
    print(f"plot: {out / 'compare.png'}" if plotted
          else "no plot: matplotlib is not installed (pip install -e '.[plots]')")
    print(f"results: {out}")
    print(json.dumps({"experiment": args.experiment, "steps": args.steps,
                      "seeds": sorted({int(r["seed"]) for r in rows}), "out": str(out), "variants": summary}))


if __name__ == "__main__":
    run_script(main, "compare_runs")
