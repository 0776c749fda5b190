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

A RoCE port (link layer Ethernet) also has its GID table, one entry per address of its network device and RoCE
version, the entries not in use all zeros (their ``types`` / ``ndevs`` fail to read: absent here)::

    $ grep . /sys/class/infiniband/mlx5_0/ports/1/gids/[0-3] /sys/class/infiniband/mlx5_0/ports/1/gid_attrs/types/[0-3]
    .../gids/0:fe80:0000:0000:0000:5aa2:e1ff:fe4c:1a30    .../types/0:IB/RoCE v1
    .../gids/1:fe80:0000:0000:0000:5aa2:e1ff:fe4c:1a30    .../types/1:RoCE v2
    .../gids/2:0000:0000:0000:0000:0000:ffff:c612:0105    .../types/2:IB/RoCE v1
    .../gids/3:0000:0000:0000:0000:0000:ffff:c612:0105    .../types/3:RoCE v2

``make_pci`` lays out the PCIe tree of an HGX node (``hgx_layout``: four switches, each with two GPUs and two
NICs), so the NICs of ``make_tree(..., parents=...)`` sit under the same bridges as the GPUs; ``lspci_text`` is what
``lspci -D -vvv`` prints of its bridges' ACS; ``make_modules`` writes ``/sys/module`` entries (the GPU driver, the
peer-memory module).
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


def _link(target, link):
    """A relative symlink ``link`` -> ``target`` (both absolute paths), as sysfs has them."""
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if not os.path.islink(link):
        os.symlink(os.path.relpath(target, os.path.dirname(link)), link)


def _pci_dir(root, pci, parents):
    """``<root>/devices/<root complex>/<bridge>.../<pci>`` (``parents``: the root complex, then the bridges)."""
    return os.path.join(str(root), "devices", *(list(parents or ["pci0000:00"]) + [pci]))


def gid_table(address, mac="5aa2:e1ff:fe4c:1a30"):
    """The GID table the kernel writes for a RoCE device with one IPv4 ``address`` (None: no IPv4 address, only the
    link-local entries): ``[(index, gid, type)]``."""
    link_local = "fe80:0000:0000:0000:%s" % mac
    table = [(0, link_local, "IB/RoCE v1"), (1, link_local, "RoCE v2")]
    if address:
        mapped = "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x" % tuple(int(part) for part in address.split("."))
        table += [(2, mapped, "IB/RoCE v1"), (3, mapped, "RoCE v2")]
    return table


def write_gids(pdir, table, ndev, size=8):
    """Write ``table`` (:func:`gid_table`) into a port directory, entries up to ``size`` zero where unused."""
    used = {index: (gid, kind) for index, gid, kind in table}
    for index in range(max([size] + [index + 1 for index in used])):
        gid, kind = used.get(index, ("0000:0000:0000:0000:0000:0000:0000:0000", None))
        _write(os.path.join(pdir, "gids", str(index)), gid)
        if kind is not None:
            _write(os.path.join(pdir, "gid_attrs", "types", str(index)), kind)
            _write(os.path.join(pdir, "gid_attrs", "ndevs", str(index)), ndev)


def make_tree(root, ports=8, rate="400 Gb/sec (4X NDR)", down=(), slow=None, counters=None,
              link_layer="InfiniBand", states=None, ndevs=False, adapters=None, pci=None, parents=None,
              roce=None, device_names=None, driver="mlx5_core"):
    """Build ``<root>/class/infiniband`` with ``ports`` HCAs (mlx5_0.., one port each); returns ``root``.

    ``down``: device names (or indices) whose port is ``1: DOWN`` / ``2: Polling``; ``states``: name ->
    ``(state, phys_state)`` text; ``slow``: name -> rate text; ``counters``: name -> value on every port
    (over ``BASE_VALUES``); ``link_layer``: text, or name -> text; ``ndevs``: write ``gid_attrs/ndevs/0``;
    ``adapters``: name -> ``(hca_type, board_id)`` (default :data:`CX7`); ``pci``: the devices' PCI addresses
    (default :data:`PCI`); ``parents``: PCI address -> the root complex and bridges above it (:func:`hgx_layout`);
    ``roce``: name -> the IPv4 address of its network device (None: none), whose GID table is written;
    ``device_names``: the device names (default mlx5_N); ``driver``: the PCI driver (``efa`` for EFA devices)."""
    root = str(root)
    slow, states, adapters = dict(slow or {}), dict(states or {}), dict(adapters or {})
    values = dict(BASE_VALUES, **(counters or {}))
    drivers = os.path.join(root, "bus", "pci", "drivers", driver)
    os.makedirs(drivers, exist_ok=True)
    os.makedirs(os.path.join(root, "class", "infiniband"), exist_ok=True)
    addresses = list(pci or PCI)
    for index in range(ports):
        name = device_names[index] if device_names else device_name(index)
        pci_address = addresses[index % len(addresses)]
        pci_dir = _pci_dir(root, pci_address, (parents or {}).get(pci_address))
        netdev = "ens%df0np0" % index if roce is not None else "ibp%ds0" % index
        os.makedirs(os.path.join(pci_dir, "net", netdev), exist_ok=True)
        _link(drivers, os.path.join(pci_dir, "driver"))
        _link(pci_dir, os.path.join(root, "bus", "pci", "devices", pci_address))
        ddir = os.path.join(pci_dir, "infiniband", name)
        os.makedirs(ddir)
        _link(pci_dir, os.path.join(ddir, "device"))
        hca_type, board_id = adapters.get(name, adapters.get(index, CX7))
        _write(os.path.join(ddir, "hca_type"), hca_type)
        _write(os.path.join(ddir, "board_id"), board_id)
        _link(ddir, os.path.join(root, "class", "infiniband", name))
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
        if roce is not None and name in roce:
            write_gids(pdir, gid_table(roce[name]), netdev)
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


# --- the PCIe tree of an HGX node, its bridges' ACS, kernel modules ----------------------------------------------

# A PCIe switch port (Broadcom PEX890xx), an H100 SXM GPU, a ConnectX-7, an H100 board's NVSwitch.
SWITCH_PORT = ("0x1000", "0xc030", "0x060400")
H100_GPU = ("0x10de", "0x2330", "0x030200")
CX7_NIC = ("0x15b3", "0x1021", "0x020700")
NVSWITCH_DEVICE = ("0x10de", "0x22a3", "0x068000")
HGX_GPU_BUSES = (0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb)
ACS_ON = "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"
ACS_OFF = "SrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-"


def hgx_layout():
    """``{gpus, nics, nvswitches, bridges, parents}`` of an 8-GPU HGX node: four PCIe switches, each with two GPUs and
    two NICs on their own downstream ports (the NIC one bus above its GPU), the NVSwitches on a root port of their
    own.  ``parents``: address -> the root complex and bridges above it, top first."""
    gpus, nics, bridges, parents = [], [], [], {}
    for pair in range(4):
        first, second = HGX_GPU_BUSES[2 * pair], HGX_GPU_BUSES[2 * pair + 1]
        rootport, upstream = "0000:%02x:01.0" % (first - 3), "0000:%02x:00.0" % (first - 2)
        downstream = ["0000:%02x:%02x.0" % (first - 1, port) for port in range(4)]
        bridges += [rootport, upstream] + downstream
        above = ["pci0000:%02x" % (first - 3), rootport, upstream]
        for port, address in enumerate(("0000:%02x:00.0" % first, "0000:%02x:00.0" % (first + 1),
                                        "0000:%02x:00.0" % second, "0000:%02x:00.0" % (second + 1))):
            parents[address] = above + [downstream[port]]
            (gpus if port % 2 == 0 else nics).append(address)
        parents[rootport], parents[upstream] = above[:1], above[:2]
        for bridge in downstream:
            parents[bridge] = above
    nvswitches = ["0000:%02x:00.0" % bus for bus in (0x05, 0x06, 0x07, 0x08)]
    bridges.append("0000:04:01.0")
    parents["0000:04:01.0"] = ["pci0000:04"]
    for address in nvswitches:
        parents[address] = ["pci0000:04", "0000:04:01.0"]
    return {"gpus": gpus, "nics": nics, "nvswitches": nvswitches, "bridges": bridges, "parents": parents}


def make_pci(root, layout=None, gpus=True, nvswitches=True):
    """The layout's bridges, GPUs and NVSwitches under ``<root>/devices`` with their ``vendor``, ``device`` and
    ``class`` files, each linked from ``<root>/bus/pci/devices`` (the NICs come with :func:`make_tree`); returns the
    layout."""
    layout = layout or hgx_layout()
    kinds = [(layout["bridges"], SWITCH_PORT)] + ([(layout["gpus"], H100_GPU)] if gpus else []) + (
        [(layout["nvswitches"], NVSWITCH_DEVICE)] if nvswitches else [])
    for addresses, (vendor, device, code) in kinds:
        for address in addresses:
            folder = _pci_dir(root, address, layout["parents"][address])
            for attribute, value in (("vendor", vendor), ("device", device), ("class", code)):
                _write(os.path.join(folder, attribute), value)
            _link(folder, os.path.join(str(root), "bus", "pci", "devices", address))
    return layout


def lspci_text(layout=None, acs_on=(), denied=False):
    """What ``lspci -D -vvv`` prints of the layout's switch ports: ACS enabled on the bridges of ``acs_on`` (the
    Linux default when it enables ACS), off on the others; ``denied``: run without root (capabilities hidden)."""
    layout = layout or hgx_layout()
    out = []
    for address in layout["bridges"]:
        out.append("%s PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0) (prog-if 00 [Normal decode])"
                   % address)
        out.append("\tControl: I/O+ Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr- Stepping- SERR+ FastB2B-")
        if denied:
            out.append("\tCapabilities: <access denied>")
        else:
            out.append("\tCapabilities: [100 v1] Advanced Error Reporting")
            out.append("\tCapabilities: [148 v1] Access Control Services")
            out.append("\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl+ DirectTrans+")
            out.append("\t\tACSCtl:\t%s" % (ACS_ON if address in acs_on else ACS_OFF))
        out.append("\tKernel driver in use: pcieport")
        out.append("")
    return "\n".join(out) + "\n"


def make_modules(root, modules=("nvidia", "nvidia_peermem"), version="550.90.07", taint="POE"):
    """``<root>/module/<name>`` for each loaded module; the GPU driver's with its ``version`` and ``taint`` (``POE``:
    the proprietary module, ``OE``: the open one)."""
    for name in modules:
        folder = os.path.join(str(root), "module", name)
        os.makedirs(folder, exist_ok=True)
        if name == "nvidia":
            _write(os.path.join(folder, "version"), version)
            _write(os.path.join(folder, "taint"), taint)
    return root
