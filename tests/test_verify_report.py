"""The report: checks and verdict, a self-contained HTML page, and what a browser draws of it.

The rendering test takes a screenshot with Debian's headless Chromium when
``/usr/bin/chromium`` exists (``make install`` puts it there when run as root) and decodes
the PNG here (zlib and numpy), to check that the page is drawn with its charts' colours.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rewind.spec import Verify
from rewind.verify.report import summary, write_report
from rewind.verify.report_html import render_html
from rewind.verify.report_svg import COLOURS
from rewind.verify.service import verify_frames

CHROMIUM = Path("/usr/bin/chromium")
T = datetime(2026, 10, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def reports(spark: Any) -> dict[str, dict[str, Any]]:
    """A failing and a passing report from real comparisons of small frames."""
    from pyspark.sql import functions as F

    base = spark.range(3000).select(
        F.col("id").alias("order_id"),
        (F.col("id") % 100 * 1.5).alias("total"),
        F.element_at(F.array(F.lit("open"), F.lit("paid <b>&</b>")), (F.col("id") % 2 + 1).cast("int")).alias(
            "status"
        ),
        (F.lit(int(T.timestamp())) + F.col("id") * 600).cast("timestamp").alias("updated_at"),
    )
    staging = base.where(F.col("order_id") % 97 != 5).withColumn(
        "total", F.when(F.col("order_id") % 50 == 0, F.col("total") + 3).otherwise(F.col("total"))
    )
    staging = staging.unionByName(
        base.where(F.col("order_id") < 4).withColumn("order_id", F.col("order_id") + 5000)
    )
    v = Verify.model_validate(
        {
            "reference": {"iceberg": "shop.truth"},
            "key": ["order_id"],
            "compare": {"total": {"abs": 0.5}, "status": "exact", "updated_at": {"timestamp_precision": "s"}},
            "buckets": {"time_column": "updated_at", "granularity": "day", "category": "status"},
            "assertions": [
                {
                    "name": "no <script> totals",
                    "sql": "SELECT count(*) FROM staging WHERE total < 0",
                    "expect": 0,
                },
                {"name": "row counts", "sql": "SELECT count(*) FROM staging", "expect": 3000},
            ],
        }
    )
    failing = verify_frames(
        spark, staging, base, v, run_id="r-fail", staging_name="iceberg:shop.orders@rewind-r"
    )
    passing = verify_frames(
        spark, base, base, v, run_id="r-pass", staging_name="iceberg:shop.orders@rewind-r"
    )
    return {"failing": failing, "passing": passing}


def test_checks_and_verdict(reports: dict[str, dict[str, Any]]) -> None:
    failing, passing = reports["failing"], reports["passing"]
    assert passing["passed"] and not passing["failed"]
    assert not failing["passed"]
    assert failing["failed"] == [
        "every reference key is in staging",
        "staging has no extra keys",
        "values match within tolerance",
        "row counts",
    ]
    levels = {c["level"] for c in failing["checks"]}
    assert levels == {"record", "state", "outcome"}
    assert failing["record"]["missing"] == len([i for i in range(3000) if i % 97 == 5])
    assert failing["record"]["extra"] == 4
    assert failing["state"]["by_column"] == {
        "total": 60 - len([i for i in range(0, 3000, 50) if i % 97 == 5])
    }
    hours = failing["buckets"]["rows"]
    assert failing["buckets"]["granularity"] == "day" and hours[0]["bucket"] == "2026-10-01"
    assert len(hours) == 21 and hours[0]["staging_rows"] + hours[0]["missing"] - hours[0]["extra"] == 144
    assert sum(h["staging_rows"] for h in hours) == failing["rows"]["staging"]
    small = summary(failing)
    assert small["passed"] is False and small["missing"] == failing["record"]["missing"]
    assert "changed_sample" not in json.dumps(small)


def test_json_and_html_are_written_and_self_contained(
    reports: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    report = reports["failing"]
    written = write_report(report, tmp_path / "out" / "verify.html")
    assert written == {
        "json": str(tmp_path / "out" / "verify.json"),
        "html": str(tmp_path / "out" / "verify.html"),
    }
    again = json.loads(Path(written["json"]).read_text())
    assert again["passed"] is False and again["report"] == written
    page = Path(written["html"]).read_text()
    lowered = page.lower()
    for remote in ("<script", "<link", "src=", "url(", "http:", "https:", "@import"):
        assert remote not in lowered, remote
    assert page.count("<svg") == 3  # counts per bucket, drift per bucket, drift by category
    assert "FAILED" in page and COLOURS["staging"] in page and COLOURS["reference"] in page
    assert "no &lt;script&gt; totals" in page and "paid &lt;b&gt;&amp;&lt;/b&gt;" in page
    assert "<b>&</b>" not in page
    for level in report["bisection"]:  # how the rows were compared: each level's numbers in a row
        numbers = [level[k] for k in ("level", "bits", "differing_cells", "rows")]
        numbers += [level.get("pure_cells"), level.get("rows_read")]
        row = "".join("<td></td>" if n is None else f'<td class="n">{n:,}</td>' for n in numbers)
        assert row in page, row
    named = [("pure_cells" in lv, "rows_read" in lv) for lv in report["bisection"]]
    assert named == [(True, False), (False, True)]
    only_json = write_report(reports["passing"], tmp_path / "r.json")
    assert only_json == {"json": str(tmp_path / "r.json")} and not (tmp_path / "r.html").exists()


def test_many_buckets_are_drawn_as_lines() -> None:
    from rewind.verify.report_svg import svg_columns

    labels = [(T + timedelta(hours=i)).isoformat() for i in range(500)]
    svg = svg_columns(labels, [("staging", "#000", [1.0] * 500), ("reference", "#111", [2.0] * 500)])
    assert svg.count("<polyline") == 2 and svg.count("<rect") == 2  # only the legend's swatches


# -- what a browser draws -----------------------------------------------------------------------


def decode_png(data: bytes) -> np.ndarray:
    """RGB pixels of an 8-bit, non-interlaced RGB or RGBA PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat.append(chunk)
        pos += 12 + length
    assert header is not None
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and interlace == 0 and colour in (2, 6), header
    bpp = 3 if colour == 2 else 4
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8).reshape(height, 1 + width * bpp)
    out = np.zeros((height, width * bpp), dtype=np.uint8)
    prev = np.zeros(width * bpp, dtype=np.int32)
    for y in range(height):
        kind, cur = raw[y, 0], raw[y, 1:].astype(np.int32)
        if kind == 1:  # Sub: a running sum per channel
            cur = (np.cumsum(cur.reshape(width, bpp), axis=0) % 256).reshape(-1)
        elif kind == 2:  # Up
            cur = (cur + prev) % 256
        elif kind in (3, 4):  # Average, Paeth: byte by byte
            for x in range(width * bpp):
                a = int(cur[x - bpp]) if x >= bpp else 0
                b = int(prev[x])
                if kind == 3:
                    cur[x] = (cur[x] + (a + b) // 2) % 256
                else:
                    c = int(prev[x - bpp]) if x >= bpp else 0
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    cur[x] = (cur[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) % 256
        out[y] = cur
        prev = cur
    return out.reshape(height, width, bpp)[:, :, :3]


def rgb(hex_colour: str) -> tuple[int, int, int]:
    return int(hex_colour[1:3], 16), int(hex_colour[3:5], 16), int(hex_colour[5:7], 16)


def screenshot(page: Path, png: Path, profile: Path) -> np.ndarray:
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        f"--screenshot={png}",
        "--window-size=1200,900",
        page.as_uri(),
    ]
    done = subprocess.run(command, capture_output=True, timeout=120, check=False)
    assert png.exists(), done.stderr.decode(errors="replace")[-2000:]
    data = png.read_bytes()
    assert len(data) > 20_000, f"a {len(data)}-byte screenshot is too small to hold the report"
    return decode_png(data)


@pytest.mark.skipif(
    not CHROMIUM.exists(), reason="no /usr/bin/chromium (make install adds it when run as root)"
)
def test_the_report_renders_in_a_browser(reports: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    seen = {}
    for name, report in reports.items():
        page = tmp_path / f"{name}.html"
        page.write_text(render_html(report))
        pixels = screenshot(page, tmp_path / f"{name}.png", tmp_path / f"profile-{name}")
        assert pixels.shape == (900, 1200, 3)
        colours = {tuple(int(v) for v in p) for p in pixels.reshape(-1, 3)}
        assert len(colours) > 50, "the screenshot is (nearly) one colour: nothing was drawn"
        white = np.all(pixels > 240, axis=2).mean()
        assert 0.2 < white < 0.98, f"{white:.0%} of the page is blank"
        seen[name] = colours
        shutil.rmtree(tmp_path / f"profile-{name}", ignore_errors=True)
    # the verdict badge and both series of the first chart are on screen
    assert rgb(COLOURS["fail"]) in seen["failing"]
    assert rgb(COLOURS["pass"]) in seen["passing"]
    for colours in seen.values():
        assert rgb(COLOURS["staging"]) in colours and rgb(COLOURS["reference"]) in colours


def test_numbers_are_rounded_to_the_tolerance_or_six_digits(spark: Any) -> None:
    """Doubles as Spark computes them (10.1 + 5.21 = 15.309999999999999): the HTML shows a
    column with a tolerance to its decimals and any other to 6 significant digits."""
    from pyspark.sql import functions as F

    base = spark.range(4).select(
        F.col("id").alias("order_id"),
        (F.lit(10.1) + F.lit(5.21) + F.col("id")).alias("total"),
        (F.lit(0.1) + F.lit(0.2)).alias("ratio"),
    )
    assert base.first()["total"] == 15.309999999999999  # the float the report must not print
    bumped = F.when(F.col("order_id") == 2, F.col("total") + 1).otherwise(F.col("total"))
    staging = base.withColumn("total", bumped)
    v = Verify.model_validate(
        {"reference": {"iceberg": "shop.truth"}, "key": ["order_id"], "compare": {"total": {"abs": 0.01}}}
    )
    html = render_html(verify_frames(spark, staging, base, v, run_id="r-round", staging_name="s"))
    assert "15.309999999999999" not in html and "17.309999999999999" not in html
    assert ">18.31<" in html and ">17.31<" in html  # order 2: staging 18.31 vs reference 17.31
    assert "0.30000000000000004" not in html
