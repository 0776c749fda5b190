"""Shared helpers of the port mesh probe unit tests (tests/unit/test_port_probe.py,
tests/unit/test_port_probe_unreachable.py): the loopback node addresses, the row of a
probe result, and a socket stand-in whose connect() fails.  Test-side, not shipped."""

NODE1, NODE2, NODE3 = "127.0.0.2", "127.0.0.3", "127.0.0.4"


def row_for(result, destination):
    (row,) = [row for row in result["results"] if row["destination"] == destination]
    return row


class _FailingSocket(object):
    """Stands in for socket.socket: connect() raises the given error."""

    error = None

    def __init__(self, *args, **kwargs):
        pass

    def settimeout(self, value):
        pass

    def connect(self, addr):
        raise self.error

    def close(self):
        pass
