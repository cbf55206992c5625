"""Streaming table: every record of input/*.json, exactly once (the checkpoint lives under the storage)."""

import os

from pyspark import pipelines as dp

# Definitions are imported with the project directory as the working directory.
INPUT = os.path.abspath("input")


@dp.table(comment="raw records written by broker_sim.sim.datagen")
def raw_events():
    return spark.readStream.format("json").schema("id LONG, key STRING, value LONG, ts LONG").load(INPUT)  # noqa: F821
