"""Failure signatures (cluster_preflight/capabilities/allreduce/signatures.py): recorded log lines -> cause and fix.

torch/gloo/TCPStore lines were recorded on this machine (torch 2.13.0+cpu: a TCPStore client to a closed
port, to an address with an `unreachable` route and to one without any route inside a network namespace,
a TCPStore server waiting for a second client, a gloo recv with a silent peer, a gloo peer that exited),
as torchrun --tee prints them ([node:rank]: prefix).  NCCL lines follow NCCL's documented INFO/WARN formats
(host:pid:tid [dev] NCCL INFO|WARN ...)."""

import pytest

from cluster_preflight.capabilities.allreduce import signatures as sig

RECORDED = {
    # torch 2.13 c10d socket.cpp / TCPStore.cpp, recorded here.
    "store_connect_timeout": "[n2:0]:[E1123 15:44:16.477260727 socket.cpp:1028] [c10d] The client socket has timed "
                             "out after 3000ms while trying to connect to (127.0.0.1, 29981).",
    "no_route_to_host": "[W1123 15:44:20.594066815 socket.cpp:764] [c10d] The client socket has failed to connect "
                        "to 120.85.0.0:18325 (errno: 113 - No route to host).",
    "network_unreachable": "[W1123 15:44:27.375442912 socket.cpp:764] [c10d] The client socket has failed to "
                           "connect to 158.85.0.0:32214 (errno: 101 - Network is unreachable).",
    "store_wait_timeout": "torch.distributed.DistStoreError: Timed out after 4 seconds waiting for clients. "
                          "1/2 clients joined.",
    "gloo_timeout": "[n1:0]:RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
                    "unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation to complete",
    "gloo_peer_closed": "[n1:1]:RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
                        "Connection closed by peer [127.0.0.1]:37574. This is typically caused by a remote worker "
                        "crashing. Check the logs of the remote worker before reporting an error. GLHF!",
    # The same c10d line as no_route_to_host, with the errno a closed port gives.
    "connection_refused": "[W1123 15:44:20.594030575 socket.cpp:764] [c10d] The client socket has failed to connect "
                          "to [node1]:29500 (errno: 111 - Connection refused).",
    "connection_timed_out": "node2:2211:2260 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to "
                            "198.18.200.1<43261> failed : Connection timed out",
    # NCCL formats.
    "nccl_net_ib": "node1:4015:4015 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:198.18.200.1<0>",
    "nccl_net_socket": "node2:4120:4120 [0] NCCL INFO NET/Socket : Using [0]eth0:198.18.201.12<0>",
    "nccl_ib_no_device": "node2:4120:4120 [0] NCCL INFO NET/IB : No device found.",
    "nccl_ib_error_12": "node2:4120:4190 [0] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer "
                        "198.18.200.1<42133> with error 12, opcode 32753, len 0, vendor err 129 (Recv) localGid "
                        "::ffff:198.18.200.2 remoteGid ::ffff:198.18.200.1",
    "nccl_system_error": "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
                         "ProcessGroupNCCL.cpp:1275, unhandled system error (run with NCCL_DEBUG=INFO for details), "
                         "NCCL version 2.18.1",
    "nccl_cuda_error": "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1191, "
                       "unhandled cuda error, NCCL version 2.14.3",
    "nccl_watchdog_timeout": "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, "
                             "OpType=ALLREDUCE, NumelIn=262144, NumelOut=262144, Timeout(ms)=30000) ran for 30012 "
                             "milliseconds before timing out.",
    "rendezvous_timeout": "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError",
    # torchrun on a master port another process listens on, recorded here (torch 2.13.0+cpu).
    "store_port_in_use": "[n1:0]:torch.distributed.DistNetworkError: The server socket has failed to listen on any "
                         "local network address. port: 29578, useIpv6: false, code: -98, name: EADDRINUSE, message: "
                         "address already in use",
    "cuda_error": "RuntimeError: CUDA error: an illegal memory access was encountered",
}
STATUS = {"nccl_net_ib": "pass", "nccl_net_socket": "warn", "nccl_ib_no_device": "warn", "gloo_timeout": "warn",
          "gloo_peer_closed": "warn", "nccl_watchdog_timeout": "warn"}


def test_every_signature_has_a_fix_where_it_can_fail():
    # Every row has a line of its shape: here (recorded) or in test_signature_table.py (SHAPED).
    for row in sig.SIGNATURES:
        assert row.status in ("pass", "warn", "fail") and row.cause
        assert row.fix or row.status == "pass", row.id


@pytest.mark.parametrize("sig_id", sorted(RECORDED))
def test_a_recorded_line_gives_exactly_its_signature_with_cause_and_fix(sig_id):
    # Recorded on one machine: a loopback address there is no name-resolution fault (nodes=1).
    findings = sig.match(RECORDED[sig_id], fabric=True, nodes=1)
    assert [f["id"] for f in findings] == [sig_id]
    finding = findings[0]
    assert finding["status"] == STATUS.get(sig_id, "fail")
    assert finding["cause"] and (finding["fix"] or finding["status"] == "pass")
    assert not finding["line"].startswith("[n"), "the torchrun prefix is trimmed"
    assert finding["line"] in RECORDED[sig_id]


@pytest.mark.parametrize("sig_id, words", [
    ("connection_refused", "nothing listens"),
    ("connection_timed_out", "DROP"),
    ("no_route_to_host", "wrong interface"),
    ("network_unreachable", "no route to that subnet"),
    ("store_connect_timeout", "cannot tell"),
])
def test_network_signatures_tell_firewall_unreachable_and_wrong_interface_apart(sig_id, words):
    finding = sig.match(RECORDED[sig_id], nodes=1)[0]
    text = finding["cause"] + " " + finding["fix"]
    if sig_id == "store_connect_timeout":
        assert "refused connection is retried" in text and "DROPs" in text
    else:
        assert words in text


def test_sockets_warn_only_where_a_fabric_exists():
    line = RECORDED["nccl_net_socket"]
    with_fabric = sig.match(line, fabric=True)[0]
    assert with_fabric["status"] == "warn" and "NCCL_IB_DISABLE" in with_fabric["fix"]
    without = sig.match(line, fabric=False)[0]
    assert without["status"] == "pass" and without["fix"] == "" and "expected" in without["cause"]
    assert sig.transport([without]) == "NET/Socket"


def test_ib_in_use_hides_the_socket_transport_lines():
    text = "\n".join([RECORDED["nccl_net_ib"], RECORDED["nccl_net_socket"], "n1 NCCL INFO Using network IB"])
    findings = sig.match(text, fabric=True)
    assert [f["id"] for f in findings] == ["nccl_net_ib"] and findings[0]["count"] == 2
    assert sig.transport(findings) == "NET/IB"


def test_findings_are_deduplicated_counted_and_in_table_order_from_lines_or_texts():
    lines = [RECORDED["gloo_timeout"], RECORDED["connection_refused"], RECORDED["gloo_timeout"].replace("[n1:0]",
                                                                                                       "[n1:1]")]
    findings = sig.match(lines)
    assert [(f["id"], f["count"]) for f in findings] == [("connection_refused", 1), ("gloo_timeout", 2)]
    assert sig.match("\n".join(lines)) == findings
    assert sig.match(["a\n" + lines[0], None, ""])[0]["id"] == "gloo_timeout"


def test_categories_limit_the_rows_and_quiet_logs_match_nothing():
    text = RECORDED["nccl_net_socket"] + "\n" + RECORDED["connection_refused"]
    assert [f["id"] for f in sig.match(text, categories=("transport",))] == ["nccl_net_socket"]
    quiet = "[n1:0]:preflight: world_size=2 backend=gloo torch=2.13.0+cpu cuda=None nccl=None correct=True"
    assert sig.match(quiet) == [] and sig.match("") == [] and sig.match([]) == []


def test_a_long_line_is_cut():
    finding = sig.match(RECORDED["cuda_error"] + " x" * 400)[0]
    assert len(finding["line"]) == sig.LINE_MAX


def test_the_cuda_error_points_at_cuda_launch_blocking_and_its_known_hang():
    finding = sig.match("For debugging consider passing CUDA_LAUNCH_BLOCKING=1.")[0]
    assert finding["id"] == "cuda_error"
    assert "CUDA_LAUNCH_BLOCKING=1" in finding["fix"] and "issue 750" in finding["fix"]


# torch 2.0-2.3 printed the same failure as glog warnings, then one error (and the RuntimeError repeats them).
OLDER_PORT_IN_USE = [
    "[W socket.cpp:426] [c10d] The server socket has failed to bind to [::]:29500 (errno: 98 - Address already "
    "in use).",
    "[W socket.cpp:426] [c10d] The server socket has failed to bind to 0.0.0.0:29500 (errno: 98 - Address already "
    "in use).",
    "[E socket.cpp:462] [c10d] The server socket has failed to listen on any local network address.",
    "RuntimeError: The server socket has failed to listen on any local network address. The server socket has failed "
    "to bind to [::]:29500 (errno: 98 - Address already in use). The server socket has failed to bind to ?UNKNOWN? "
    "(errno: 98 - Address already in use).",
]


@pytest.mark.parametrize("line", OLDER_PORT_IN_USE + [RECORDED["store_port_in_use"]])
def test_a_taken_master_port_names_the_other_process_and_how_to_see_it(line):
    findings = sig.match(line)
    assert [f["id"] for f in findings] == ["store_port_in_use"] and findings[0]["status"] == "fail"
    text = findings[0]["cause"] + " " + findings[0]["fix"]
    assert "another preflight run" in text and "training job" in text
    assert "ss -ltnp 'sport = :PORT'" in text and "preflight_master_port" in text


def test_the_older_torch_lines_of_one_taken_port_are_one_finding():
    findings = sig.match("\n".join("[n1:0]:" + line for line in OLDER_PORT_IN_USE))
    assert [(f["id"], f["count"]) for f in findings] == [("store_port_in_use", 4)]
