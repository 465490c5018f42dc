"""A local-mode SparkSession for the tests and benchmarks: loopback only, workers on this interpreter."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

# Spark binds to the address its host name resolves to, else to the first interface's; the tests
# stay on loopback. Workers run PYSPARK_PYTHON, which must import this project: this interpreter.
LOCAL_ENV = {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
             "PYSPARK_DRIVER_PYTHON": sys.executable}


def local_session(cores: int = 2, app_name: str = "kafka-sidecar-tests") -> SparkSession:
    """A new local[cores] session on 127.0.0.1, with Python worker logs kept (python_worker_logs())."""
    os.environ.update(LOCAL_ENV)
    return (SparkSession.builder.master(f"local[{cores}]").appName(app_name)
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", str(cores))
            .config("spark.sql.pyspark.worker.logging.enabled", "true")
            .getOrCreate())
