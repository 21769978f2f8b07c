"""A Floodway whose one kind runs async jobs on the simulator, for the SIGKILL test:
``python -m floodway.cli worker --app tests.integration.upstream_worker:fw`` with the env
FLOODWAY_DATABASE and SIM_URL."""

from __future__ import annotations

import os

from floodway import Floodway, Settings


def build(database: str, sim_url: str) -> Floodway:
    kinds = {"gen": {"adapter": "simulated", "url": sim_url, "poll_after": "1s"}}
    return Floodway(settings=Settings(database=database, kinds=kinds))


fw = (
    build(os.environ["FLOODWAY_DATABASE"], os.environ["SIM_URL"])
    if "SIM_URL" in os.environ
    else None
)
