"""The drain cap (cluster_preflight/slurm/drain.py ``drain_cap``, ``capped``; scripts/slurm-drain --max-drain): one run
never drains more nodes than the operator allows; more failing at once is a cause they share, so none is drained
and the script says so (exit 4), while healed nodes are still resumed."""

import pytest

from cluster_preflight.slurm import drain as ps
from test_slurm import drain_script, verdict


@pytest.mark.parametrize("text,total,cap", [("10%", 4000, 400), ("10%", 6, 1), ("2%", 3, 1), ("0%", 9, 0),
                                            ("25", 8, 25), ("100%", 7, 7)])
def test_the_cap_is_a_count_or_a_share_of_the_run_s_nodes_rounded_up(text, total, cap):
    assert ps.drain_cap(text, total) == cap


@pytest.mark.parametrize("text", ["ten", "-1", "120%", "5.5", ""])
def test_a_cap_that_is_neither_is_refused_naming_it(text):
    with pytest.raises(ValueError, match="--max-drain"):
        ps.drain_cap(text, 10)


def test_over_the_cap_nothing_is_drained_and_resumes_still_apply():
    actions = [{"node": "n1", "action": "drain", "reason": "preflight: x", "why": "failed"},
               {"node": "n2", "action": "drain", "reason": "preflight: x", "why": "failed"},
               {"node": "n3", "action": "resume", "reason": "preflight: y", "why": "healthy again"}]
    assert ps.capped(actions, 2) == (actions, "")
    kept, over = ps.capped(actions, 1)
    assert [item["action"] for item in kept] == ["keep", "keep", "resume"]
    assert "2 nodes failed, more than the 1 one run may drain" in over
    assert kept[0]["why"] == "failed, not drained: over the drain cap (2 of at most 1)"


def test_slurm_drain_over_its_cap_drains_none_resumes_the_healed_and_exits_4(tmp_path):
    report = verdict(n1="fail", n2="fail", n3="pass", n4="pass")
    done, calls = drain_script(tmp_path, report, "n1|idle|none\nn2|idle|none\nn3|drained|preflight: x.y: old\n"
                                                 "n4|idle|none\n", "--max-drain", "1")
    assert done.returncode == 4, done.stderr
    assert calls == [["update", "nodename=n3", "state=resume"]]
    assert "2 nodes failed, more than the 1 this run may drain (--max-drain 1): none was drained (n1,n2)" in done.stderr
    (tmp_path / "again").mkdir()
    done, calls = drain_script(tmp_path / "again", report, "n1|idle|none\nn2|idle|none\nn3|idle|none\nn4|idle|none\n",
                               "--max-drain", "50%", "--dry-run")
    assert done.returncode == 0 and done.stdout.count("state=drain") == 2


def test_by_default_a_run_drains_at_most_a_tenth_of_its_nodes_and_never_fewer_than_four(tmp_path):
    report = verdict(**{"n%d" % index: "fail" if index <= 5 else "pass" for index in range(1, 11)})
    sinfo = "".join("n%d|idle|none\n" % index for index in range(1, 11))
    done, calls = drain_script(tmp_path, report, sinfo, "--dry-run")
    assert done.returncode == 4 and calls == [] and "more than the 4 this run may drain" in done.stderr
    assert ps.DEFAULT_MAX_DRAIN == ("10%", 4)


def test_slurm_drain_refuses_a_cap_it_cannot_read(tmp_path):
    done, calls = drain_script(tmp_path, verdict(n1="fail"), "n1|idle|none\n", "--max-drain", "lots")
    assert done.returncode == 2 and calls == [] and "--max-drain 'lots'" in done.stderr
