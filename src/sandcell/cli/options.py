"""Options more than one command shares, so that each means the same everywhere."""

from __future__ import annotations

import argparse
from pathlib import Path

from sandcell.backends.registry import ENV_BACKEND, LADDER
from sandcell.errors import ConfigError
from sandcell.spec import LANGUAGES, Language, language_named


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


def add_lang_option(p: argparse.ArgumentParser, *, what: str = "the program's") -> None:
    """``--lang``: the program's language, by any name :data:`sandcell.spec.LANGUAGE_ALIASES`
    knows (``js`` is javascript, ``ts`` typescript), stored as its full name."""
    p.add_argument(
        "--lang",
        type=_language,
        default="python",
        metavar="LANG",
        help=f"{what} language: {', '.join(LANGUAGES)} (or js, ts, sh; default python)",
    )


def _language(name: str) -> Language:
    try:
        return language_named(name)
    except ConfigError as exc:
        # argparse reports this as `argument --lang: <message>` and exits 2, as for a choice.
        raise argparse.ArgumentTypeError(str(exc)) from None


def check_out_dir(out: Path | None) -> None:
    """Refuse an ``--out`` that can never take files before anything runs: refused after the
    run, the run's stdout would be lost behind the error."""
    if out is not None and out.exists() and not out.is_dir():
        raise ConfigError(
            f"--out {str(out)!r} exists and is not a directory; pass a directory (a missing one "
            "is created)"
        )
