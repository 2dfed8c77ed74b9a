"""``python -m ray_lite._examples.llm_server {serve,handwritten} [--port P]
[--size S | --model NAME]`` (``python -m llm_server ...`` from the checkout's
examples folder).

``serve`` runs the server on Serve (on Ray Serve when
``RAY_LITE_BACKEND=ray``); ``handwritten`` the same app on one uvicorn
process with pipe workers.  Either prints ``READY <port>`` once it answers,
and stops on Ctrl-C or SIGTERM.
"""
import argparse
import signal
import sys
import threading


def _ready(port):
    print(f"READY {port}", flush=True)


def _serve(args):
    import ray_lite
    from ray_lite import serve

    from .deployments import build
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    ray_lite.init(num_cpus=2, include_dashboard=False)
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(build({"size": args.size, "max_running": args.max_running,
                         "max_waiting": args.max_waiting, "model": args.model,
                         "max_len": args.max_len,
                         "ingress_replicas": args.ingress_replicas}), route_prefix="/")
        _ready(args.port)
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
    finally:
        serve.shutdown()
        ray_lite.shutdown()


def _handwritten(args):
    from .handwritten import run
    run(args.port, args.size, args.host, ready=lambda: _ready(args.port),
        max_running=args.max_running, max_waiting=args.max_waiting, model=args.model,
        max_len=args.max_len)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ray_lite._examples.llm_server")
    parser.add_argument("mode", choices=("serve", "handwritten"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--size", default="small", help="tiny, small, medium or large")
    parser.add_argument("--model", default=None,
                        help="a transformers causal LM (name or folder) in place of the toy")
    parser.add_argument("--max-len", type=int, default=None,
                        help="the context of --model, tokens (default 1024)")
    parser.add_argument("--max-running", type=int, default=64)
    parser.add_argument("--max-waiting", type=int, default=256)
    parser.add_argument("--ingress-replicas", type=int, default=None,
                        help="replicas of the HTTP ingress on Serve (default 2)")
    args = parser.parse_args(argv)
    (_serve if args.mode == "serve" else _handwritten)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
