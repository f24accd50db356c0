"""Draw docs/trace-cancelled-run.png: the real spans of the example agent, cancelled while its paid
call is in flight, then resumed (docs/observability.md shows it).

The spans come from the OpenTelemetry SDK (an in-memory exporter) as haltwise records them; the
script only draws them: one bar per span on a shared clock, coloured by what the step's status
or the run's state says, the run span's events as markers, the link from the resumed attempt to
the first one as an arrow.

usage: python scripts/trace_timeline.py [OUT.png]   (needs matplotlib: `make bench` installs it)
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
COLOURS = {
    "committed": "#2e7d32",
    "interrupted": "#ef6c00",
    "compensated": "#6a1b9a",
    "unknown": "#757575",
    "failed": "#c62828",
    "completed": "#1565c0",
    "cancelled": "#90a4ae",
}


def record(store: str) -> list[Any]:
    """Run the example agent, cancel it during its paid call, resume it; its spans."""
    import anyio
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    sys.path.insert(0, str(ROOT / "examples"))
    import research_agent

    import haltwise

    gate = Path(os.environ["DEMO_API_GATE"])

    async def main() -> None:
        async with haltwise.Runtime(store) as rt:
            handle = await rt.start(research_agent.research, task_id="trace-demo")
            while not any(
                s.tool == "charge_summary_api" for s in (await rt.status("trace-demo")).steps
            ):
                await anyio.sleep(0.01)
            await handle.cancel(reason="user")
            gate.touch()  # the paid API answers: the finish step completes within its grace
            await handle.outcome()
            await (await rt.resume("trace-demo")).outcome()

    anyio.run(main)
    return list(exporter.get_finished_spans())


def draw(spans: list[Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spans = sorted(spans, key=lambda s: s.start_time)
    zero = spans[0].start_time
    runs = [s for s in spans if s.name.startswith("invoke_workflow")]
    rows: list[Any] = []
    for run in runs:
        rows.append(run)
        rows += [s for s in spans if s.parent and s.parent.span_id == run.context.span_id]
    figure, axes = plt.subplots(figsize=(10, 0.32 * len(rows) + 1.6), dpi=110)
    where: dict[int, int] = {}
    for y, span in enumerate(rows):
        where[span.context.span_id] = y
        attributes = dict(span.attributes or {})
        status = attributes.get("haltwise.step.status") or attributes.get("haltwise.run.state")
        start, end = (span.start_time - zero) / 1e6, (span.end_time - zero) / 1e6
        run_span = span.name.startswith("invoke_workflow")
        axes.barh(
            y,
            max(end - start, 0.5),
            left=start,
            height=0.6,
            color=COLOURS.get(str(status), "#bdbdbd"),
            alpha=0.55 if run_span else 0.9,
        )
        label = span.name + (f"  [{status}]" if status else "")
        if run_span and attributes.get("haltwise.cancel.reason"):
            label += f"  reason={attributes['haltwise.cancel.reason']}"
        axes.text(end + 3, y, label, va="center", fontsize=7.5)
        for event in span.events:
            at = (event.timestamp - zero) / 1e6
            marker = "v" if event.name.endswith("requested") else "s"
            axes.plot(at, y, marker=marker, color="black", markersize=5)
            side = "right" if event.name.endswith("requested") else "left"
            axes.text(at, y - 0.45, event.name.removeprefix("haltwise."), fontsize=6.5, ha=side)
    for run in runs:
        for link in run.links:
            if link.context.span_id in where:
                axes.annotate(
                    "",
                    xy=((run.start_time - zero) / 1e6, where[link.context.span_id]),
                    xytext=((run.start_time - zero) / 1e6, where[run.context.span_id]),
                    arrowprops={"arrowstyle": "->", "color": "#1565c0", "linestyle": "dashed"},
                )
    axes.set_yticks([])
    axes.invert_yaxis()
    axes.set_xlabel("milliseconds")
    axes.set_title(
        "research: cancelled during its paid call (finished within grace), then resumed",
        fontsize=9,
    )
    axes.set_xlim(right=axes.get_xlim()[1] * 1.35)
    figure.tight_layout()
    figure.savefig(out)


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "trace-cancelled-run.png"
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["DEMO_WORLD"] = str(Path(tmp, "world"))
        os.environ["DEMO_LATENCY"] = "0.02"
        os.environ["DEMO_API_GATE"] = str(Path(tmp, "api-answers"))
        spans = record(f"sqlite:///{tmp}/trace.db")
    draw(spans, out)
    print(f"wrote {out} ({len(spans)} spans)")


if __name__ == "__main__":
    main()
