"""Options more than one command shares, so that each means the same everywhere."""

from __future__ import annotations

import argparse

from sandcell.backends.registry import ENV_BACKEND, LADDER


def add_backend_option(p: argparse.ArgumentParser) -> None:
    """``--backend``: the rung of the isolation ladder; the profile refuses one below its
    minimum, and nothing falls back to another rung."""
    p.add_argument(
        "--backend",
        choices=LADDER,
        default=None,
        help=f"isolation backend, weakest first: {', '.join(LADDER)} (default: "
        f"${ENV_BACKEND}, else the profile's; a backend below the profile's minimum is refused)",
    )
