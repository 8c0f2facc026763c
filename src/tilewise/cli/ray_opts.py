"""`--ray [ADDRESS]` and `--workers N`, shared by `tune FAMILY`, `tune model` and `sweep` (Ray loads only then;
the cluster itself is `tilewise.tune.cluster`)."""

from __future__ import annotations

import argparse

from tilewise.cli import common

LOCAL = "local"  # the const of a bare --ray (tilewise.tune.cluster.LOCAL)


def add_ray(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ray", nargs="?", const=LOCAL, default=None, metavar="ADDRESS",
                   help="spread the work over a Ray cluster: no ADDRESS starts a local one, `auto` or HOST:PORT "
                        "joins a running one (`ray start --head`); needs tilewise[ray]. Ctrl-C stops the "
                        "cluster's work and keeps what is stored: the same command resumes")
    p.add_argument("--workers", type=common.positive, default=None, metavar="N",
                   help="device workers with --ray (default: one per GPU of the cluster, else one)")
