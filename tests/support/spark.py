"""A local-mode SparkSession for the tests and benchmarks: loopback only, workers on this interpreter."""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

from service.tools.quickstart import local_spark_env


def local_session(cores: int = 2, app_name: str = "kafka-sidecar-tests") -> SparkSession:
    """A new local[cores] session on 127.0.0.1, with Python worker logs kept (python_worker_logs())."""
    os.environ.update(local_spark_env())
    return (SparkSession.builder.master(f"local[{cores}]").appName(app_name)
            .config("spark.sql.shuffle.partitions", str(cores))
            .config("spark.sql.pyspark.worker.logging.enabled", "true")
            .getOrCreate())
