"""The ``ray-lite`` command line."""
import argparse
import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(
        prog="ray-lite",
        description="ray_lite: a Cython-accelerated single-machine runtime with Ray's API.")
    parser.add_argument("--version", action="store_true", help="print versions and which hot paths are compiled")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("bench", add_help=False, help="run benchmarks (ray-lite bench --help)")
    sub.add_parser("serve", add_help=False, help="run Serve applications (ray-lite serve --help)")
    for name, text in (("status", "a running program's resources, processes, object store, Serve"),
                       ("list", "list a running program's actors, tasks, objects, workers..."),
                       ("summary", "summarize a running program's tasks, actors or objects"),
                       ("dashboard", "serve the dashboard of a running program")):
        sub.add_parser(name, add_help=False, help=f"{text} (ray-lite {name} --help)")
    # Everything after `bench` belongs to the benchmark runner's own parser.
    if argv and argv[0] == "bench":
        from ray_lite import bench
        return bench.main(argv[1:])
    if argv and argv[0] == "serve":
        if argv[1:2] in (["run"], ["start"]) and not {"-h", "--help"} & set(argv):
            # Its init() adopts this zygote, which starts up meanwhile, beside
            # the imports of Serve and of the application.
            from ray_lite._private.node.zygote import discard_early, start_early
            start_early()
            try:
                from ray_lite.serve import cli
                return cli.main(argv[1:])
            finally:
                discard_early()     # no init adopted it (bad arguments, an app that failed)
        from ray_lite.serve import cli
        return cli.main(argv[1:])
    if argv and argv[0] in ("status", "list", "summary"):
        from ray_lite.util import state_cli
        return state_cli.main(argv)
    if argv and argv[0] == "dashboard":
        from ray_lite.dashboard import cli as dashboard_cli
        return dashboard_cli.main(argv[1:])
    args = parser.parse_args(argv)
    if args.version:
        import ray_lite
        import ray_lite._fast as fast
        print(f"ray_lite {ray_lite.__version__} "
              f"({'compiled' if fast.USING_EXTENSIONS else 'pure-Python'} hot paths)")
        return 0
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
