"""Root on a shared node, against the job's own user: what the all-reduce reads back from the job's scratch
directory, and what it writes and chowns there (module_utils/preflight_node/allreduce_run/scratch.py, docs/security.md).

The job user is ``nobody``; its "training Python" is a small shell script in a directory it can reach, which
acts as the job's code would: it swaps the files the gate reads back for links to root-only files, leaves a
FIFO where a rank file should be, and plants links where root writes.  Root-only targets live under pytest's
``tmp_path`` (mode 0700, root's).  Every test needs root (switching users).
"""

import json
import os
import pwd
import shutil
import stat
import tempfile
import uuid

import pytest

from attacker_helpers import write_script

from preflight_node.allreduce_run import gate_run

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching to the job's user needs root")

SECRET = "PFSECRET-%s" % uuid.uuid4().hex[:8]
NOBODY = pwd.getpwnam("nobody")


@pytest.fixture
def secrets(tmp_path):
    """Root-only files (0600 in a 0700 directory) the job must never see or change."""
    as_json = tmp_path / "secret.json"
    as_json.write_text(json.dumps({"status": "ok", "stage": "done", "correct": True, "error": SECRET}))
    text = tmp_path / "secret.txt"
    text.write_text("%s line\n" % SECRET)
    folder = tmp_path / "secret-dir"
    folder.mkdir()
    (folder / "stdout.log").write_text("%s in a directory\n" % SECRET)
    victim = tmp_path / "victim"
    victim.write_text("VICTIM\n")
    for path in (as_json, text, folder / "stdout.log", victim):
        os.chmod(str(path), 0o600)
    os.chmod(str(folder), 0o700)
    return {"json": str(as_json), "text": str(text), "dir": str(folder), "victim": str(victim)}


def _script(directory, body, name="python"):
    return write_script(os.path.join(directory, name), body)


# The job's side of the run: torchrun's arguments say where the gate will read back.
ARGS = ('out=""; logs=""; prev=""\n'
        'for arg in "$@"; do case "$prev" in --out) out="$arg";; --log-dir) logs="$arg";; esac; prev="$arg"; done\n')


def _params(python, **overrides):
    params = {name: spec.get("default") for name, spec in gate_run.ARGUMENT_SPEC.items()}
    params.update(python=python, worker_source="# the worker\n", nnodes=1, node_rank=0, nproc_per_node=2,
                  master_addr="127.0.0.1", timeout=5.0, hard_timeout=20.0, stack_budget=1.0, run_as="nobody",
                  role="n1")
    params.update(overrides)
    return params


def _unchanged(secrets):
    for path in (secrets["json"], secrets["text"], secrets["victim"]):
        info = os.stat(path)
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o600), path
    with open(secrets["victim"]) as handle:
        assert handle.read() == "VICTIM\n"


def test_files_the_job_swapped_for_links_never_reach_the_result(public_dir, secrets):
    python = _script(public_dir, ARGS + (
        'echo "torchrun started"\n'
        'mkdir -p "$out" "$logs/run_0/attempt_0/0"\n'
        'ln -s "%(json)s" "$out/rank0.json"\n'
        'ln -s "%(text)s" "$logs/run_0/attempt_0/0/stderr.log"\n'
        'ln -s "%(dir)s" "$logs/run_0/attempt_0/1"\n'
        # The combined log, where the job's working directory holds it.
        'ln -sf "%(text)s" "$PWD/torchrun.log" 2>/dev/null\n'
        'exit 0\n') % secrets)
    result = gate_run.bounded_run(_params(python), "n1", uuid.uuid4().hex)
    assert SECRET not in json.dumps(result), "a root-only file reached the result"
    _unchanged(secrets)
    # The run says what it refused to read instead of passing or pretending the ranks never started.
    assert result["checks"]["ranks"]["status"] == "fail"
    assert "rank0.json" in result["checks"]["ranks"]["found"] and "not read" in result["checks"]["ranks"]["found"]
    assert "torchrun started" in result["log"]


@pytest.mark.timeout(60)
def test_a_fifo_or_an_oversized_file_in_the_job_directory_neither_hangs_nor_floods_the_gate(public_dir):
    python = _script(public_dir, ARGS + (
        'mkdir -p "$out" "$logs/run_0/attempt_0/0"\n'
        'mkfifo "$out/rank0.json" "$logs/run_0/attempt_0/0/stdout.log"\n'
        'head -c 20000000 /dev/zero | tr "\\0" x > "$out/rank1.json"\n'
        'exit 0\n'))
    result = gate_run.bounded_run(_params(python, hard_timeout=10.0), "n1", uuid.uuid4().hex)
    assert result["elapsed"] < 10 and not result["timed_out"]
    assert len(json.dumps(result)) < 2000000
    found = result["checks"]["ranks"]["found"]
    assert "rank0.json" in found and "rank1.json" in found, found


def test_root_writes_and_chowns_nothing_through_a_link_the_job_user_plants(public_dir, secrets, monkeypatch):
    """The job user acts the moment it owns something: after every ownership change root makes and right
    before the launch, it plants links to a root-only file at every name root later opens, in every directory
    it owns.  Root must neither write through them nor hand the file over."""
    names = ("torchrun.log", gate_run.WORKER_NAME, "ranks", "torchrun-logs")

    def plant(top):
        for directory, subdirs, _files in os.walk(top):
            if os.lstat(directory).st_uid != NOBODY.pw_uid:
                continue
            for name in names:
                path = os.path.join(directory, name)
                if os.path.islink(path):
                    continue
                if os.path.isdir(path):
                    shutil.rmtree(path)
                elif os.path.lexists(path):
                    os.unlink(path)
                os.symlink(secrets["victim"], path)
            subdirs[:] = [name for name in subdirs if name not in names]

    scratch = []
    real_mkdtemp, real_chown, real_fchown = tempfile.mkdtemp, os.chown, os.fchown
    real_run = gate_run.run_bounded

    def mkdtemp(*args, **kwargs):
        scratch.append(real_mkdtemp(*args, **kwargs))
        return scratch[-1]

    def chown(*args, **kwargs):
        real_chown(*args, **kwargs)
        plant(scratch[-1])

    def fchown(*args, **kwargs):
        real_fchown(*args, **kwargs)
        plant(scratch[-1])

    def run_bounded(*args, **kwargs):
        plant(scratch[-1])
        return real_run(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(os, "chown", chown)
    monkeypatch.setattr(os, "fchown", fchown)
    monkeypatch.setattr(gate_run, "run_bounded", run_bounded)
    python = _script(public_dir, 'echo "the job ran"\nexit 0\n')
    result = gate_run.bounded_run(_params(python), "n1", uuid.uuid4().hex)
    _unchanged(secrets)
    assert "VICTIM" not in json.dumps(result)


@pytest.mark.skipif(os.geteuid() != 0, reason="another account's directory needs root to make")
@pytest.mark.parametrize("case", ["owned by another account", "reached through another account's link",
                                  "writable by others, not sticky"])
def test_a_scratch_directory_another_account_could_rename_entries_in_is_refused(public_dir, case):
    """The all-reduce's scratch parent: root makes its run's directory there and reads results back from it; an
    account owning the parent (or a link on the way) could rename root's directory away and put its own instead."""
    from preflight_node.srun_task import with_defaults
    nobody = pwd.getpwnam("nobody")
    theirs = os.path.join(public_dir, "theirs")
    os.mkdir(theirs, 0o755)
    path = theirs
    if case.startswith("owned"):
        os.chown(theirs, nobody.pw_uid, nobody.pw_gid)
    elif case.startswith("reached"):
        sticky = os.path.join(public_dir, "sticky")
        os.mkdir(sticky)
        os.chmod(sticky, 0o1777)
        path = os.path.join(sticky, "scratch")
        os.symlink(theirs, path)
        os.lchown(path, nobody.pw_uid, nobody.pw_gid)
    else:
        os.chmod(theirs, 0o777)
    params = with_defaults(gate_run.MODULE_SPEC, dict(_params("/usr/bin/python3"), scratch_dir=path, run_as="nobody",
                                                     job={"user": "nobody", "named": True}))
    problems = gate_run.check_params(params)
    assert any("scratch_dir %s" % path in item for item in problems), problems
    # A directory of root's alone is fine, and so is the sticky system temp directory.
    params.update(scratch_dir=public_dir)
    assert gate_run.check_params(params) == []
