"""What ``bench/nccl_logs.py`` expects the log diagnosis to name for each log of ``../shared/nccl-logs``.

One row per log file: the category and the cause id (``cluster_preflight/capabilities/allreduce/signatures.py``'s rows) that the cause the
file's thread established should be named as.  Written from the corpus's ``SOURCES.md`` in this project's own
words; nothing of the logs themselves is kept here.

Another folder of logs is measured with an expectations file of its own (``--expected FILE``): a JSON object
``{"<file name>": "<category>/<cause id>"}``.
"""

EXPECTED = {
    # A network interface the job's sockets need: named but absent on the node, or none with an address at all.
    "nccl1837-ifname-missing.log": "interface/socket_interface_missing",
    "nccl210-no-ip-iface.log": "interface/socket_interface_missing",
    "openr1mm7-ifname-eth0.log": "interface/socket_interface_missing",
    # The ranks' addresses are of different families (one IPv4, one IPv6).
    "gloo399-ipv4-ipv6.log": "interface/address_family_mismatch",
    # The node's own name resolves to a loopback address, or does not resolve.
    "gloo223-hostname-127011.log": "name_resolution/hostname_loopback",
    "grendel9-hostname-unresolvable.log": "name_resolution/name_unresolvable",
    "pipedream32-gloo-hostname.log": "name_resolution/name_unresolvable",
    # /dev/shm too small (a container's default) for NCCL's shared-memory segments.
    "nccl342-shm-docker.log": "shm/shm_too_small",
    "falvds2-shm-docker.log": "shm/shm_too_small",
    "torchtitan853-shm-ci.log": "shm/shm_too_small",
    # NVSwitch systems: the fabric manager not running, or restarted under running processes.
    "nccltests264-fm-802.log": "nvswitch/fabric_not_initialized",
    "nccl976-nvls-fm-restart.log": "nvswitch/nvls_failure",
    # The master's port held by another process (a second job, or what an earlier run left behind).
    "grmg11-port-leftover.log": "port/store_port_in_use",
    "mmdet2129-port-second-job.log": "port/store_port_in_use",
    # RoCE: the GID the queue pairs use does not reach the peer (retries exhausted).
    "nccl426-roce-gid.log": "roce_gid/nccl_ib_error_12",
    # Two ranks on one GPU (the job's own device selection).
    "dfine289-dup-gpu.log": "duplicate_gpu/duplicate_gpu",
    # GPUDirect RDMA broken by PCIe ACS (a local protection error on the completion queue).
    "nccl928-ib-err4-acs.log": "gpudirect/ib_local_protection",
    # The EFA network plugin present but without a usable libfabric provider.
    "nccl229-ofi-no-provider.log": "net_plugin/ofi_no_provider",
    # The job user's locked-memory limit too low to register RDMA buffers.
    "nccltests206-memlock.log": "memlock/ib_memlock",
}
