"""job_wait: returns a background job's result, removes the job file, never waits past its bound."""

import json
import threading
import time

import job_wait


def args(job, **overrides):
    values = {"results_file": str(job), "timeout": 30, "poll": 0.05, "what": "the port mesh",
              "capability": "port_mesh"}
    values.update(overrides)
    return values


def test_running_job_is_not_finished(tmp_path):
    job = tmp_path / "123.456"
    job.write_text(json.dumps({"started": 1, "finished": 0, "ansible_job_id": "123.456"}))
    assert job_wait.read_finished(str(job)) is None
    job.write_text("{partial")
    assert job_wait.read_finished(str(job)) is None
    assert job_wait.read_finished(str(tmp_path / "missing")) is None


def test_returns_result_when_job_finishes_and_removes_file(run_module, tmp_path):
    job = tmp_path / "123.456"
    job.write_text(json.dumps({"started": 1, "finished": 0}))

    def finish():
        time.sleep(0.5)
        job.write_text(json.dumps({"changed": False, "ranks": [{"rank": 0, "status": "ok"}],
                                   "checks": {"ranks": {"status": "pass"}},
                                   "invocation": {"module_args": {}}}))

    thread = threading.Thread(target=finish)
    thread.start()
    result, failed = run_module(job_wait, args(job, what="the all-reduce", capability="allreduce"), check_mode=True)
    thread.join()
    assert not failed
    assert result["ranks"][0]["status"] == "ok" and "invocation" not in result
    assert result["checks"] == {"ranks": {"status": "pass"}} and result["capability"] == "allreduce"
    assert 0.4 < result["waited"] < 10
    assert not job.exists()


def test_timeout_is_a_no_result_finding_named_for_the_job(run_module, tmp_path):
    job = tmp_path / "123.456"
    job.write_text(json.dumps({"started": 1, "finished": 0}))
    start = time.monotonic()
    result, failed = run_module(job_wait, args(job, timeout=0.3))
    assert time.monotonic() - start < 3
    assert not failed
    assert result["capability"] == "port_mesh" and list(result["checks"]) == ["no_result"]
    check = result["checks"]["no_result"]
    assert check["status"] == "fail" and check["fix"]
    assert "no result from the port mesh" in check["found"] and "still says it is running" in check["found"]
    assert job.exists(), "an unfinished job's file is left for the operator"


def test_missing_result_file_is_named(run_module, tmp_path):
    result, failed = run_module(job_wait, args(tmp_path / "never", timeout=0.2))
    assert not failed
    assert "does not exist" in result["checks"]["no_result"]["found"]


def test_failed_module_result_fails_the_task(run_module, tmp_path):
    job = tmp_path / "123.456"
    job.write_text(json.dumps({"failed": True, "msg": "master_port 70000 is outside 1-65535"}))
    result, failed = run_module(job_wait, args(job, timeout=5))
    assert failed and "70000" in result["msg"] and result["capability"] == "port_mesh"


def test_async_timeout_result_fails_the_task(run_module, tmp_path):
    # What async_wrapper writes when it killed the job at its async time.
    job = tmp_path / "123.456"
    job.write_text(json.dumps({"msg": "Timeout exceeded", "failed": True, "child_pid": 4242}))
    result, failed = run_module(job_wait, args(job, timeout=5))
    assert failed and result["msg"] == "Timeout exceeded"


def test_bad_capability_name_is_rejected(run_module, tmp_path):
    result, failed = run_module(job_wait, args(tmp_path / "x", capability="allreduce.ranks"))
    assert failed and "lower-case" in result["msg"]
