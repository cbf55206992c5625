"""``zkctl datagen``: write numbered JSON records into a directory over time (input for the demo pipelines).

Thin: ``broker_sim.sim.datagen`` does the work. Not registered here; ``cli/main.py`` adds it to the group.
"""

from __future__ import annotations

from pathlib import Path

import click

from broker_sim.sim.datagen import SCHEMA_DDL, DatagenConfig, generate
from cli.common import MACHINE_FORMATS, output_format, render, with_output


@click.command("datagen")
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="directory to write into (created if missing)",
)
@click.option("--records", type=click.IntRange(min=0), default=1000, show_default=True, help="records to write")
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    show_default="as fast as possible",
    help="records per second",
)
@click.option("--batch", type=click.IntRange(min=1), default=100, show_default=True, help="records per file")
@click.option("--start-id", type=click.IntRange(min=0), default=0, show_default=True, help="id of the first record")
@click.option("--duration", type=click.FloatRange(min=0), default=None, help="stop after this many seconds")
def datagen(out_dir: Path, records: int, rate: float | None, batch: int, start_id: int, duration: float | None) -> None:
    """Write RECORDS numbered JSON records ({"id": n, ...}) into OUT, BATCH per file, each file atomically.

    Schema (Spark DDL): id LONG, key STRING, value LONG, ts LONG.
    """
    config = DatagenConfig(
        out_dir=str(out_dir), records=records, rate=rate, batch=batch, start_id=start_id, duration_s=duration
    )
    try:
        result = generate(config)
    except OSError as exc:
        raise click.ClickException(f"cannot write into {out_dir}: {exc.strerror or exc}") from None
    except KeyboardInterrupt:
        raise click.Abort() from None
    fmt = output_format()
    if fmt in MACHINE_FORMATS:
        click.echo(
            render(
                {
                    "out": str(out_dir),
                    "files": result.files,
                    "records": result.records,
                    "first_id": result.start_id,
                    "last_id": result.start_id + result.records - 1,
                    "elapsed_s": result.elapsed_s,
                    "complete": result.complete,
                    "schema": SCHEMA_DDL,
                },
                fmt,
            )
        )
    else:
        last = result.start_id + result.records - 1
        click.echo(
            f"wrote {result.records} records (ids {result.start_id}..{last}) in {result.files} files "
            f"to {out_dir} in {result.elapsed_s:.1f}s; schema: {SCHEMA_DDL}"
        )


with_output(datagen)  # -o/--json here too when called on its own

__all__ = ["datagen"]
