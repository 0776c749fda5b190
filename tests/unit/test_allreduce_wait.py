"""allreduce_wait: returns the background gate's result, removes the job file, never waits past its bound."""

import json
import threading
import time

import allreduce_wait


def test_running_job_is_not_finished(tmp_path):
    job = tmp_path / "123.456"
    job.write_text(json.dumps({"started": 1, "finished": 0, "ansible_job_id": "123.456"}))
    assert allreduce_wait.read_finished(str(job)) is None
    job.write_text("{partial")
    assert allreduce_wait.read_finished(str(job)) is None


def test_returns_result_when_job_finishes_and_removes_file(run_module, tmp_path):
    job = tmp_path / "123.456"
    job.write_text(json.dumps({"started": 1, "finished": 0}))

    def finish():
        time.sleep(0.5)
        job.write_text(json.dumps({"changed": False, "ranks": [{"rank": 0, "status": "ok"}],
                                   "checks": {"allreduce_ranks": {"status": "pass"}},
                                   "invocation": {"module_args": {}}}))

    thread = threading.Thread(target=finish)
    thread.start()
    result, failed = run_module(allreduce_wait, {"results_file": str(job), "timeout": 30, "poll": 0.05},
                                check_mode=True)
    thread.join()
    assert not failed
    assert result["ranks"][0]["status"] == "ok" and "invocation" not in result
    assert not job.exists()


def test_timeout_is_a_finding_not_a_hang(run_module, tmp_path):
    job = tmp_path / "123.456"
    job.write_text(json.dumps({"started": 1, "finished": 0}))
    result, failed = run_module(allreduce_wait, {"results_file": str(job), "timeout": 0.3, "poll": 0.05})
    assert not failed
    check = result["checks"]["allreduce_ranks"]
    assert check["status"] == "fail" and "no result" in check["found"] and check["fix"]


def test_failed_module_result_fails_the_task(run_module, tmp_path):
    job = tmp_path / "123.456"
    job.write_text(json.dumps({"failed": True, "msg": "master_port 70000 is outside 1-65535"}))
    result, failed = run_module(allreduce_wait, {"results_file": str(job), "timeout": 5})
    assert failed and "70000" in result["msg"]
