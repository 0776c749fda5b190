"""report.html (cluster_preflight/outputs/report.py): the matrix, failed nodes first, findings, the bandwidth bars,
sparklines from the history, escaping of whatever a verdict holds, and its cost at 1,000 nodes."""

import html.parser
import json
import os
import time

from cluster_preflight.outputs import history, report
from report_helpers import synthetic_verdict

HOSTILE = '<script>alert(1)</script>"onerror=alert(2)'


class _Page(html.parser.HTMLParser):
    """Elements and their attributes as a browser's parser sees them (script bodies apart)."""

    def __init__(self):
        super().__init__()
        self.elements, self.scripts, self._in_script = [], [], False

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts.append(data)


def _parse(text):
    page = _Page()
    page.feed(text)
    return page


def test_hostile_names_and_findings_are_escaped():
    verdict = synthetic_verdict(hosts=["good", HOSTILE], failed=(HOSTILE,), localize=True)
    verdict["nodes"][HOSTILE]["checks"]["allreduce.ranks"]["found"] = "found %s" % HOSTILE
    text = report.render(verdict, {HOSTILE: ["pass", "fail"]})
    assert "<script>alert(1)</script>" not in text
    assert '"onerror=' not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&#34;onerror=alert(2)" in text
    page = _parse(text)
    assert [tag for tag, _attrs in page.elements].count("script") == 1  # the filter box's own
    assert not any(name.startswith("on") for _tag, attrs in page.elements for name in attrs)
    rows = [attrs["data-node"] for tag, attrs in page.elements if attrs.get("class") == "node-row"]
    assert rows == [HOSTILE, "good"]  # the attribute holds the name as text, nothing more


def test_matrix_worst_status_per_capability_and_failed_first():
    verdict = synthetic_verdict(hosts=["a", "b", "c", "d"], failed=("c",), warned=("b", "c"))
    capabilities, rows = report.matrix(verdict)
    assert capabilities == ["allreduce", "core_dumps", "iommu", "kernel_debug", "preflight", "ssh_trust"]
    assert [row["node"] for row in rows] == ["c", "b", "a", "d"]
    cells = {row["node"]: {cell["capability"]: cell["status"] for cell in row["cells"]} for row in rows}
    assert cells["c"] == {"allreduce": "fail", "core_dumps": "warn", "iommu": "not_applicable",
                          "kernel_debug": "skipped", "preflight": "pass", "ssh_trust": "pass"}
    assert cells["a"]["core_dumps"] == "pass"
    verdict["nodes"]["d"]["checks"]["ssh_trust.state"]["details"] = {"blocked": True}
    assert report.cell_status(verdict["nodes"]["d"]["checks"][name] for name in ("ssh_trust.state",)) == "unverified"


def test_page_cells_classes_findings_and_bars():
    verdict = synthetic_verdict(hosts=["a", "b", "c"], failed=("b",), warned=("c",), localize=True)
    text = report.render(verdict)
    page = _parse(text)
    node_rows = [attrs for tag, attrs in page.elements if attrs.get("class") == "node-row"]
    assert [(row["data-node"], row["data-status"]) for row in node_rows] == [("b", "fail"), ("c", "warn"),
                                                                            ("a", "pass")]
    cells = [attrs["class"] for tag, attrs in page.elements if tag == "td" and "cell" in attrs.get("class", "")]
    assert cells.count("cell status-fail") == 1 and cells.count("cell status-warn") == 1
    assert all(cls.split()[1] in {"status-%s" % s for s in report.SEVERITY} for cls in cells)
    bars = [attrs for tag, attrs in page.elements if tag == "rect" and attrs.get("class", "").split()[0] == "bar"]
    assert len(bars) == 3
    lengths = [float(bar["width"]) for bar in bars]
    assert lengths[2] == report.BAR_LENGTH and lengths[0] < lengths[1] < lengths[2]  # 10.0, 10.1, 10.2 GB/s
    assert len([1 for tag, attrs in page.elements if attrs.get("class") == "bar-pair"]) == 1
    assert "fix allreduce on b, then re-run" in text and "core_dumps drifted on c: value 2" in text
    assert "rank 1 died" in text  # the localisation round
    assert 'id="filter"' in text and "http" not in text.replace("http-equiv", "")  # nothing fetched


def test_a_node_without_bandwidth_gets_an_empty_bar():
    verdict = synthetic_verdict(hosts=["a", "b"])
    verdict["allreduce"]["ranks"] = [row for row in verdict["allreduce"]["ranks"] if row["host"] == "a"]
    node_chart, _pairs = report.bandwidth(verdict)
    assert [(bar["label"], bar["value"], bar["length"], bar["text"]) for bar in node_chart["bars"]] == [
        ("a", 10.0, report.BAR_LENGTH, "10.000 GB/s"), ("b", None, 0, "not measured")]
    assert "b: not measured" in report.render(verdict)


class _Texts(html.parser.HTMLParser):
    """The visible text of each SVG ``<text>`` element of one chart, in order, with its class."""

    def __init__(self, chart):
        super().__init__()
        self.chart, self.inside, self.texts, self._cls = chart, False, [], None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "svg":
            self.inside = attrs.get("id") == self.chart
        if self.inside and tag == "text":
            self._cls = attrs.get("class")

    def handle_endtag(self, tag):
        if tag == "svg":
            self.inside = False
        self._cls = None

    def handle_data(self, data):
        if self.inside and self._cls:
            self.texts.append((self._cls, data))


def test_the_charts_write_every_label_and_value_on_the_page():
    verdict = synthetic_verdict(hosts=["gpu-node-1", "gpu-node-2", "gpu-node-3"], busbw={
        "gpu-node-1": 0.512, "gpu-node-2": 0.4871, "gpu-node-3": 0.05}, localize=True)
    verdict["allreduce"]["ranks"] = [row for row in verdict["allreduce"]["ranks"] if row["host"] != "gpu-node-3"]
    parser = _Texts("busbw-nodes")
    parser.feed(report.render(verdict))
    # Visible text, not tooltips: a screenshot or a printout names every node and its value.
    assert parser.texts == [("bar-label", "gpu-node-1"), ("bar-value", "0.512 GB/s"),
                            ("bar-label", "gpu-node-2"), ("bar-value", "0.487 GB/s"),
                            ("bar-label", "gpu-node-3"), ("bar-value", "not measured")]
    pairs = _Texts("busbw-pairs")
    pairs.feed(report.render(verdict))
    assert pairs.texts == [("bar-label", "gpu-node-1+gpu-node-2"), ("bar-value", "8.500 GB/s")]
    chart, _pairs = report.bandwidth(verdict)
    # Labels never overlap their bars, values never overlap the next row.
    for bar in chart["bars"]:
        assert bar["label_x"] < bar["bar_x"] <= bar["text_x"] - bar["length"]
        assert bar["y"] < bar["text_y"] <= bar["y"] + bar["h"] + 2


def test_sparklines_from_the_history(tmp_path):
    db = str(tmp_path / "history.sqlite")
    for number, failed in ((1, ()), (2, ("b",)), (3, ())):
        history.record(db, synthetic_verdict(hosts=["a", "b"], failed=failed, run_id="r%d" % number,
                                             finished="2026-11-0%dT00:00:00Z" % number), "preflight", "x")
    verdict = synthetic_verdict(hosts=["a", "b"], run_id="r3", finished="2026-11-03T00:00:00Z")
    run_dir = tmp_path / "r3"
    run_dir.mkdir()
    path = report.write_report(verdict, str(run_dir), db)
    assert path == str(run_dir / "report.html") and os.stat(path).st_mode & 0o777 == 0o640
    page = _parse(open(path, encoding="utf-8").read())
    sparks = [attrs["class"] for tag, attrs in page.elements if attrs.get("class", "").startswith("spark-")]
    assert sparks == ["spark-pass", "spark-pass", "spark-pass", "spark-pass", "spark-fail", "spark-pass"]


def test_after_verdict_records_and_writes_the_page(tmp_path):
    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    verdict = synthetic_verdict(hosts=["a"], run_id="r1")
    outputs, warnings = report.after_verdict(verdict, "healthcheck", str(run_dir), str(run_dir / "healthcheck.json"),
                                             str(tmp_path))
    assert warnings == [] and outputs == {"report.html": str(run_dir / "report.html")}
    assert history.last_pass(str(tmp_path / "history.sqlite"))["kind"] == "healthcheck"
    (tmp_path / "history.sqlite").write_bytes(b"garbage" * 100)
    outputs, warnings = report.after_verdict(verdict, "preflight", str(run_dir), "v", str(tmp_path))
    assert outputs == {"report.html": str(run_dir / "report.html")}
    assert len(warnings) == 1 and warnings[0].startswith("run history not recorded. Found: ")
    outputs, warnings = report.after_verdict(verdict, "preflight", str(tmp_path / "gone"), "v", str(tmp_path),
                                             history_setting="none")
    assert outputs == {} and warnings[0].startswith("report.html not written. Found: ")


def test_a_thousand_nodes_render_in_a_few_seconds(tmp_path):
    failed = tuple("node%04d" % index for index in range(0, 1000, 97))
    verdict = synthetic_verdict(1000, failed=failed, warned=("node0500",))
    json.dumps(verdict)
    start = time.monotonic()
    text = report.render(verdict, {host: ["pass"] * 10 for host in verdict["hosts"]})
    seconds = time.monotonic() - start
    assert seconds < 5, "rendering 1,000 nodes took %.1f s" % seconds
    assert len(text) < 8 * 2**20
    page = _parse(text)
    rows = [attrs["data-node"] for tag, attrs in page.elements if attrs.get("class") == "node-row"]
    assert rows[:len(failed)] == list(failed) and len(rows) == 1000
    assert len([1 for tag, attrs in page.elements if tag == "rect" and attrs.get("class") == "bar"]) == 1000
