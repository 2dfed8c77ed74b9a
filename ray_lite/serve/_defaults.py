"""Serve's defaults and fixed bounds, each defined once (Ray Serve's values
where Ray has one)."""
import os

# ------------------------------------------------------------- deployments
MAX_ONGOING_REQUESTS = 5            # Ray >= 2.32's default
# Per caller, as in Ray: each HTTP proxy and each DeploymentHandle may hold
# this many requests waiting for a replica (not one shared count).
MAX_QUEUED_REQUESTS = -1            # -1: no limit
# Sends of one call (handle) or HTTP request (proxy) refused by replicas that
# were dead unbeknown to the sender, each then dropped from its set.
SEND_ATTEMPTS = 4
HEALTH_CHECK_PERIOD_S = 10.0
HEALTH_CHECK_TIMEOUT_S = 30.0
GRACEFUL_SHUTDOWN_TIMEOUT_S = 20.0
GRACEFUL_SHUTDOWN_WAIT_LOOP_S = 2.0


def env_number(name, default, kind):
    """One of Ray Serve's RAY_SERVE_* settings: ``default`` when unset, not a
    number or not positive (a bad value must not stop Serve from starting)."""
    raw = os.environ.get(name)
    try:
        value = kind(raw) if raw else default
    except ValueError:
        value = default
    return value if value > 0 else default


# The controller warns of a replica whose constructor has not returned after
# this long, and again every period while it has not (Ray Serve's settings and
# defaults; read when used, so that a test or `serve run` may set them).
SLOW_STARTUP_WARNING_S = 30.0
SLOW_STARTUP_WARNING_PERIOD_S = 30.0


def slow_startup_warning_s():
    """``RAY_SERVE_SLOW_STARTUP_WARNING_S``, else ``SLOW_STARTUP_WARNING_S``."""
    return env_number("RAY_SERVE_SLOW_STARTUP_WARNING_S", SLOW_STARTUP_WARNING_S, float)


def slow_startup_warning_period_s():
    """``RAY_SERVE_SLOW_STARTUP_WARNING_PERIOD_S``, else ``SLOW_STARTUP_WARNING_PERIOD_S``."""
    return env_number("RAY_SERVE_SLOW_STARTUP_WARNING_PERIOD_S",
                      SLOW_STARTUP_WARNING_PERIOD_S, float)


def freeze_gc_on_startup():
    """``RAY_SERVE_FREEZE_GC_ON_STARTUP`` (on unless 0, false or no): a
    replica moves what its start-up made into the collector's permanent
    generation once it is ready (read when used)."""
    raw = os.environ.get("RAY_SERVE_FREEZE_GC_ON_STARTUP", "").strip().lower()
    return raw not in ("0", "false", "no")


# A deployment's record_autoscaling_stats() that takes longer gives no sample.
AUTOSCALING_STATS_TIMEOUT_S = env_number("RAY_SERVE_RECORD_AUTOSCALING_STATS_TIMEOUT_S",
                                         10.0, float)

DEPLOYMENT_OPTIONS = {
    "num_replicas": 1,
    "max_ongoing_requests": MAX_ONGOING_REQUESTS,
    "max_queued_requests": MAX_QUEUED_REQUESTS,
    "user_config": None,
    "health_check_period_s": HEALTH_CHECK_PERIOD_S,
    "health_check_timeout_s": HEALTH_CHECK_TIMEOUT_S,
    "graceful_shutdown_timeout_s": GRACEFUL_SHUTDOWN_TIMEOUT_S,
    "graceful_shutdown_wait_loop_s": GRACEFUL_SHUTDOWN_WAIT_LOOP_S,
    "ray_actor_options": None,
    "autoscaling_config": None,
    "backpressure_config": None,    # {"status_code", "retry_after_s"}: see config.BackpressureConfig
    "gang_scheduling_config": None,  # {"gang_size", ...}: see gang.py
    "max_constructor_retry_count": None,    # None: MAX_CONSTRUCTOR_RETRY_COUNT
}
# Ray's default max_constructor_retry_count: a deploy fails once its replicas
# failed to start min(this, 3 x num_replicas) times with none started.
MAX_CONSTRUCTOR_RETRY_COUNT = 20

# -------------------------------------------------------------------- HTTP
HTTP_HOST = "127.0.0.1"
HTTP_PORT = 8000
MAX_BODY_SIZE = 100 * 1024 * 1024   # http_options["max_body_size"]
MAX_HEADER_BYTES = 64 * 1024        # request line or header block beyond: 414 / 431
MAX_PIPELINED = 64                  # requests read ahead on one connection
KEEP_ALIVE_TIMEOUT_S = 90.0         # http_options["keep_alive_timeout_s"], Ray's default
PROXY_DRAIN_TIMEOUT_S = 5.0         # a stopping proxy lets requests in flight end this long
# A streamed answer's chunks a replica may send ahead of what the proxy
# wrote to its client (whose socket the proxy stops writing to while full).
# The window is acknowledged every half (Streams.ack_stream): 32 items cost
# a replica about 6 wake-ups per 100 small events (8 cost 25: B14).
STREAM_ITEMS_AHEAD = 32
# A proxy writes at most this many already-reported items of a streamed
# response in one system call (see ``ProxyActor._stream``).
STREAM_WRITE_BATCH = 16
# A streamed answer no proxy asked for (its client left) is dropped after this.
UNCLAIMED_STREAM_S = 60.0

# -------------------------------------------------------------- controller
LISTEN_TIMEOUT_S = 30.0             # a long poll answers "no change" after this
WAIT_REPLICAS_TIMEOUT_S = 30.0      # the controller's wait for a first replica
HANDLE_REFRESH_TIMEOUT_S = 60.0     # a handle's wait for the controller's answer to it
PROXIES_CAUGHT_UP_TIMEOUT_S = 15.0  # a change is done when every proxy has it, or after this
# serve.shutdown's wait for the controller: the longest graceful shutdown
# timeout of the deployments and this margin; then it kills.
SHUTDOWN_MARGIN_S = 3.0
# How long serve.run, status, delete... call a controller that died again
# while the runtime restarts it (it recovers within about a second).
CONTROLLER_RESTART_WAIT_S = 30.0
SHUTDOWN_ASK_S = 5.0                # its wait for the process ids, before
