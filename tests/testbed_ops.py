"""Per-node operations of the namespace test bed (tests/testbed.py).

Test-side helper, not shipped: ``TestbedOps``, the mixin ``Testbed`` gets its access to
nodes from (run/ssh/ip/iptables/tc in a node, sshd stop/start, link detach/attach) and
the environment for ansible.
"""

import contextlib
import os
import shlex
import subprocess

from testbed_net import (ANSIBLE_CFG, FABRIC_IFPREFIX, MGMT_IFNAME, ROOT, Node, TestbedError,
                         _kill_pids, _netns_pids, _run)



class TestbedOps:
    """Access to the nodes of a running bed (mixin of ``Testbed``)."""

    # -- access to nodes -----------------------------------------------------

    def node(self, key):
        """A node by Node, 1-based index or name."""
        if isinstance(key, Node):
            return key
        for node in self.nodes:
            if key in (node.index, node.name, node.namespace):
                return node
        raise KeyError(f"no node {key!r} in bed {self.runid}")

    def etc_path(self, node):
        """Host-side directory holding what the node wrote under its /etc."""
        return self.overlay_path(node, "/etc")

    def overlay_path(self, node, directory):
        node = self.node(node)
        return os.path.join(node.dir, self._dir_tag(os.path.normpath(directory)) + "-upper")

    def host_pids(self, node):
        """Host-side pids of every process in the node's network namespace."""
        return _netns_pids(self.node(node).namespace)

    def _enter_argv(self, node, argv, cwd=None):
        node = self.node(node)
        if not self._running(node):
            raise TestbedError(f"{node.name}: node is stopped (no PID 1)")
        enter = ["nsenter", "--target", str(node.host_pid), "--net", "--mount", "--uts",
                 "--pid", "--wd=" + (cwd or "/"), "--"]
        if isinstance(argv, str):
            argv = ["sh", "-c", argv]
        return enter + list(argv)

    def run(self, node, argv, timeout=30, check=False, input=None, env=None, cwd=None):
        """Run argv as a process of the node (its net, mount, UTS and PID
        namespaces: what an ssh session there sees).  Returns CompletedProcess."""
        # pylint: disable=redefined-builtin
        full = self._enter_argv(node, argv, cwd)
        kwargs = {"input": input} if input is not None else {}
        try:
            return _run(full, timeout=timeout, check=check, env=env, **kwargs)
        except TestbedError as exc:
            raise TestbedError(f"{self.node(node).name}: {exc}") from exc

    def spawn(self, node, argv, cwd=None, **popen_kwargs):
        """Start argv in the background inside the node; returns the Popen.

        It dies with the node at down() at the latest."""
        popen_kwargs.setdefault("stdin", subprocess.DEVNULL)
        popen_kwargs.setdefault("stdout", subprocess.PIPE)
        popen_kwargs.setdefault("stderr", subprocess.PIPE)
        popen_kwargs.setdefault("text", True)
        return subprocess.Popen(self._enter_argv(node, argv, cwd),  # pylint: disable=consider-using-with
                                **popen_kwargs)

    def ssh_argv(self, node, command=None, address=None, user="root", options=()):
        """argv of a real ssh to the node with the bed's key and known_hosts."""
        node = self.node(node)
        argv = ["ssh", "-F", "/dev/null"]
        for option in options:  # ssh keeps the first value given for an option
            argv += ["-o", option]
        argv += ["-i", self.ssh_key,
                "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", "ControlMaster=no", "-o", "ControlPath=none",
                "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR",
                "-p", str(node.port)]
        argv.append(f"{user}@{address or node.address}")
        if command is not None:
            argv += ["--", command if isinstance(command, str) else shlex.join(command)]
        return argv

    def ssh(self, node, command, timeout=30, check=False, address=None, input=None):
        """Run a command on the node over real ssh (argv list or shell string)."""
        # pylint: disable=redefined-builtin
        kwargs = {"input": input} if input is not None else {}
        return _run(self.ssh_argv(node, command, address=address), timeout=timeout,
                    check=check, **kwargs)

    def iptables(self, node, args, timeout=20, check=True):
        return self.run(node, ["iptables", "-w", "5"] + list(args), timeout=timeout,
                        check=check)

    def tc(self, node, args, timeout=20, check=True):
        return self.run(node, ["tc"] + list(args), timeout=timeout, check=check)

    def ip(self, node, args, timeout=20, check=True):
        return self.run(node, ["ip"] + list(args), timeout=timeout, check=check)

    # -- faults --------------------------------------------------------------

    def stop_sshd(self, node):
        """Stop the node: its sshd is PID 1, so every process of it dies.
        Network and /etc stay; start_sshd() brings it back like a reboot."""
        node = self.node(node)
        if self._running(node):
            _kill_pids([node.host_pid])
        launcher = self._launchers.pop(node.name, None)
        if launcher is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                launcher.wait(timeout=5)
        node.host_pid = 0
        node.host_start = None
        self._save_state()

    def start_sshd(self, node):
        node = self.node(node)
        if self._running(node):
            return
        self._launch(node)
        self._wait_ready(node)
        self._save_state()

    def detach(self, node, ifname):
        """Pull the node's cable on ifname: the host end leaves its bridge."""
        node = self.node(node)
        _run(["ip", "link", "set", node.interfaces[ifname], "nomaster"])

    def attach(self, node, ifname):
        node = self.node(node)
        bridge = self._bridge_of(ifname)
        if bridge is None:
            raise ValueError(f"{ifname} is not a bridged link")
        _run(["ip", "link", "set", node.interfaces[ifname], "master", bridge])

    def _bridge_of(self, ifname):
        if ifname == MGMT_IFNAME:
            return self._bridge("m")
        if ifname.startswith(FABRIC_IFPREFIX):
            return self._bridge(f"f{int(ifname[len(FABRIC_IFPREFIX):])}")
        return None

    def make_unreachable(self, node):
        """Detach every bridged link of the node: it keeps running, but
        connections to it time out (no refusal), as with a hung host."""
        node = self.node(node)
        for ifname in node.interfaces:
            if self._bridge_of(ifname):
                self.detach(node, ifname)

    def make_reachable(self, node):
        node = self.node(node)
        isolated = set()
        for key, ifnames in self._isolate.items():
            if self.node(key) is node:
                isolated.update(ifnames)
        for ifname in node.interfaces:
            if self._bridge_of(ifname) and ifname not in isolated:
                self.attach(node, ifname)

    # -- environment for ansible --------------------------------------------

    def ansible_env(self, base=None):
        """Environment to run the project's ansible against the bed."""
        env = dict(os.environ if base is None else base)
        venv_bin = os.path.join(ROOT, ".venv", "bin")
        env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
        env["ANSIBLE_CONFIG"] = ANSIBLE_CFG
        env["ANSIBLE_INVENTORY"] = self.inventory_path
        return env


