"""A node's ``/sys/class/infiniband`` in a tmp dir, for the fabric capability's tests.

The layout follows the kernel's (``nic.gather_rdma`` reads it): ``class/infiniband/mlx5_N`` is a symlink to
``devices/pci0000:00/<pci>/infiniband/mlx5_N``, whose ``device`` -> ``../../../<pci>`` is the PCI function,
whose ``driver`` -> ``bus/pci/drivers/mlx5_core``.  A ConnectX-7 port directory (mlx5_ib) holds:

    $ ls /sys/class/infiniband/mlx5_0/ports/1/
    cap_mask  counters  gid_attrs  gids  hw_counters  lid  lid_mask_count  link_layer  phys_state  pkeys
    rate  sm_lid  sm_sl  state
    $ ls /sys/class/infiniband/mlx5_0/ports/1/counters/
    VL15_dropped  excessive_buffer_overrun_errors  link_downed  link_error_recovery
    local_link_integrity_errors  multicast_rcv_packets  multicast_xmit_packets  port_rcv_constraint_errors
    port_rcv_data  port_rcv_errors  port_rcv_packets  port_rcv_remote_physical_errors
    port_rcv_switch_relay_errors  port_xmit_constraint_errors  port_xmit_data  port_xmit_discards
    port_xmit_packets  port_xmit_wait  symbol_error  unicast_rcv_packets  unicast_xmit_packets
    $ ls /sys/class/infiniband/mlx5_0/ports/1/hw_counters/
    duplicate_request  implied_nak_seq_err  lifespan  local_ack_timeout_err  np_cnp_sent
    np_ecn_marked_roce_packets  out_of_buffer  out_of_sequence  packet_seq_err  req_cqe_error
    req_cqe_flush_error  req_remote_access_errors  req_remote_invalid_request  resp_cqe_error
    resp_cqe_flush_error  resp_local_length_error  resp_remote_access_errors  rnr_nak_retry_err
    roce_adp_retrans  roce_adp_retrans_to  roce_slow_restart  roce_slow_restart_cnps  roce_slow_restart_trans
    rp_cnp_handled  rp_cnp_ignored  rx_atomic_requests  rx_dct_connect  rx_icrc_encapsulated  rx_read_requests
    rx_write_requests
    $ cat state phys_state rate link_layer
    4: ACTIVE
    5: LinkUp
    400 Gb/sec (4X NDR)
    InfiniBand
    $ cat /sys/class/infiniband/mlx5_0/hca_type /sys/class/infiniband/mlx5_0/board_id
    MT4129
    MT_0000000838

``make_tree`` builds mlx5_0..mlx5_<ports-1>, one port each, with those files; ``bump`` moves a counter.
"""

import os

# The PCI functions of the eight ConnectX-7 HCAs of an 8-GPU node, one per GPU.
PCI = ("0000:18:00.0", "0000:40:00.0", "0000:4f:00.0", "0000:5e:00.0",
       "0000:9a:00.0", "0000:c0:00.0", "0000:ce:00.0", "0000:dc:00.0")
PORT_COUNTERS = (
    "VL15_dropped", "excessive_buffer_overrun_errors", "link_downed", "link_error_recovery",
    "local_link_integrity_errors", "multicast_rcv_packets", "multicast_xmit_packets", "port_rcv_constraint_errors",
    "port_rcv_data", "port_rcv_errors", "port_rcv_packets", "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors", "port_xmit_constraint_errors", "port_xmit_data", "port_xmit_discards",
    "port_xmit_packets", "port_xmit_wait", "symbol_error", "unicast_rcv_packets", "unicast_xmit_packets")
HW_COUNTERS = (
    "duplicate_request", "implied_nak_seq_err", "lifespan", "local_ack_timeout_err", "np_cnp_sent",
    "np_ecn_marked_roce_packets", "out_of_buffer", "out_of_sequence", "packet_seq_err", "req_cqe_error",
    "req_cqe_flush_error", "req_remote_access_errors", "req_remote_invalid_request", "resp_cqe_error",
    "resp_cqe_flush_error", "resp_local_length_error", "resp_remote_access_errors", "rnr_nak_retry_err",
    "roce_adp_retrans", "roce_adp_retrans_to", "roce_slow_restart", "roce_slow_restart_cnps",
    "roce_slow_restart_trans", "rp_cnp_handled", "rp_cnp_ignored", "rx_atomic_requests", "rx_dct_connect",
    "rx_icrc_encapsulated", "rx_read_requests", "rx_write_requests")
# A node up for days: traffic counters large, error counters mostly zero, a few old symbol errors.
BASE_VALUES = {"port_xmit_data": 918273645546, "port_rcv_data": 918273600012, "port_xmit_packets": 3584301122,
               "port_rcv_packets": 3584299871, "unicast_xmit_packets": 3584290001, "unicast_rcv_packets": 3584288702,
               "port_xmit_wait": 120455, "symbol_error": 3, "lifespan": 10}
DOWN = ("1: DOWN", "2: Polling")
# ConnectX-7 (MT4129) with its board id; ``adapters`` gives a device another pair (a ConnectX-6 Dx: MT4125).
CX7 = ("MT4129", "MT_0000000838")


def _write(path, value):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write("%s\n" % value)


def device_name(index):
    return "mlx5_%d" % index


def port_path(root, device, port=1):
    """``<root>/class/infiniband/<device>/ports/<port>``."""
    return os.path.join(str(root), "class", "infiniband", device, "ports", str(port))


def _key(device, index):
    return device if device is not None else index


def make_tree(root, ports=8, rate="400 Gb/sec (4X NDR)", down=(), slow=None, counters=None,
              link_layer="InfiniBand", states=None, ndevs=False, adapters=None):
    """Build ``<root>/class/infiniband`` with ``ports`` HCAs (mlx5_0.., one port each); returns ``root``.

    ``down``: device names (or indices) whose port is ``1: DOWN`` / ``2: Polling``; ``states``: name ->
    ``(state, phys_state)`` text; ``slow``: name -> rate text; ``counters``: name -> value on every port
    (over ``BASE_VALUES``); ``link_layer``: text, or name -> text; ``ndevs``: write ``gid_attrs/ndevs/0``;
    ``adapters``: name -> ``(hca_type, board_id)`` (default :data:`CX7`)."""
    root = str(root)
    slow, states, adapters = dict(slow or {}), dict(states or {}), dict(adapters or {})
    values = dict(BASE_VALUES, **(counters or {}))
    drivers = os.path.join(root, "bus", "pci", "drivers", "mlx5_core")
    os.makedirs(drivers, exist_ok=True)
    os.makedirs(os.path.join(root, "class", "infiniband"), exist_ok=True)
    for index in range(ports):
        name, pci = device_name(index), PCI[index % len(PCI)]
        pci_dir = os.path.join(root, "devices", "pci0000:00", pci)
        os.makedirs(os.path.join(pci_dir, "net", "ibp%ds0" % index), exist_ok=True)
        if not os.path.islink(os.path.join(pci_dir, "driver")):
            os.symlink(os.path.join("..", "..", "..", "bus", "pci", "drivers", "mlx5_core"),
                       os.path.join(pci_dir, "driver"))
        ddir = os.path.join(pci_dir, "infiniband", name)
        os.makedirs(ddir)
        os.symlink(os.path.join("..", "..", "..", pci), os.path.join(ddir, "device"))
        hca_type, board_id = adapters.get(name, adapters.get(index, CX7))
        _write(os.path.join(ddir, "hca_type"), hca_type)
        _write(os.path.join(ddir, "board_id"), board_id)
        os.symlink(os.path.join("..", "..", "devices", "pci0000:00", pci, "infiniband", name),
                   os.path.join(root, "class", "infiniband", name))
        state = states.get(name) or (DOWN if name in down or index in down else ("4: ACTIVE", "5: LinkUp"))
        layer = link_layer.get(name, "InfiniBand") if isinstance(link_layer, dict) else link_layer
        pdir = port_path(root, name)
        _write(os.path.join(pdir, "state"), state[0])
        _write(os.path.join(pdir, "phys_state"), state[1])
        _write(os.path.join(pdir, "rate"), slow.get(name, slow.get(index, rate)))
        _write(os.path.join(pdir, "link_layer"), layer)
        _write(os.path.join(pdir, "lid"), "0x%x" % (index + 1))
        _write(os.path.join(pdir, "sm_lid"), "0x1")
        os.makedirs(os.path.join(pdir, "gid_attrs", "ndevs"))
        if ndevs:
            _write(os.path.join(pdir, "gid_attrs", "ndevs", "0"), "ibp%ds0" % index)
        for directory, names in (("counters", PORT_COUNTERS), ("hw_counters", HW_COUNTERS)):
            for counter in names:
                _write(os.path.join(pdir, directory, counter), values.get(counter, 0))
    return root


def _counter_path(root, device, port, counter):
    pdir = port_path(root, device, port)
    directory = "counters" if counter in PORT_COUNTERS else "hw_counters"
    return os.path.join(pdir, directory, counter)


def bump(root, device, port, counter, by):
    """Add ``by`` (may be negative: a reset) to ``counter`` of ``device`` port ``port``; returns the new value."""
    path = _counter_path(root, device, port, counter)
    with open(path) as handle:
        value = int(handle.read().strip()) + by
    _write(path, value)
    return value


def break_counter(root, device, port, counter):
    """Make ``counter`` unreadable: a directory in its place (reading it raises, as EINVAL does on a node)."""
    path = _counter_path(root, device, port, counter)
    os.remove(path)
    os.makedirs(path)
    return path
