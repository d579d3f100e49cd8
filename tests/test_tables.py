"""`analyze --tables DIR`: parquet tables of every row, hive-partitioned by run and rank, read by
DuckDB as they are and checked against summary.json (issue 20, point 4)."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from typer.testing import CliRunner

from profkit.cli import app

import support

duckdb = pytest.importorskip("duckdb")
DATA = support.DATA / "gpu_proxy"
runner = CliRunner()


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("tables")
    summaries = {}
    for name in ("baseline", "topk_v2"):
        r = runner.invoke(app, ["analyze", str(DATA / f"{name}.trace.json.gz"), "--no-cache", "--tables", str(out / "t"),
                                "--json", str(out / f"{name}.json")])
        assert r.exit_code == 0, r.output
        summaries[name] = json.loads((out / f"{name}.json").read_text())
    return out / "t", summaries


def test_hive_layout_every_row(two_runs):
    root, summaries = two_runs
    for table in ("iterations", "gpu_ops", "bubbles", "syncs", "launches"):
        assert sorted(p.relative_to(root / table).as_posix() for p in (root / table).rglob("*.parquet")) == [
            "run=baseline/rank=0/part-0.parquet", "run=topk_v2/rank=0/part-0.parquet"]
    q = lambda sql: duckdb.sql(sql.replace("T(", f"read_parquet('{root}/").replace(")T", "/**/*.parquet', hive_partitioning = true)")).fetchall()  # noqa: E731
    for run, s in summaries.items():
        r = s["ranks"][0]
        assert q(f"select count(*) from T(bubbles)T where run = '{run}'")[0][0] == r["bubbles_total"]
        assert q(f"select count(*) from T(iterations)T where run = '{run}' and rank = 0")[0][0] == len(r["iterations"])
        assert q(f"select count(*) from T(syncs)T where run = '{run}' and iteration is not null")[0][0] == r["syncs_total"]
        assert q(f"select count(*) from T(gpu_ops)T where run = '{run}'")[0][0] == sum(i["gpu_kernels"] + sum(i["memcpy"].values()) + i["memset"]
                                                                                    for i in r["iterations"])
        busy = q(f"select sum(gpu_busy_ns) from T(iterations)T where run = '{run}'")[0][0]
        assert busy / 1000 == pytest.approx(sum(i["gpu_busy_us"] for i in r["iterations"]), abs=1e-2)


def test_the_readme_query_matches_the_summaries(two_runs):
    root, summaries = two_runs
    # README: which CPU op accounts for the most launch idle across all ranks of these runs
    got = duckdb.sql(f"""
        select op, sum(ns) / 1000.0 as idle_us
        from (select unnest(cpu_ops) as op, unnest(cpu_ops_ns) as ns
              from read_parquet('{root}/bubbles/**/*.parquet', hive_partitioning = true) where cause = 'launch')
        group by op order by idle_us desc, op limit 5""").fetchall()
    want: dict[str, float] = defaultdict(float)
    for s in summaries.values():
        for x in s["ranks"][0]["bubble_cpu_ops"]:
            if x["cause"] == "launch":
                want[x["cpu_op"]] += x["idle_us"]
    top = sorted(want.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    assert [op for op, _ in got] == [op for op, _ in top]
    for (_, a), (_, b) in zip(got, top):
        assert a == pytest.approx(b, abs=1e-2)
