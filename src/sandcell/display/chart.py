"""A figure's chart data, as read back from a sandbox: validated, never trusted.

Inside the sandbox the display module reads a drawn matplotlib figure into plain JSON in the
shapes of E2B's ``Result.chart`` (line, scatter, bar, pie, box and whisker, and a ``superchart``
of several axes). The program could have written any JSON there, so :func:`checked_chart`
accepts only exactly those shapes: known fields only, each of its type, numbers finite, every
text and list within a cap; a superchart holds charts, not supercharts. What it returns is the
validated model written out again, never the sandbox's text.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandcell.errors import SandcellError

__all__ = ["CHART_TYPE", "MAX_CHART_ELEMENTS", "MAX_CHART_POINTS", "ChartRefused", "checked_chart"]

CHART_TYPE = "application/vnd.sandcell.chart+json"
"""The media type a figure's chart data travels under (the display module's ``CHART_TYPE``)."""
MAX_CHART_ELEMENTS = 1024
MAX_CHART_POINTS = 100_000
_MAX_TEXT = 1000
_MAX_TICKS = 1000

Text = Annotated[str, Field(max_length=_MAX_TEXT)]
Number = Annotated[float, Field(allow_inf_nan=False)]
Coordinate = Number | Text
Scale = Literal[
    "linear",
    "datetime",
    "categorical",
    "log",
    "symlog",
    "logit",
    "function",
    "functionlog",
    "asinh",
    "unknown",
]


class ChartRefused(SandcellError, ValueError):
    """The chart data is not a chart of the accepted shapes; the message says what was wrong."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class _Labels(_Model):
    title: Text | None
    x_label: Text | None
    y_label: Text | None
    x_unit: Text | None
    y_unit: Text | None


class PointData(_Model):
    label: Text
    points: Annotated[
        list[Annotated[list[Coordinate], Field(min_length=2, max_length=2)]],
        Field(max_length=MAX_CHART_POINTS),
    ]


class _PointChart(_Labels):
    x_ticks: Annotated[list[Coordinate], Field(max_length=_MAX_TICKS)]
    x_tick_labels: Annotated[list[Text], Field(max_length=_MAX_TICKS)]
    x_scale: Scale
    y_ticks: Annotated[list[Coordinate], Field(max_length=_MAX_TICKS)]
    y_tick_labels: Annotated[list[Text], Field(max_length=_MAX_TICKS)]
    y_scale: Scale
    elements: Annotated[list[PointData], Field(max_length=MAX_CHART_ELEMENTS)]


class LineChart(_PointChart):
    type: Literal["line"]


class ScatterChart(_PointChart):
    type: Literal["scatter"]


class BarData(_Model):
    label: Text
    group: Text
    value: Number


class BarChart(_Labels):
    type: Literal["bar"]
    elements: Annotated[list[BarData], Field(max_length=MAX_CHART_ELEMENTS)]


class PieData(_Model):
    label: Text
    angle: Number
    radius: Number


class PieChart(_Model):
    type: Literal["pie"]
    title: Text | None
    elements: Annotated[list[PieData], Field(max_length=MAX_CHART_ELEMENTS)]


class BoxAndWhiskerData(_Model):
    label: Text
    min: Number
    first_quartile: Number
    median: Number
    third_quartile: Number
    max: Number
    outliers: Annotated[list[Number], Field(max_length=MAX_CHART_POINTS)]


class BoxAndWhiskerChart(_Labels):
    type: Literal["box_and_whisker"]
    elements: Annotated[list[BoxAndWhiskerData], Field(max_length=MAX_CHART_ELEMENTS)]


OneChart = Annotated[
    LineChart | ScatterChart | BarChart | PieChart | BoxAndWhiskerChart,
    Field(discriminator="type"),
]


class SuperChart(_Model):
    type: Literal["superchart"]
    title: Text | None
    elements: Annotated[list[OneChart], Field(min_length=1, max_length=MAX_CHART_ELEMENTS)]


class _Chart(_Model):
    chart: Annotated[OneChart | SuperChart, Field(discriminator="type")]


def checked_chart(text: str) -> str:
    """``text`` validated as one chart, written out again; raises :class:`ChartRefused`."""
    try:
        # Strict JSON: Python's parser would take NaN and Infinity, which JSON has not.
        doc = json.loads(text, parse_constant=_no_constant)
        chart = _Chart.model_validate({"chart": doc}).chart
    except ChartRefused:
        raise
    except (ValueError, RecursionError) as exc:
        raise ChartRefused(
            f"the chart data is not a chart sandcell accepts: {_first(exc)}"
        ) from None
    return chart.model_dump_json()


def _no_constant(name: str) -> object:
    raise ChartRefused(f"the chart data holds {name}, which is not JSON")


def _first(exc: BaseException) -> str:
    if isinstance(exc, ValidationError) and exc.errors():
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"][1:]) or "the chart"
        return f"{where}: {err['msg']}"[:300]
    return f"{type(exc).__name__}"
