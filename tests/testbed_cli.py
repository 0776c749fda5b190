"""Multi-node test bed: N fake cluster nodes on this one machine.

The command line of tests/testbed.py (``python tests/testbed.py up|down|status``, which
runs ``main`` from here; the first docstring line is its --help description).
Test-side helper, not shipped.
"""

import argparse
import json
import os
import shlex
import signal
import sys
import time

from testbed import Testbed
from testbed_cleanup import (_read_states, _state_alive, _state_path, _teardown_runid,
                             cleanup_stale)
from testbed_net import _state_lock, unavailable_reason


# --------------------------------------------------------------------------
# Command line


def _cmd_up(args):
    bed = Testbed(nodes=args.nodes, workdir=args.workdir, fabric=args.fabric,
                  fabric_rails=args.fabric_rails, docker_bridge=args.docker_bridge,
                  down_iface=args.down_iface)

    def on_term(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    try:
        bed.up()
        print(f"runid: {bed.runid}", flush=True)
        for node in bed.nodes:
            fab = f" fabric {','.join(node.fabric_addresses)}" if node.fabric_addresses else ""
            print(f"node: {node.name} {node.address}{fab} netns {node.namespace}", flush=True)
        print(f"ssh: {shlex.join(bed.ssh_argv(bed.nodes[0]))}", flush=True)
        print(f"inventory: {bed.inventory_path}", flush=True)
        while True:
            # sleep, not signal.pause(): a signal landing just before pause()
            # would leave it blocked for good; sleep bounds that to a second.
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        bed.down()
        print("down", flush=True)
    return 0


def _cmd_down(args):
    if args.all:
        removed = cleanup_stale(include_live=args.force)
    else:
        removed = []
        with _state_lock():
            for runid in args.runid:
                path = _state_path(runid)
                state = {}
                if os.path.exists(path):
                    with open(path, encoding="utf-8") as handle:
                        state = json.load(handle)
                if state and _state_alive(state) and not args.force:
                    print(f"{runid}: owner pid {state['owner_pid']} is alive; "
                          "stop it or use --force", file=sys.stderr)
                    continue
                errors = _teardown_runid(runid, state)
                if errors:
                    print(f"{runid}: " + "; ".join(errors), file=sys.stderr)
                else:
                    removed.append(runid)
    for runid in removed:
        print(f"removed {runid}")
    live = [s["runid"] for s in _read_states() if _state_alive(s)]
    if live and args.all and not args.force:
        print("still running (owner alive): " + " ".join(live))
    return 0


def _cmd_status(_args):
    states = _read_states()
    if not states:
        print("no beds")
    for state in states:
        owner = "alive" if _state_alive(state) else "DEAD (leftover)"
        nodes = ", ".join(f"{n['name']}={n['address']}" for n in state.get("nodes", []))
        print(f"{state['runid']}: owner pid {state.get('owner_pid')} {owner}; "
              f"nodes {nodes or '-'}; inventory {state.get('inventory')}")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a bed and keep it until Ctrl-C/SIGTERM")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--fabric", action="store_true", help="add fabric network fab0")
    up.add_argument("--fabric-rails", type=int, default=None,
                    help="number of fabric links per node (implies --fabric)")
    up.add_argument("--docker-bridge", action="store_true")
    up.add_argument("--down-iface", action="store_true")
    up.add_argument("--workdir", default=None)
    down = sub.add_parser("down", help="remove beds")
    down.add_argument("runid", nargs="*")
    down.add_argument("--all", action="store_true",
                      help="remove every leftover bed (owner process dead)")
    down.add_argument("--force", action="store_true",
                      help="also remove beds whose owner is still running")
    sub.add_parser("status", help="list beds")
    args = parser.parse_args(argv)
    if args.command == "down" and not args.all and not args.runid:
        parser.error("down needs RUNID... or --all")
    reason = unavailable_reason()
    if reason:
        print(f"testbed: {reason}", file=sys.stderr)
        return 2
    return {"up": _cmd_up, "down": _cmd_down, "status": _cmd_status}[args.command](args)
