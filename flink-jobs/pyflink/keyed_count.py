"""A PyFlink (Table API) job for streamscale's tests: a datagen source (no pendingRecords
metric) -> GROUP BY key (a HASH edge) -> a blackhole sink, submitted to a running session
cluster. streamscale treats it like any other Flink job: it only reads the REST API.

Usage: python keyed_count.py REST_HOST:PORT ROWS_PER_SECOND [key=value ...]
The extra key=value pairs go into the job's configuration (e.g. parallelism.default=1).
Prints "JobID <id>" once submitted.
"""
import sys

from pyflink.common import Configuration
from pyflink.table import EnvironmentSettings, TableEnvironment


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    host, port = argv[1].rsplit(":", 1)
    rate = int(argv[2])
    conf = Configuration()
    conf.set_string("execution.target", "remote")
    conf.set_string("rest.address", host)
    conf.set_string("rest.port", port)
    conf.set_string("pipeline.name", "pyflink-keyed-count")
    conf.set_string("parallelism.default", "1")
    for kv in argv[3:]:
        key, value = kv.split("=", 1)
        conf.set_string(key, value)
    env = TableEnvironment.create(
        EnvironmentSettings.new_instance()
        .in_streaming_mode()
        .with_configuration(conf)
        .build()
    )
    env.execute_sql(
        f"""CREATE TABLE src (k INT, v BIGINT) WITH (
        'connector'='datagen', 'rows-per-second'='{rate}',
        'fields.k.min'='1', 'fields.k.max'='1000', 'fields.v.min'='1', 'fields.v.max'='1000')"""
    )
    env.execute_sql(
        "CREATE TABLE sink (k INT, cnt BIGINT, total BIGINT) WITH ('connector'='blackhole')"
    )
    result = env.execute_sql(
        "INSERT INTO sink SELECT k, COUNT(*), SUM(v) FROM src GROUP BY k"
    )
    print("JobID", result.get_job_client().get_job_id(), flush=True)


if __name__ == "__main__":
    main(sys.argv)
