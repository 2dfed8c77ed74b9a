"""``label_selector`` and ``fallback_strategy``: Ray's label scheduling options
for tasks and actors, and a placement group's ``bundle_label_selector``,
checked with Ray's rules and matched against the one node's labels
(``cluster.node_labels``).

A selector maps a label key to an expression on the node's value for it:
``"v"`` (equal), ``"!v"`` (not equal), ``"in(a, b)"``, ``"!in(a, b)"``; a
node without the label matches only the negations.  A task or actor whose
selector the node does not match, and none of whose fallbacks' selectors it
matches, is refused when declared: Ray would leave it pending until a node
that matches joins, which never happens on one machine.
"""
import re

# Kubernetes' label syntax, as Ray checks it: a name (or value) is at most 63
# characters, alphanumeric at both ends, with "-", "_", "." between; a key
# may have a DNS-subdomain prefix and "/".
_NAME = r"[a-zA-Z0-9](?:[a-zA-Z0-9_.-]{0,61}[a-zA-Z0-9])?"
_NAME_RE = re.compile(_NAME)
_PREFIX_RE = re.compile(rf"(?:{_NAME})?(?:\.(?:{_NAME})?)*")
_EXPRESSION_RE = re.compile(rf"!?(?:in)?\({_NAME}(?:, ?{_NAME})*\)|!?{_NAME}")

_NAME_RULE = ("must be 63 chars or less beginning and ending with an alphanumeric character "
              "([a-z0-9A-Z]) with dashes (-), underscores (_), dots (.), and alphanumerics "
              "between.")


def _key_error(key):
    if not isinstance(key, str):
        return f"Invalid label key {key!r}: label keys are strings."
    prefix, slash, name = key.rpartition("/")
    if slash and (len(prefix) > 253 or not _PREFIX_RE.fullmatch(prefix)):
        return (f"Invalid label key prefix `{prefix}`. Prefix must be a series of DNS labels "
                f"separated by dots (.), not longer than 253 characters in total.")
    if len(name) > 63 or not _NAME_RE.fullmatch(name):
        return f"Invalid label key name `{name}`. Name {_NAME_RULE}"
    return None


def _expression_error(expr):
    if not isinstance(expr, str):
        return f"Invalid label selector value {expr!r}: label selector values are strings."
    if expr == "" or _EXPRESSION_RE.fullmatch(expr):
        return None
    return (f"Invalid label selector value `{expr}`. The label selector value should contain "
            f"optional operators and a label value. Supported operators are: ! and {{'in'}}. "
            f"Value {_NAME_RULE}")


def _selector_error(selector):
    for key, expr in selector.items():
        err = _key_error(key)
        if err is None and expr is not None:
            err = _expression_error(expr)
        if err is not None:
            return err
    return None


def check_label_options(opts):
    """Ray's checks of ``label_selector`` and ``fallback_strategy`` (TypeError
    for a value of the wrong type, ValueError for a malformed one)."""
    selector = opts.get("label_selector")
    if selector is not None:
        if not isinstance(selector, dict):
            raise TypeError(f"The type of keyword 'label_selector' must be "
                            f"{(dict, type(None))}, but received type {type(selector)}")
        err = _selector_error(selector)
        if err:
            raise ValueError(err)
    fallbacks = opts.get("fallback_strategy")
    if fallbacks is None:
        return
    if not isinstance(fallbacks, list):
        raise TypeError(f"The type of keyword 'fallback_strategy' must be "
                        f"{(list, type(None))}, but received type {type(fallbacks)}")
    for strategy in fallbacks:
        if not isinstance(strategy, dict):
            raise ValueError("Each element in fallback_strategy must be a dictionary.")
        if not strategy:
            raise ValueError("Empty dictionary found in `fallback_strategy`.")
        for option in strategy:
            if option != "label_selector":
                raise ValueError(f"Unsupported option found: '{option}'. Only "
                                 f"['label_selector'] is currently supported.")
        selector = strategy.get("label_selector")
        if selector:
            if not isinstance(selector, dict):
                raise ValueError('The value of "label_selector" must be a dictionary.')
            err = _selector_error(selector)
            if err:
                raise ValueError(err)


def _values(expr, start):
    return [v.strip() for v in expr[start:-1].split(",")]


def expression_matches(node_value, expr):
    """Whether a node whose label is ``node_value`` (None: it has none)
    satisfies the selector expression ``expr``."""
    if not isinstance(expr, str):
        return False    # (None passes Ray's check, and matches no node there either)
    if expr.startswith("!in(") and expr.endswith(")"):
        return node_value is None or node_value not in _values(expr, 4)
    if expr.startswith("in(") and expr.endswith(")"):
        return node_value in _values(expr, 3)
    if expr.startswith("!"):
        return node_value != expr[1:]
    return node_value == expr


def selector_matches(labels, selector):
    return all(expression_matches(labels.get(k), expr) for k, expr in selector.items())


def check_labels_match(opts, labels, kind):
    """Refuse a task or actor that no node with ``labels`` could run: neither its
    ``label_selector`` nor any of its fallbacks' selectors match them."""
    selector = opts.get("label_selector")
    if not selector or selector_matches(labels, selector):
        return
    fallbacks = opts.get("fallback_strategy") or ()
    if any(selector_matches(labels, f.get("label_selector") or {}) for f in fallbacks):
        return
    raise ValueError(
        f"label_selector={selector!r}"
        f"{' and its fallback_strategy match' if fallbacks else ' matches'} "
        f"no node: this {kind} could never run (ray_lite runs on one node, whose "
        f"labels are {labels}; Ray would leave it pending until a node that matches joins)")


def check_bundle_label_selector(bundles, selectors):
    """Ray's checks of a placement group's ``bundle_label_selector`` (one
    selector per bundle), with its error words; ValueError."""
    if len(bundles) != len(selectors):
        raise ValueError(f"Invalid bundle label selector {selectors}. The length of "
                         f"`bundle_label_selector` should equal the length of `bundles`.")
    if not isinstance(selectors, list):
        raise ValueError(f"Placement group bundle_label_selector must be a list, "
                         f"got {type(selectors)}.")
    for selector in selectors:
        if (not isinstance(selector, dict) or not all(isinstance(k, str) for k in selector)
                or not all(isinstance(v, str) for v in selector.values())):
            raise ValueError('Bundle label selector must be a list of string dictionary label '
                             'selectors. For example: `[{ray.io/market_type": "spot"}, '
                             '{"ray.io/accelerator-type": "A100"}]`.')
        err = _selector_error(selector)
        if err:
            raise ValueError(f"Invalid label selector provided in bundle_label_selector list. "
                             f"Detailed error: '{err}'")
    # GB200 / GB300 bundles are scheduled on one GPU domain: all or none.
    domain = next((s.get("ray.io/accelerator-type") for s in selectors
                   if s.get("ray.io/accelerator-type") in ("GB200", "GB300")), None)
    if domain is not None:
        for selector in selectors:
            if selector.get("ray.io/accelerator-type") != domain:
                raise ValueError(f"Invalid bundle label selector {selector}. GPU-domain "
                                 f"scheduling requires all bundles to have "
                                 f"'ray.io/accelerator-type: {domain}' in their label selector.")


def check_bundles_match(selectors, labels):
    """Refuse a placement group one of whose bundles no node with ``labels`` could hold."""
    for index, selector in enumerate(selectors):
        if not selector_matches(labels, selector):
            raise ValueError(
                f"bundle_label_selector[{index}]={selector!r} matches no node: this placement "
                f"group could never be created (ray_lite runs on one node, whose labels are "
                f"{labels}; Ray would leave it pending until a node that matches joins)")
