"""Ray's small ``ray.util`` modules programs and libraries import:
``annotations`` (PublicAPI, DeveloperAPI, Deprecated), ``debug`` (log_once)
and ``accelerators`` (accelerator type names; asking for one is refused)."""
import warnings

import pytest

import ray_lite as ray
from ray_lite.util import annotations, debug


def test_annotations_return_the_object_with_a_note():
    @annotations.PublicAPI
    def plain():
        """Plain."""
        return 1

    @annotations.PublicAPI(stability="beta")
    class Beta:
        """A beta class."""

    @annotations.DeveloperAPI
    def dev():
        return 2

    assert plain() == 1 and plain._annotated_type is annotations.AnnotationType.PUBLIC_API
    assert plain.__doc__ == "Plain."        # stable: no note
    assert "PublicAPI (beta)" in Beta.__doc__ and Beta()
    assert dev() == 2 and "DeveloperAPI" in dev.__doc__
    with pytest.raises(ValueError, match="stability"):
        annotations.PublicAPI(stability="gamma")
    with pytest.raises(ValueError, match="Unknown kwargs"):
        annotations.Deprecated(when="now")


def test_deprecated_warns_only_when_asked():
    @annotations.Deprecated(message="Use new_thing.", warning=True)
    def old_thing(x):
        return x + 1

    @annotations.Deprecated(warning=True)
    class OldClass:
        def __init__(self, v):
            self.v = v

    @annotations.Deprecated
    def quiet():
        return "q"

    with pytest.warns(annotations.RayDeprecationWarning, match="Use new_thing."):
        assert old_thing(1) == 2
    with pytest.warns(annotations.RayDeprecationWarning):
        assert OldClass(3).v == 3
    assert "Deprecated" in old_thing.__doc__ and old_thing.__name__ == "old_thing"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert quiet() == "q"


def test_log_once():
    debug.reset_log_once()
    assert ray.util.log_once("k") and not ray.util.log_once("k")
    assert ray.util.log_once("other")
    debug.reset_log_once("k")
    assert debug.log_once("k")
    saved = debug._disabled
    try:
        ray.util.disable_log_once_globally()
        assert not debug.log_once("fresh")
    finally:
        debug._disabled = saved
        debug.reset_log_once()


@ray.remote
def work():
    return "ran"


@ray.remote
class Worker:
    def run(self):
        return "ran"


def test_accelerator_names_and_asking_for_one_is_refused():
    from ray_lite.util import accelerators
    assert accelerators.NVIDIA_TESLA_V100 == "V100" and accelerators.NVIDIA_H100 == "H100"
    assert "NVIDIA_A100" in accelerators.__all__
    with pytest.warns(annotations.RayDeprecationWarning, match="NVIDIA_A100"):
        assert accelerators.NVIDIA_TESLA_A100 == accelerators.NVIDIA_A100
    with pytest.raises(ValueError, match="accelerator_type='V100'"):
        work.options(accelerator_type=accelerators.NVIDIA_TESLA_V100)
    with pytest.raises(ValueError, match="accelerator_type='H100'"):
        Worker.options(accelerator_type="H100")
    declared = ray.remote(accelerator_type="T4")(lambda: 1)   # as Ray: declaring is fine
    with pytest.raises(ValueError, match="accelerator_type"):
        declared.remote()
    from ray_lite import serve
    with pytest.raises(ValueError, match="accelerator_type='A10G'"):
        serve.deployment(ray_actor_options={"accelerator_type": "A10G"})(Worker)


def test_accelerator_type_none_runs(rt):
    assert ray.get(work.options(accelerator_type=None).remote(), timeout=30) == "ran"


def test_rays_other_exception_names_with_rays_bases():
    from ray_lite import exceptions as E
    assert issubclass(E.ReferenceCountingAssertionError, E.ObjectLostError)
    assert issubclass(E.ReferenceCountingAssertionError, AssertionError)
    assert issubclass(E.ActorHandleNotFoundError, ValueError)
    assert issubclass(E.RayChannelTimeoutError, E.RayChannelError)
    assert issubclass(E.RayChannelTimeoutError, TimeoutError)
    assert issubclass(E.RayChannelError, E.RaySystemError)
    assert all(issubclass(c, E.RayError) for c in E.RAY_EXCEPTION_TYPES)
    assert len(E.RAY_EXCEPTION_TYPES) == len(set(E.RAY_EXCEPTION_TYPES)) == 30
    assert all(getattr(E, n) is not None for n in E.__all__)


def test_remote_function_class_is_rays_name():
    from ray_lite.remote_function import RemoteFunction
    assert isinstance(work, RemoteFunction) and not isinstance(Worker, RemoteFunction)
    assert ray.remote_function.RemoteFunction is RemoteFunction
