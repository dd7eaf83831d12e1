"""Rich outputs for a terminal: values and tables as text, figures saved as files.

Shared by the commands that show outputs (``run --display``, sessions, ``ask``). The text forms
come from the sandbox, so every character that could drive a terminal is made visible
(:func:`~sandcell.validation.neutralise`) whatever the output is printed to.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sandcell.artifacts import ArtifactStore
from sandcell.spec import DisplayOutput
from sandcell.validation import neutralise

__all__ = ["render_outputs"]


def render_outputs(outputs: Sequence[DisplayOutput], store: ArtifactStore, out_dir: Path) -> str:
    """The outputs as terminal text, in order, each under an ``Out[N]:`` label.

    A value or table shows its ``text/plain`` form (a pandas table's own aligned text); a
    figure's images are copied from ``store`` into ``out_dir`` (``out_dir/display/NNNN.png``,
    created only when there is a figure) and their paths are shown. Empty for no outputs.

    Raises:
        ConfigError: if ``out_dir`` cannot be written or an image is missing from the store.
    """
    blocks: list[str] = []
    for n, output in enumerate(outputs, start=1):
        label = f"Out[{n}]:"
        if output.kind == "figure":
            paths = store.copy_out(output.artifacts, out_dir)
            lines = [f"{label} figure"]
            lines += [
                f"  {art.media_type}: {path}"
                for art, path in zip(output.artifacts, paths, strict=True)
            ]
            blocks.append("\n".join(lines))
            continue
        text = neutralise(output.data.get("text/plain", "")).rstrip("\n")
        # A one-line value stays on the label's line, as a notebook shows it; a table below it.
        sep = " " if output.kind == "value" and "\n" not in text else "\n"
        blocks.append(f"{label}{sep}{text}")
    return "".join(block + "\n" for block in blocks)
