"""The synthetic samples both ingest measurements insert (`clickhouse_ingest.py` on 18.16,
`clickhouse_views.py` on a current engine): one 16-CPU node at 99 Hz with jitter, 30 comms, 8
workloads (a pod's JSON identity), ~5,000 stacks with Zipf-like popularity."""


def source_table(table, rows):
    """The statement that makes `table` with `rows` samples, numbered `n` in time order."""
    return (f"CREATE TABLE {table} ENGINE = MergeTree ORDER BY n AS SELECT number AS n, 'node-0001' AS node, "
            "toUInt64(1795392000000000000 + intDiv(number, 16) * 10101010 + (number % 16) * 631313 + rand() % 3000) AS ts, "
            "toUInt16(number % 16) AS cpu, toUInt32(1000 + intDiv(number, 4000) % 40 * 37) AS pid, toUInt32(1000 + intDiv(number, 4000) % 40 * 37 + intDiv(number, 16000) % 4) AS tid, "
            "concat('comm-', toString(intDiv(number, 4000) % 30)) AS comm, cityHash64(toUInt64(pow(rand(1) / 4294967295, 3) * 5000)) AS stack_id, "
            "concat('{\"pod_namespace\":\"ns-', toString(intDiv(number, 4000) % 4), '\",\"pod_name\":\"trainer-7f9c-', toString(intDiv(number, 4000) % 8), "
            "'\",\"pod_uid\":\"6f1c2a9e-0b3d-4c7e-9a51-', toString(intDiv(number, 4000) % 8), '\",\"container_name\":\"trainer\",\"container_id\":\"containerd://0d1e2f', toString(intDiv(number, 4000) % 8), '\"}') AS workload, "
            f"toUInt32(1) AS count FROM numbers({rows})")
