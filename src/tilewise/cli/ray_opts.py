"""`--ray [ADDRESS]` and `--workers N`, shared by `tune FAMILY`, `tune model` and `sweep` (Ray loads only then)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from tilewise.cli import common

LOCAL = "local"  # --ray with no address: start a cluster in this process (`ray.init()`)


def add_ray(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ray", nargs="?", const=LOCAL, default=None, metavar="ADDRESS",
                   help="spread the work over a Ray cluster: no ADDRESS starts a local one, `auto` or HOST:PORT "
                        "joins a running one (`ray start --head`); needs tilewise[ray]")
    p.add_argument("--workers", type=common.positive, default=None, metavar="N",
                   help="device workers with --ray (default: one per GPU of the cluster, else one)")


def check_ray(args: argparse.Namespace) -> None:
    """Refuse --workers without --ray, and a missing Ray, before any work."""
    from tilewise.errors import ConfigError

    if getattr(args, "workers", None) and not getattr(args, "ray", None):
        raise ConfigError("--workers applies only with --ray", "add --ray (a local cluster) or drop --workers")
    if getattr(args, "ray", None):
        from tilewise.tune.cluster import import_ray

        import_ray()


def start_cluster(args: argparse.Namespace, backends: Sequence[str], job: str, prefer: str | None = None) -> Any:
    """A `Cluster` with its workers started on `args.device` (close it when done, also on Ctrl-C)."""
    from tilewise.tune.cluster import Cluster

    cluster = Cluster(None if args.ray == LOCAL else args.ray)
    try:
        cluster.start(args.device, backends, job, prefer, args.workers)
    except BaseException:
        cluster.close()
        raise
    return cluster


def group_line(fingerprint: str, workers: Sequence[Any]) -> str:
    names = ", ".join(w.name for w in workers[:3]) + (f" and {len(workers) - 3} more" if len(workers) > 3 else "")
    return f"ray: {len(workers)} worker{'s' * (len(workers) != 1)} on {workers[0].info.name} [{fingerprint}]: {names}"
