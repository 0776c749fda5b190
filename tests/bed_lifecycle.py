"""The ``with`` protocol the namespace test beds share (tests/testbed.py's Testbed, tests/slurm_bed.py's
SlurmCluster): test-side helper, not shipped."""


class UpDown:
    """A context manager over ``up()`` (what ``with ... as`` binds) and ``down()`` (always, on the way out)."""

    def __enter__(self):
        return self.up()

    def __exit__(self, *exc):
        self.down()
