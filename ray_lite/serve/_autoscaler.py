"""Ray Serve's default autoscaling policy, as a pure function of samples.

The controller samples, every ``metrics_interval_s``, the requests running
at each replica (a counter the replica keeps anyway) and adds those its
callers (proxies, handles) hold waiting for a replica (each tells the
controller as its count changes: ``_demand``), records the deployment's
total here, and asks ``decide`` for the number of replicas it should run.
The rule is Ray's ``replica_queue_length_autoscaling_policy``:

- the load is the total over the last ``look_back_period_s`` (their mean, or
  ``aggregation_function``);
- the wanted count is ``running * load / (running * target_ongoing_requests)``,
  moved from the running count by ``upscaling_factor`` / ``downscaling_factor``
  (else the smoothing factors), rounded up, and at least one lower whenever
  the load asks for fewer;
- it is bounded by ``min_replicas`` / ``max_replicas``;
- it is applied only after the decision has pointed the same way for
  ``upscale_delay_s`` / ``downscale_delay_s`` (Ray counts control-loop
  periods of 0.1 s; the same span of time here);
- scale to zero (``min_replicas: 0``): only the last replica may go, after
  ``downscale_to_zero_delay_s`` (else ``downscale_delay_s``); from zero, a
  request waiting anywhere starts ``ceil(upscaling_factor)`` replicas at
  once, without the upscale delay (Ray's cold start).
"""
import collections
import math


class ScalingState:
    """What ``decide`` remembers of one deployment between calls."""

    def __init__(self):
        self.samples = collections.deque()      # (time, total requests in flight)
        self.direction = 0                      # +1 / -1: the pending decision's way
        self.since = None                       # when it started pointing that way


def upscaling_factor(cfg):
    return cfg.get("upscaling_factor") or cfg.get("upscale_smoothing_factor") or \
        cfg.get("smoothing_factor") or 1.0


def downscaling_factor(cfg):
    return cfg.get("downscaling_factor") or cfg.get("downscale_smoothing_factor") or \
        cfg.get("smoothing_factor") or 1.0


def bounds(cfg):
    """(lowest, highest) replica count the policy may choose."""
    return cfg["min_replicas"], max(1, cfg["max_replicas"])


def cold_start_replicas(cfg, target):
    """The replicas to start at once for requests waiting while none runs."""
    return max(min(bounds(cfg)[1], math.ceil(upscaling_factor(cfg))), target, 1)


def record(state, cfg, now, total):
    """Add a sample and forget those older than ``look_back_period_s``."""
    state.samples.append((now, total))
    horizon = now - cfg["look_back_period_s"]
    while state.samples and state.samples[0][0] < horizon:
        state.samples.popleft()


def load(state, cfg):
    """The deployment's requests in flight over the look-back window."""
    values = [v for _, v in state.samples]
    if not values:
        return 0.0
    how = cfg.get("aggregation_function", "mean")
    if how == "max":
        return float(max(values))
    if how == "min":
        return float(min(values))
    return sum(values) / len(values)


def desired_replicas(cfg, total_requests, running):
    """The count the load asks for, scaled and bounded (no delays)."""
    low, high = bounds(cfg)
    if running <= 0:
        return low
    wanted = total_requests / cfg["target_ongoing_requests"]
    delta = wanted - running
    factor = upscaling_factor(cfg) if delta > 0 else downscaling_factor(cfg)
    scaled = math.ceil(running + factor * delta)
    if math.ceil(wanted) < running and scaled == running:
        scaled -= 1     # a small downscaling factor must not stall the way down
    return max(low, min(high, scaled))


def decide(cfg, state, now, running, target):
    """The replica count to run from now on (``target`` when unchanged)."""
    if running <= 0:
        state.direction, state.since = 0, None
        if load(state, cfg) > 0:
            return cold_start_replicas(cfg, target)
        return target
    desired = desired_replicas(cfg, load(state, cfg), running)
    direction = (desired > target) - (desired < target)
    if direction == 0:
        state.direction, state.since = 0, None
        return target
    if direction != state.direction:
        state.direction, state.since = direction, now
    if direction > 0:
        delay = cfg["upscale_delay_s"]
    elif target == 1:       # the last replica: to zero
        delay = cfg.get("downscale_to_zero_delay_s")
        if delay is None:
            delay = cfg["downscale_delay_s"]
    else:
        delay = cfg["downscale_delay_s"]
        desired = max(1, desired)       # zero only from one
    if now - state.since >= delay:
        state.direction, state.since = 0, None
        return desired
    return target
