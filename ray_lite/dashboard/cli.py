"""``ray-lite dashboard``: serve the dashboard of a program running in
another terminal, reached through its driver's state socket."""
import argparse
import sys

from ray_lite._private.node import state_socket

from .server import DashboardError, DashboardServer


def main(argv):
    parser = argparse.ArgumentParser(prog="ray-lite dashboard")
    parser.add_argument("--address", default=None,
                        help="the program to show: its driver's pid or its state socket's "
                             "path (needed when several run)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, default=8265, help="the port (default: Ray's, 8265)")
    args = parser.parse_args(argv)
    try:
        address = state_socket.find_address(args.address)
    except state_socket.StateSocketError as exc:
        print(f"ray-lite dashboard: {exc}", file=sys.stderr)
        return 1

    def source(op, **kwargs):
        return state_socket.request(address, {"op": op, "args": kwargs}, 30.0)

    try:
        server = DashboardServer(source, args.host, args.port)
    except DashboardError as exc:
        print(f"ray-lite dashboard: {exc}", file=sys.stderr)
        return 1
    print(f"Dashboard of the program at {address}: http://{server.address}/ (Ctrl-C stops it)",
          flush=True)
    try:
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0
