"""What a run and an event cost PostgreSQL and Redis in cluster mode, per instance (docs/scaling.md).

    python bench/bench_scaling.py [--rounds 3] [--short-runs 60] [--runs 30] [--events 400] [--rate 50]

The same load on one cluster instance and split evenly over three (runs created round-robin, each
streamed by an SSE client on the next instance, as a load balancer would spread them), each in
its own fresh PostgreSQL database and Redis key prefix, the modes interleaved in every round:

- `short`: `--short-runs` runs of 3 deltas each (the per-run cost);
- `long`: `--runs` concurrent runs of `--events` deltas at `--rate` deltas/s each (a model's pace;
  the per-event cost, once the per-run cost is taken off);
- `bystanders` (long load, all of it on instance 0, three instances): what instances 1 and 2 pay
  for the cluster's messages they only receive (every instance receives every batch);
- `idle` (once per mode): start, migrate, stop, with no load; subtracted from the others.

Counted by the servers themselves: PostgreSQL's `pg_stat_database` of the bench's database (read
once the instances have stopped, when their backends have flushed their counters: commits,
rows inserted/updated/deleted), the journal tables' size, the backends during the load; Redis
`INFO` before/after (commands, PUBLISH calls, bytes in and out, clients) and the subscribers of
the events channel; each instance's CPU from /proc. Redis and WAL counters are server-wide: run
it on a quiet Redis. Prints per run and per event, and per instance with one vs three side by side.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from typing import Any

import click
from _common import Clients, Gateway, load, median
from bench_cluster import POSTGRES_URL, REDIS_URL, fresh_database, instances

MODES = {"one": 1, "three": 3}


def redis_counters(client: Any) -> dict[str, float]:
    stats = client.info("stats")
    commands = client.info("commandstats")
    clients = client.info("clients")
    return {
        "commands": stats["total_commands_processed"],
        "bytes_in": stats["total_net_input_bytes"],
        "bytes_out": stats["total_net_output_bytes"],
        "publish": commands.get("cmdstat_publish", {}).get("calls", 0),
        "clients": clients["connected_clients"],
    }


def pg_connections(admin: Any, database: str) -> int:
    with admin.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (database,))
        return int(cursor.fetchone()[0])


def pg_counters(admin: Any, database: str) -> dict[str, float]:
    """The database's own counters, once its backends are gone (each flushes its counts as it exits)."""
    deadline = time.monotonic() + 30
    while pg_connections(admin, database) and time.monotonic() < deadline:
        time.sleep(0.05)  # waiting for the stopped instances' backends to exit, from outside
    with admin.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted FROM pg_stat_database"
            " WHERE datname = %s",
            (database,),
        )
        commits, rollbacks, inserted, updated, deleted = cursor.fetchone()
    return {
        "commits": commits,
        "rollbacks": rollbacks,
        "inserted": inserted,
        "updated": updated,
        "deleted": deleted,
    }


def table_bytes(url: str) -> dict[str, int]:
    import psycopg2

    with contextlib.closing(psycopg2.connect(url, connect_timeout=5)) as conn, conn.cursor() as cursor:
        cursor.execute(
            "SELECT relname, pg_total_relation_size(oid) FROM pg_class WHERE relkind = 'r' AND relname LIKE 'ag\\_%'"
        )
        sizes = {name: int(size) for name, size in cursor.fetchall()}
        cursor.execute("SELECT count(*) FROM ag_events")
        sizes["#events"] = int(cursor.fetchone()[0])
    return sizes


def wal_lsn(admin: Any) -> int:
    with admin.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        return int(cursor.fetchone()[0])


def cpu_seconds(gw: Gateway) -> float:
    return sum(gw.cpu())


def measure(
    admin_url: str, redis_url: str, mode: str, phase: str, spec: dict[str, Any], bystanders: bool = False
) -> dict[str, Any]:
    import psycopg2
    import redis

    count = MODES[mode]
    r = redis.Redis.from_url(redis_url)
    admin = psycopg2.connect(admin_url, connect_timeout=5)
    admin.autocommit = True
    out: dict[str, Any] = {"mode": mode, "phase": phase}
    try:
        with fresh_database(admin_url) as url:
            database = url.rsplit("/", 1)[1]
            wal_before = wal_lsn(admin)
            clients_before = redis_counters(r)["clients"]
            prefix = "agbench:" + secrets.token_hex(4) + ":"
            with instances(url, redis_url, count, prefix=prefix) as gws:
                for gw in gws:  # every instance has joined (its lease row written, its subscription made)
                    deadline = time.monotonic() + 30
                    while gw.get("/v1/health").get("cluster", {}).get("redis") != "up":
                        if time.monotonic() > deadline:
                            raise TimeoutError("an instance did not subscribe to Redis")
                        time.sleep(0.02)  # polling from outside
                out["subscribers"] = int(dict(r.pubsub_numsub(prefix + "events")).get((prefix + "events").encode(), 0))
                before_redis = redis_counters(r)
                before_cpu = [cpu_seconds(gw) for gw in gws]
                started = time.monotonic()
                if phase == "idle":
                    time.sleep(spec["idle_seconds"])  # what idle instances spend (leases, sweeps)
                else:
                    options = (
                        {"events": 3}
                        if phase == "short"
                        else {"events": spec["events"], "rate": spec["rate"], "chars": spec["chars"]}
                    )
                    runs = spec["short_runs"] if phase == "short" else spec["runs"]
                    owners = [0] * runs if bystanders else [i % count for i in range(runs)]
                    readers_of = owners if bystanders else [(i + 1) % count for i in range(runs)]
                    run_ids = [gws[owner].create_run(dict(options)) for owner in owners]
                    readers = [
                        Clients(
                            gw.url,
                            [{"run": run_id} for run_id, at in zip(run_ids, readers_of, strict=True) if at == index],
                        )
                        for index, gw in enumerate(gws)
                        if index in readers_of
                    ]
                    out["pg_connections"] = pg_connections(admin, database)
                    out["redis_clients"] = redis_counters(r)["clients"] - clients_before
                    results = [res for reader in readers for res in reader.results()]
                    bad = [res["error"] for res in results if res["error"] or not res["terminal"]]
                    if bad or len(results) != runs:
                        raise RuntimeError(f"client errors: {bad[:3]}")
                    for gw, run_id in zip([gws[o] for o in owners], run_ids, strict=True):
                        gw.wait_run(run_id)
                    out["runs"] = runs
                out["seconds"] = time.monotonic() - started
                out["cpu"] = [cpu_seconds(gw) - b for gw, b in zip(gws, before_cpu, strict=True)]
                after_redis = redis_counters(r)
                out["redis"] = {k: after_redis[k] - before_redis[k] for k in before_redis if k != "clients"}
                out["relayed_in"] = [gw.get("/v1/health")["cluster"]["relayedIn"] for gw in gws]
                out["bytes"] = table_bytes(url)
            out["pg"] = pg_counters(admin, database)
            out["wal"] = wal_lsn(admin) - wal_before
    finally:
        admin.close()
        r.close()
    return out


def minus(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: a[k] - b.get(k, 0) for k in a}


@click.command()
@click.option("--rounds", default=3, show_default=True)
@click.option("--short-runs", default=60, show_default=True, help="Runs of 3 deltas (the per-run cost).")
@click.option("--runs", default=30, show_default=True, help="Concurrent long runs.")
@click.option("--events", default=400, show_default=True, help="Deltas per long run.")
@click.option("--rate", default=50, show_default=True, help="Deltas/s of each long run (a model's pace).")
@click.option("--idle-seconds", default=3.0, show_default=True, help="How long the idle instances are watched.")
@click.option("--chars", default=16, show_default=True, help="Characters per delta.")
@click.option("--postgres-url", default=POSTGRES_URL, show_default=True)
@click.option("--redis-url", default=REDIS_URL, show_default=True)
def main(
    rounds: int,
    short_runs: int,
    runs: int,
    events: int,
    rate: int,
    idle_seconds: float,
    chars: int,
    postgres_url: str,
    redis_url: str,
) -> None:
    spec: dict[str, Any] = {
        "short_runs": short_runs,
        "runs": runs,
        "events": events,
        "rate": rate,
        "chars": chars,
        "idle_seconds": idle_seconds,
    }
    print(f"load before: {load()}")
    idle = {mode: measure(postgres_url, redis_url, mode, "idle", spec) for mode in MODES}
    for mode, item in idle.items():
        print(
            f"idle {mode}: {item['pg']['commits']} commits, {item['pg']['inserted']} rows, "
            f"{item['redis']['commands']} Redis commands (start-up, migrations, {item['seconds']:.1f} s idle, stop); "
            f"idle CPU {idle_rate(item) * 1000:.1f} ms/s per instance"
        )
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for round_no in range(rounds):
        for phase in ("short", "long"):
            for mode in MODES:  # alternated within the round, so both see the same machine
                item = measure(postgres_url, redis_url, mode, phase, spec)
                results.setdefault((mode, phase), []).append(item)
                print(f"round {round_no + 1} {phase:5} {mode:5}: {summary(item, idle[mode])}")
        item = measure(postgres_url, redis_url, "three", "long", spec, bystanders=True)
        results.setdefault(("three", "bystanders"), []).append(item)
        print(f"round {round_no + 1} long  all on instance 0 of three: {summary(item, idle['three'])}")
    report(results, idle, spec)
    print(f"load after: {load()}")


def idle_rate(idle: dict[str, Any]) -> float:
    """CPU seconds per second of an idle instance (its lease and sweep loops, the bench's polls)."""
    return median(idle["cpu"]) / idle["seconds"]


def summary(item: dict[str, Any], idle: dict[str, Any]) -> str:
    pg = minus(item["pg"], idle["pg"])
    cpu = ", ".join(f"{c:.2f}" for c in item["cpu"])
    return (
        f"{pg['commits']:.0f} commits, {pg['inserted']:.0f} rows in, {pg['updated']:.0f} updated, "
        f"{item['redis']['publish']:.0f} PUBLISH, {item['redis']['bytes_out'] / 1e6:.2f} MB out of Redis, "
        f"{item['pg_connections']} PG backends, {item['redis_clients']} Redis clients, CPU s per instance [{cpu}], "
        f"{item['seconds']:.1f} s"
    )


def per(results: list[dict[str, Any]], idle: dict[str, Any], fn: Any) -> float:
    return median([fn(item, minus(item["pg"], idle["pg"])) for item in results])


def costs(
    short: list[dict[str, Any]], long_: list[dict[str, Any]], base: dict[str, Any], count: int, spec: dict[str, Any]
) -> dict[str, float]:
    """Per run (the short load), per event (the long load less its runs' share), per instance."""
    events = spec["runs"] * spec["events"]
    c: dict[str, float] = {}
    c["run_commits"] = per(short, base, lambda i, pg: pg["commits"] / i["runs"])
    c["run_rows"] = per(short, base, lambda i, pg: pg["inserted"] / i["runs"])
    c["run_updates"] = per(short, base, lambda i, pg: pg["updated"] / i["runs"])
    c["run_publish"] = per(short, base, lambda i, pg: i["redis"]["publish"] / i["runs"])
    c["run_cpu_ms"] = per(short, base, lambda i, pg: sum(i["cpu"]) / i["runs"] * 1000)
    c["ev_commits"] = per(long_, base, lambda i, pg: (pg["commits"] - c["run_commits"] * i["runs"]) / events)
    c["ev_rows"] = per(long_, base, lambda i, pg: (pg["inserted"] - c["run_rows"] * i["runs"]) / events)
    c["ev_publish"] = per(long_, base, lambda i, pg: (i["redis"]["publish"] - c["run_publish"] * i["runs"]) / events)
    c["ev_redis_in"] = per(long_, base, lambda i, pg: i["redis"]["bytes_in"] / events)
    c["ev_redis_out"] = per(long_, base, lambda i, pg: i["redis"]["bytes_out"] / events)
    c["ev_table"] = per(long_, base, lambda i, pg: i["bytes"]["ag_events"] / i["bytes"]["#events"])
    c["ev_wal"] = per(long_, base, lambda i, pg: (i["wal"] - base["wal"]) / events)
    c["ev_cpu_us"] = per(long_, base, lambda i, pg: (sum(i["cpu"]) - c["run_cpu_ms"] / 1000 * i["runs"]) / events * 1e6)
    c["inst_cpu"] = per(long_, base, lambda i, pg: median(i["cpu"]))
    c["inst_commits_s"] = per(long_, base, lambda i, pg: pg["commits"] / i["seconds"] / count)
    c["inst_pg"] = median([i["pg_connections"] / count for i in long_])
    c["inst_redis"] = median([i["redis_clients"] / count for i in long_])
    return c


def report(
    results: dict[tuple[str, str], list[dict[str, Any]]], idle: dict[str, dict[str, Any]], spec: dict[str, Any]
) -> None:
    print(f"\nmedians of {len(results[('one', 'short')])} rounds (idle start-up/stop taken off):")
    for mode, count in MODES.items():
        c = costs(results[(mode, "short")], results[(mode, "long")], idle[mode], count, spec)
        print(
            f"{mode} ({count} instance{'s' if count > 1 else ''}): per run {c['run_commits']:.1f} commits, "
            f"{c['run_rows']:.1f} rows in, {c['run_updates']:.1f} rows updated, {c['run_publish']:.1f} PUBLISH, "
            f"{c['run_cpu_ms']:.2f} ms gateway CPU; per event {c['ev_commits']:.3f} commits, {c['ev_rows']:.2f} rows, "
            f"{c['ev_table']:.0f} B of table, {c['ev_wal']:.0f} B of WAL, {c['ev_publish']:.3f} PUBLISH, "
            f"Redis {c['ev_redis_in']:.0f} B in / {c['ev_redis_out']:.0f} B out, {c['ev_cpu_us']:.0f} us gateway CPU; "
            f"per instance on the long load {c['inst_cpu']:.2f} CPU s, {c['inst_commits_s']:.0f} commits/s, "
            f"{c['inst_pg']:.1f} PG backends, {c['inst_redis']:.1f} Redis connections"
        )
    one = results[("one", "long")]
    three = results[("three", "long")]
    one_cpu = median([i["cpu"][0] for i in one])
    three_cpu = median([median(i["cpu"]) for i in three])
    print(
        f"long load ({spec['runs']} runs x {spec['events']} deltas at {spec['rate']}/s, the fixture's own rate "
        f"{spec['runs'] * spec['rate']:,} deltas/s): one instance {one_cpu:.2f} CPU s; each of three "
        f"{three_cpu:.2f} CPU s = {three_cpu / one_cpu:.2f}x one instance's (an even split with no overhead: 0.33x)"
    )
    by = results[("three", "bystanders")]
    # What they spend beyond being idle for as long.
    by_cpu = median([median(i["cpu"][1:]) - idle_rate(idle["three"]) * i["seconds"] for i in by])
    by_msgs = median([i["redis"]["publish"] for i in by])
    owner_cpu = median([i["cpu"][0] for i in by])
    print(
        f"bystanders (all the long load on instance 0 of three): the owner {owner_cpu:.2f} CPU s; "
        f"each other instance {by_cpu:.2f} CPU s for {by_msgs:,.0f} messages it only receives "
        f"= {by_cpu / max(by_msgs, 1) * 1e6:.1f} us per message received ({by_cpu / owner_cpu:.2f}x the owner)"
    )


if __name__ == "__main__":
    main()
